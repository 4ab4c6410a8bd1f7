"""The scale-quantize-pack skeleton shared by every fixed-width compression.

A token payload is `version u8 | scales | elements`: the scales (fp16, one per layer and
K|V, or per layer, K|V and head; absent for exact casts) followed by the token's
`L * 2 * H * D` elements in `[L, 2, H, D]` order, each `bits` wide. Scaled formats quantize
each head's values after an orthonormal Hadamard rotation (`rotation.py`) and the decoder
rotates back. The compressions differ only in how one scaled element becomes bits and back
(`ElementFormat`) and in how many values share a scale, so that is all their modules define.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import PayloadError, TensorError
from ..layout import KVLayout
from .base import (
    PAYLOAD_VERSION,
    Codec,
    all_finite,
    check_tables_absent,
    destination,
    split_fixed,
    split_rows,
    token_major,
    write_layer_major,
)
from .rotation import rotate, rotate_scaled

SCALE_DTYPE = torch.float16
SMALLEST_SCALE = 2.0**-14
"""The smallest normal fp16. A scale never goes below it, so rounding the scale to fp16 costs
at most 2^-11 of it and `y / scale` exceeds QMAX by at most that much: the quantizers may
clamp after casting to integers. (A subnormal scale could round down by a third and push
int8 codes past 127, where the cast wraps them to negative values.) Groups whose largest
value is below `QMAX * 2^-14` get a coarser step: their values' error stays below 2^-14. A
decoder refuses any scale below it (zero, negative, subnormal): no encoder emits one."""


@dataclass(frozen=True)
class ElementFormat:
    """How scaled values become packed bytes and back, for one compression.

    `quantize` maps float32 `[T, N]` (already divided by its group's scale, so within
    `qmax * (1 + 2^-11)`: the scale is rounded to fp16) to uint8 `[T, N * bits / 8]`;
    `dequantize` is its inverse: the levels as float32, NaN for codes the encoder never emits
    (the casts' NaN and Inf), which the decoder then rejects with one finiteness check; or,
    for integer formats, the int8 codes themselves, checked by `integer_codes`.
    `qmax` is None for exact casts, which carry no scales.
    """

    bits: int
    qmax: float | None
    quantize: Callable[[torch.Tensor], torch.Tensor]
    dequantize: Callable[[torch.Tensor], torch.Tensor]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes `[T, N]` (N even) -> bytes `[T, N/2]`, element 2i in the low nibble."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def integer_codes(codes: torch.Tensor, never: int) -> torch.Tensor:
    """int8 `codes`, checked for `never`: a code the encoder never emits and the smallest the
    codes can hold (int8's -128), so one min-reduction finds it."""
    if int(codes.min()) == never:
        raise PayloadError(f"payload holds the code {never}, which no encoder emits")
    return codes


def finite_cast(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast for the exact-cast formats; NaN, Inf and overflow all show up as non-finite."""
    cast = values.to(dtype)
    if not all_finite(cast):
        raise TensorError(f"KV holds NaN/Inf or values beyond the range of {dtype}")
    return cast.view(torch.uint8)


def table_lookup(table: tuple[float, ...], codes: torch.Tensor) -> torch.Tensor:
    """`table[codes]` as float32; entries the encoder never emits are NaN in `table`.

    `index_select` with int32 indices: 4x faster on CPU than `take` with int64 ones.
    """
    values = torch.tensor(table, dtype=torch.float32, device=codes.device)
    return torch.index_select(values, 0, codes.flatten().int()).view(codes.shape)


@functools.cache
def nearest_codes_by_top_bits(
    magnitudes: tuple[float, ...], sign_bit: int, device: torch.device
) -> torch.Tensor:
    """For a float format whose code `i` (sign bit clear) is `magnitudes[i]` (ascending, from
    0): the code of the nearest value of every float32, indexed by its top 16 bits plus
    2^15 (`top_bits_index`), ties away from zero: encoders quantize with one lookup instead
    of arithmetic.

    The top 16 bits truncate a value `x` to `t` (bfloat16's sign, exponent and 7 mantissa
    bits), and `|x|` lies in `[|t|, |t| + ulp)`. When every midpoint between neighbouring
    magnitudes is itself a bfloat16, `|x|` is past a midpoint exactly when `|t|` has reached
    it, so `t` alone decides the rounding. Magnitudes past the largest (scaled values exceed
    it by at most the fp16 rounding of the scale) give the largest code; the sign bit is the
    value's own, so -0.0 and negative values that round to zero keep it.
    """
    grid = torch.tensor(magnitudes, dtype=torch.float64)
    midpoints = ((grid[1:] + grid[:-1]) / 2).float()
    if not torch.equal(midpoints, midpoints.bfloat16().float()):
        raise ValueError("a midpoint between these magnitudes needs more than bfloat16's bits")
    top = torch.arange(1 << 16, dtype=torch.int32) - (1 << 15)
    magnitude = (top << 16).view(torch.float32).abs().nan_to_num(nan=float("inf"))
    codes = torch.searchsorted(midpoints, magnitude, right=True).to(torch.uint8)
    codes |= (top < 0).to(torch.uint8) << sign_bit
    return codes.to(device)


def top_bits_index(values: torch.Tensor) -> torch.Tensor:
    """Each float32's top 16 bits plus 2^15 (0..65535): its row in `nearest_codes_by_top_bits`."""
    index = values.view(torch.int32) >> 16
    index += 1 << 15
    return index


def nibble_pair_lookup(table: tuple[float, ...], packed: torch.Tensor) -> torch.Tensor:
    """`table[nibble]` for both nibbles of every byte, low nibble first: `[T, 2 * n]` float32.

    One lookup per byte in a 256-pair table instead of unpacking, then one per nibble. Each
    pair is one int64 word: gathering words is 3x faster on CPU than rows of two floats, and
    copies bits exactly (NaN entries included).
    """
    words = _pair_table(table).to(packed.device)
    pairs = torch.index_select(words, 0, packed.flatten().int())
    return pairs.view(torch.float32).view(packed.shape[0], -1)


@functools.cache
def _pair_table(table: tuple[float, ...]) -> torch.Tensor:
    pairs = tuple(value for byte in range(256) for value in (table[byte & 15], table[byte >> 4]))
    return torch.tensor(pairs, dtype=torch.float32).view(torch.int64)


class FixedWidthCodec(Codec):
    """A compression with a fixed payload size per token: casts and scaled quantizers.

    `per_head_scales`: one scale per head instead of one per row (layer, K|V). int4 needs it:
    a row's 15 uniform levels spread over three or more heads leave a quiet head too few of
    them (worst KL 0.028 -> 0.015). At 8 bits, and for fp4 whose levels crowd near zero, the
    row's scale measured as good at a quarter of the size.
    """

    def __init__(self, name: str, element: ElementFormat, *, per_head_scales: bool = False) -> None:
        self.name = name
        self.element = element
        self.per_head_scales = per_head_scales

    def scale_groups(self, layout: KVLayout) -> int:
        """Scales per row: values of a row that share one scale are `channels / groups`."""
        return layout.num_kv_heads if self.per_head_scales else 1

    def scale_bytes(self, layout: KVLayout) -> int:
        if self.element.qmax is None:
            return 0
        return 2 * layout.num_layers * 2 * self.scale_groups(layout)

    def payload_size(self, layout: KVLayout) -> int:
        return 1 + self.scale_bytes(layout) + layout.elements_per_token * self.element.bits // 8

    def _encode_batch(
        self, kv: torch.Tensor, layout: KVLayout, tables: bytes | None
    ) -> list[bytes]:
        check_tables_absent(self.name, tables)
        num_tokens = kv.shape[2]
        values = token_major(kv, layout).float()
        parts = [torch.full((num_tokens, 1), PAYLOAD_VERSION, dtype=torch.uint8, device=kv.device)]
        if self.element.qmax is not None:
            groups = rotate(values, layout.head_dim, exact=True).view(
                num_tokens, layout.num_layers, 2, self.scale_groups(layout), -1
            )
            # amax and amin apart: 4x faster than aminmax or abs().amax() over 64-value groups.
            largest = torch.maximum(groups.amax(dim=-1), groups.amin(dim=-1).neg_())
            # Divided by a tensor: CUDA divides by a Python number through its reciprocal,
            # which can round a scale apart from the CPU's (payloads are the same bytes on
            # every device).
            qmax = largest.new_tensor(self.element.qmax)
            scales = (largest / qmax).clamp_min_(SMALLEST_SCALE).to(SCALE_DTYPE)
            if not bool(torch.isfinite(scales).all()):
                raise TensorError("KV contains NaN/Inf or magnitudes beyond the fp16 scale range")
            # In place: `groups` is the rotation's own output, a fresh tensor.
            values = groups.div_(scales.float().unsqueeze(-1))
            parts.append(scales.view(torch.uint8).reshape(num_tokens, -1))
        parts.append(self.element.quantize(values.reshape(num_tokens, -1)))
        return split_rows(torch.cat(parts, dim=1))

    def decode(
        self,
        payloads: Sequence[bytes],
        layout: KVLayout,
        tables: bytes | None = None,
        *,
        device: torch.device | str | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check_tables_absent(self.name, tables)
        heads, bodies = split_fixed(
            payloads, self.payload_size(layout), 1 + self.scale_bytes(layout)
        )
        num_tokens = bodies.shape[0]
        dst = destination(layout, num_tokens, device, out)
        values = self.element.dequantize(bodies.to(dst.device))
        if self.element.qmax is not None:
            scales = heads.to(dst.device).view(SCALE_DTYPE)
            if bool((scales < SMALLEST_SCALE).any()):
                raise PayloadError(
                    f"{self.name} payload carries a scale below 2^-14 (zero, negative or "
                    "subnormal), which no encoder emits"
                )
            values = rotate_scaled(values, scales.view(num_tokens, -1), layout.head_dim)
        values = values.view(num_tokens, layout.num_layers, 2, layout.channels)
        if not all_finite(values, dst.dtype):
            raise PayloadError(
                f"{self.name} payload holds NaN/Inf, codes never emitted or values beyond "
                f"{dst.dtype}"
            )
        return write_layer_major(values, layout, dst)
