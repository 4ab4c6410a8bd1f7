"""Where vLLM's CPU attention backend keeps each token's K and V inside a cache block.

vLLM's CPU KV cache is one tensor per layer, `[num_blocks, num_kv_heads, block_size,
2 * head_size]`, but that shape does not say where a value sits: the backend's kernels pick
an arrangement per instruction set (on AVX-512, keys are stored transposed, `[head_size,
block_size]` per head, values as `[block_size, head_size]`). Rather than copy those rules
from vLLM's C++ (and break when they change), `BlockLayout.probe` asks vLLM's own
`cpu_attn_reshape_and_cache` to write a block whose values are their token, head and channel
numbers, and reads the positions back: an index that holds for whatever ISA the engine runs
on. With it, the connector copies whole blocks between vLLM's cache and the sidecar's
staging buffer (`[2, tokens, kv_heads, head_size]`), through strided views where the
positions are affine (they are on every ISA seen), else one index operation each way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DIGIT = 16
"""Probe values are coordinates written in base 16, one digit per pass: small integers are
exact in every cache dtype (bf16 holds integers exactly only up to 256)."""


@dataclass(frozen=True)
class BlockLayout:
    """`index[part, token, head, channel]`: the element of a block (flattened) holding that
    value, part 0 = K, 1 = V."""

    index: torch.Tensor
    block_elements: int
    strides: tuple[tuple[int, int, int, int], ...] | None = None
    """Per part, (offset, token, head, channel strides) within a block when the positions
    are an affine map of the coordinates, as on every ISA seen (K transposed is one): then
    the copies are strided views, 5x faster than gathering through `index`."""

    @classmethod
    def probe(cls, cache: torch.Tensor, isa: str, kv_cache_dtype: str = "auto") -> BlockLayout:
        """The layout of `cache` (one layer's, `[num_blocks, H, block_size, 2 * D]`)."""
        from vllm import _custom_ops as ops

        _, heads, block_size, double_head = cache.shape
        shape = (block_size, heads, double_head // 2)
        scratch = torch.empty((1, *cache.shape[1:]), dtype=cache.dtype)

        def written(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            """Every element of one block after writing `key` and `value` there (-1: not
            written), as integers."""
            scratch.fill_(-1)
            view = scratch.view(1, heads, block_size * 2, -1)
            key_cache, value_cache = view.chunk(2, dim=2)
            ops.cpu_attn_reshape_and_cache(
                key.to(cache.dtype).contiguous(), value.to(cache.dtype).contiguous(),
                key_cache, value_cache, torch.arange(block_size), isa,
                kv_cache_dtype=kv_cache_dtype,
            )  # fmt: skip
            return scratch.reshape(-1).round().to(torch.int64)

        zeros = torch.zeros(shape)
        part = written(zeros, zeros + 1)
        coordinates = []
        for dim, size in enumerate(shape):
            numbers = torch.arange(size).view([-1 if d == dim else 1 for d in range(3)])
            numbers = numbers.expand(shape)
            value, scale = torch.zeros(part.shape, dtype=torch.int64), 1
            while scale < size:
                digits = (numbers // scale) % DIGIT
                value += written(digits, digits) * scale
                scale *= DIGIT
            coordinates.append(value)
        return cls._indexed(part, *coordinates, shape=shape)

    @classmethod
    def _indexed(
        cls, part: torch.Tensor, *coordinates: torch.Tensor, shape: tuple[int, int, int]
    ) -> BlockLayout:
        index = torch.full((2, *shape), -1, dtype=torch.int64)
        held = part >= 0
        token, head, channel = (c[held] for c in coordinates)
        index[part[held], token, head, channel] = torch.arange(part.numel())[held]
        if bool((index < 0).any()) or index.unique().numel() != index.numel():
            raise RuntimeError("vLLM's cache block layout is not a permutation of its values")
        affine = [_affine(index[kv]) for kv in range(2)]
        strides = None if None in affine else tuple(a for a in affine if a is not None)
        return cls(index, part.numel(), strides)

    def read(self, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """The KV of `blocks` as `[2, len(blocks) * block_size, H, D]`, in block order."""
        _, _, heads, head_size = self.index.shape
        if self.strides is not None:
            parts = [self._part(cache, kv)[blocks] for kv in range(2)]
            return torch.stack(parts).reshape(2, -1, heads, head_size)
        flat = cache.view(cache.shape[0], self.block_elements)[blocks]
        values = flat[:, self.index]  # [blocks, 2, N, H, D]
        return values.transpose(0, 1).reshape(2, -1, heads, head_size)

    def write(self, cache: torch.Tensor, blocks: torch.Tensor, kv: torch.Tensor) -> None:
        """Inverse of `read`: `kv` `[2, len(blocks) * block_size, H, D]` into `blocks`."""
        _, block_size, heads, head_size = self.index.shape
        values = kv.reshape(2, len(blocks), block_size, heads, head_size)
        if self.strides is not None:
            for part in range(2):
                self._part(cache, part)[blocks] = values[part]
            return
        flat = cache.view(cache.shape[0], self.block_elements)
        rows = flat[blocks]
        rows[:, self.index] = values.transpose(0, 1)
        flat[blocks] = rows

    def _part(self, cache: torch.Tensor, part: int) -> torch.Tensor:
        """K (0) or V (1) of every block of `cache` as a `[blocks, N, H, D]` strided view."""
        assert self.strides is not None
        offset, *strides = self.strides[part]
        if cache.stride(0) != self.block_elements:
            raise ValueError("vLLM's cache blocks are not contiguous")
        shape = (cache.shape[0], *self.index.shape[1:])
        return cache.as_strided(
            shape, (self.block_elements, *strides), cache.storage_offset() + offset
        )


def _affine(index: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(offset, strides) if `index[token, head, channel]` is offset + a . strides."""
    offset = int(index[0, 0, 0])
    strides = []
    for dim, size in enumerate(index.shape):
        step = [0, 0, 0]
        step[dim] = 1
        strides.append(int(index[tuple(step)]) - offset if size > 1 else 0)
    grid = torch.meshgrid(*(torch.arange(size) for size in index.shape), indexing="ij")
    affine = offset + sum(g * s for g, s in zip(grid, strides, strict=True))
    if not torch.equal(affine, index):
        return None
    return offset, strides[0], strides[1], strides[2]
