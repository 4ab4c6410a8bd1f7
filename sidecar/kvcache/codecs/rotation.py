"""An orthonormal Walsh-Hadamard rotation of each head's values, applied before quantizing.

Why: a few channels of K carry most of its magnitude (RoPE pairs with low frequencies), and a
scaled quantizer sets its step from the largest magnitude in its group, so the other channels
of the group are left with two or three levels. Rotating a head's vector by a Hadamard matrix
(as QuaRot and SpinQuant do for weights and activations) spreads every outlier evenly over
the head's channels: the values become close to Gaussian and the largest one sits near
2.5 standard deviations, so every channel gets the whole grid. The rotation is orthonormal,
so quantization error keeps its size (`|x - x'| = |y - y'|`), and it is its own inverse:
the decoder applies the same matrix and the model sees ordinary KV.

On real KV the rotation cuts every scaled codec's KL several times over at the same payload
size (docs/benchmarks.md, "Codecs"; tests/kvcache/test_codec_quality.py holds int4 to at
least half).

The block is the largest power of two that divides `head_dim` (the whole head for every
common model: 64, 128), so blocks never straddle heads.

The encoder's rotation is exact, so a chunk codes to the same bytes on every device, thread
count and library: a publisher re-encodes a lazily offered track when it is first asked for,
and a GPU sidecar encodes what a CPU one would, and the bytes must match the digests its
catalog already published. The product sums in float64 with the matrix's signs and scales
afterwards: an fp16 value is a multiple of 2^-24 below 2^16, so every partial sum of a block
(at most `MAX_HEAD_DIM` values) is a float64 value and the order of the additions, which BLAS
libraries and GPUs choose freely, cannot change it. bf16 and float32 KV sum exactly while a
block's magnitudes span less than 2^38 and 2^22, which real KV does. The decoder's rotation
needs no such care (its output is rounded to the cache's dtype), yet it is exact until its
last step: every scaled format's levels are small multiples of a power of two (integers for
int8 and int4, multiples of 1/64 for fp8 and 1/2 for fp4), so it rotates the levels first,
whose block sums float32 holds exactly, and multiplies by each group's scale once after.
Integer codes go through an int8 matrix product (`torch._int_mm`, 2.5x the float32 product
on one CPU thread), whose int32 sums are the same numbers.
"""

from __future__ import annotations

import functools
import math

import torch


def block_size(head_dim: int) -> int:
    """The rotation's block: the largest power of two that divides `head_dim` (bounded by
    `layout.MAX_HEAD_DIM`, as head_dim is)."""
    return head_dim & -head_dim


@functools.cache
def _signs(size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The Sylvester Hadamard matrix of order `size`: entries +1 and -1."""
    matrix = torch.ones(1, 1, dtype=dtype)
    while matrix.shape[0] < size:
        matrix = torch.cat((torch.cat((matrix, matrix), 1), torch.cat((matrix, -matrix), 1)), 0)
    return matrix.to(device)


def rotate(values: torch.Tensor, head_dim: int, *, exact: bool = False) -> torch.Tensor:
    """float32 `values` (last dim a multiple of `head_dim`'s block) times the block Hadamard.

    The normalised Sylvester matrix is symmetric and orthogonal, so `rotate(rotate(x)) == x`
    up to float32 rounding: the encoder and the decoder call this same function, the encoder
    with `exact` (see above). The result, float32, is always a new tensor (a copy where the
    block is 1), so callers may work on it in place.
    """
    size = block_size(head_dim)
    if size == 1:
        return values.clone()
    shape = values.shape
    dtype = torch.float64 if exact else torch.float32
    sums = values.to(dtype).reshape(-1, size) @ _signs(size, dtype, values.device)
    return sums.mul_(1 / math.sqrt(size)).to(torch.float32).view(shape)


def rotate_scaled(levels: torch.Tensor, scales: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The decoder's rotation: `levels` `[T, N]` (int8 codes, or float32 levels that are
    small multiples of a power of two) times the block Hadamard, each of the `G` groups of
    `N / G` values (whole blocks) times its scale from `scales` `[T, G]`; float32 `[T, N]`.

    The inverse of the encoder's `rotate` then divide: a group's values share its scale, so
    it may scale after the rotation, whose sums of levels are exact.
    """
    size = block_size(head_dim)
    tokens, groups = scales.shape
    blocks = levels.reshape(-1, size)
    if levels.dtype == torch.int8 and levels.device.type == "cpu" and size % 8 == 0:
        sums = torch._int_mm(blocks, _signs(size, torch.int8, levels.device)).float()
    else:
        sums = blocks.float() @ _signs(size, torch.float32, levels.device)
    factors = scales.float().mul_(1 / math.sqrt(size)).view(tokens, groups, 1)
    # In place: int32 times float32 would convert the sums inside the product, 2x slower.
    return sums.view(tokens, groups, -1).mul_(factors).view(tokens, -1)
