"""Where vLLM's CPU attention backend keeps each token's K and V inside a cache block.

vLLM's CPU KV cache is one tensor per layer, `[num_blocks, num_kv_heads, block_size,
2 * head_size]`, but that shape does not say where a value sits: the backend's kernels pick
an arrangement per instruction set (on AVX-512, keys are stored transposed, `[head_size,
block_size]` per head, values as `[block_size, head_size]`; with AMX, bf16 blocks are tiles
of 16 tokens whose keys interleave channel pairs and whose values interleave token pairs).
Rather than copy those rules from vLLM's C++ (and break when they change),
`BlockLayout.probe` asks vLLM's own `cpu_attn_reshape_and_cache` to write a block whose
values are their token, head and channel numbers, and reads the positions back: an index
that holds for whatever ISA the engine runs on. With it, the connector copies whole blocks
between vLLM's cache and the sidecar's staging buffer (`[2, tokens, kv_heads, head_size]`)
through strided views where the positions are an affine map of the coordinates split into
tiles (every ISA seen: a transposed key is one factor per coordinate, an AMX tile two), else
through one index operation each way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

DIGIT = 16
"""Probe values are coordinates written in base 16, one digit per pass: small integers are
exact in every cache dtype (bf16 holds integers exactly only up to 256)."""

Factor = tuple[int, int]
"""(size, stride) of one digit of a coordinate, in elements."""


@dataclass(frozen=True)
class TiledPart:
    """K or V of a block as a strided view: each coordinate (token, head, channel) is split
    into digits, outermost first, each with a stride of its own, and the element sits at
    `offset` plus the sum of digit times stride. One digit per coordinate is a plain strided
    tensor (a transposed key); a tile adds a digit (16-token AMX tiles: token = 16 t1 + t0)."""

    offset: int
    digits: tuple[tuple[Factor, ...], tuple[Factor, ...], tuple[Factor, ...]]

    @classmethod
    def fit(cls, index: torch.Tensor) -> TiledPart | None:
        """The tiling of `index[token, head, channel]` (element positions), or None when the
        positions are no such map."""
        offset = int(index[0, 0, 0])
        digits = []
        for dim in range(3):
            line = index.movedim(dim, 0)[:, 0, 0] - offset
            found = _digits([int(p) for p in line])
            if found is None:
                return None
            digits.append(found)
        part = cls(offset, (digits[0], digits[1], digits[2]))
        return part if torch.equal(part.positions(), index) else None

    def positions(self) -> torch.Tensor:
        """The element position of every `[token, head, channel]` under this tiling."""
        shape = [size for coordinate in self.digits for size, _ in coordinate]
        grid = torch.full(shape, self.offset, dtype=torch.int64)
        for axis, (size, stride) in enumerate(f for c in self.digits for f in c):
            steps = [-1 if a == axis else 1 for a in range(len(shape))]
            grid += (torch.arange(size) * stride).view(steps)
        return grid.reshape([math.prod(s for s, _ in c) for c in self.digits])

    def view(self, cache: torch.Tensor, block_elements: int) -> torch.Tensor:
        """This part of every block of `cache` as `[blocks, digits...]`, a strided view."""
        if cache.stride(0) != block_elements:
            raise ValueError("vLLM's cache blocks are not contiguous")
        factors = [f for coordinate in self.digits for f in coordinate]
        return cache.as_strided(
            (cache.shape[0], *(size for size, _ in factors)),
            (block_elements, *(stride for _, stride in factors)),
            cache.storage_offset() + self.offset,
        )


def _digits(line: list[int]) -> tuple[Factor, ...] | None:
    """Split one coordinate's positions (`line[k]`, `line[0] == 0`) into digits, outermost
    first: the innermost digit runs as far as the positions step evenly, and the rest repeats
    on every run's first position. None if a run does not divide the range evenly."""
    inner_first: list[Factor] = []
    while len(line) > 1:
        stride = line[1]
        run = 1
        while run < len(line) and line[run] == run * stride:
            run += 1
        if len(line) % run:
            return None
        inner_first.append((run, stride))
        line = line[::run]
    return tuple(reversed(inner_first)) if inner_first else ((1, 0),)


@dataclass(frozen=True)
class BlockLayout:
    """`index[part, token, head, channel]`: the element of a block (flattened) holding that
    value, part 0 = K, 1 = V."""

    index: torch.Tensor
    block_elements: int
    tiles: tuple[TiledPart, TiledPart] | None = None
    """K's and V's strided views when both fit one (every ISA seen): then the copies are
    strided, several times faster than gathering through `index` (`kvmoq bench layout`)."""

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
        """The layout from what each element of a block holds: its part (-1: unused) and its
        token, head and channel."""
        index = torch.full((2, *shape), -1, dtype=torch.int64)
        held = part >= 0
        token, head, channel = (c[held] for c in coordinates)
        index[part[held], token, head, channel] = torch.arange(part.numel())[held]
        if bool((index < 0).any()) or index.unique().numel() != index.numel():
            raise RuntimeError("vLLM's cache block layout is not a permutation of its values")
        key, value = TiledPart.fit(index[0]), TiledPart.fit(index[1])
        tiles = None if key is None or value is None else (key, value)
        return cls(index, part.numel(), tiles)

    @property
    def path(self) -> str:
        """How blocks are copied: `strided`, `tiled` (a coordinate split in digits) or
        `gather` (through `index`); said in the connector's log and the layout bench."""
        if self.tiles is None:
            return "gather"
        digits = (len(c) for part in self.tiles for c in part.digits)
        return "strided" if max(digits) == 1 else "tiled"

    def read(self, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """The KV of `blocks` as `[2, len(blocks) * block_size, H, D]`, in block order."""
        _, _, heads, head_size = self.index.shape
        if self.tiles is not None:
            kv = torch.empty((2, len(blocks), *self.index.shape[1:]), dtype=cache.dtype)
            runs = _runs(blocks)
            for part, tiled in enumerate(self.tiles):
                view = tiled.view(cache, self.block_elements)
                staged = kv[part].view(len(blocks), *view.shape[1:])
                for start, stop, at in runs:
                    staged[at : at + stop - start].copy_(view[start:stop])
            return kv.view(2, -1, heads, head_size)
        flat = cache.view(cache.shape[0], self.block_elements)[blocks]
        values = flat[:, self.index]  # [blocks, 2, N, H, D]
        return values.transpose(0, 1).reshape(2, -1, heads, head_size)

    def write(self, cache: torch.Tensor, blocks: torch.Tensor, kv: torch.Tensor) -> None:
        """Inverse of `read`: `kv` `[2, len(blocks) * block_size, H, D]` into `blocks`."""
        _, block_size, heads, head_size = self.index.shape
        values = kv.reshape(2, len(blocks), block_size, heads, head_size)
        if self.tiles is not None:
            runs = _runs(blocks)
            for part, tiled in enumerate(self.tiles):
                view = tiled.view(cache, self.block_elements)
                staged = values[part].reshape(len(blocks), *view.shape[1:])
                for start, stop, at in runs:
                    view[start:stop].copy_(staged[at : at + stop - start])
            return
        flat = cache.view(cache.shape[0], self.block_elements)
        rows = flat[blocks]
        rows[:, self.index] = values.transpose(0, 1)
        flat[blocks] = rows


def _runs(blocks: torch.Tensor) -> list[tuple[int, int, int]]:
    """`blocks` as runs of consecutive block ids: (first, end, position in `blocks`). A copy
    per run rather than one indexed copy: strided copies of slices keep torch's fast loops,
    where indexing a tiled view goes element by element (`kvmoq bench layout`)."""
    ids = blocks.tolist()
    runs: list[tuple[int, int, int]] = []
    for at, block in enumerate(ids):
        if runs and runs[-1][1] == block:
            first, _, began = runs[-1]
            runs[-1] = (first, block + 1, began)
        else:
            runs.append((block, block + 1, at))
    return runs


def paged_kv_view(cache: torch.Tensor, block_size: int, heads: int, head_dim: int) -> torch.Tensor:
    """One layer of a CUDA attention backend's cache as `[2, blocks, block_size, heads,
    head_dim]`, a view of it.

    FlashAttention's cache is `[2, blocks, block_size, heads, head_dim]`, FlashInfer's
    `[blocks, 2, block_size, heads, head_dim]`; either may be laid out in another stride order
    (vLLM's HND layouts), which the view keeps: the sidecar maps it with its strides.
    """
    shape = tuple(cache.shape)
    if len(shape) == 5 and shape[2:] == (block_size, heads, head_dim):
        if shape[0] == 2 and shape[1] != 2:
            return cache
        if shape[1] == 2 and shape[0] != 2:
            return cache.transpose(0, 1)
        if shape[:2] == (2, 2):
            raise ValueError(
                "kvmoq connector: a CUDA cache of 2 blocks, where FlashAttention's and"
                " FlashInfer's layouts look alike; give vLLM more KV cache memory"
            )
    raise ValueError(
        f"kvmoq connector: a CUDA cache of shape {shape} is neither FlashAttention's"
        f" [2, blocks, {block_size}, {heads}, {head_dim}] nor FlashInfer's"
        f" [blocks, 2, {block_size}, {heads}, {head_dim}]"
    )


class BlockCopies(Protocol):
    """How a connector copies whole blocks between vLLM's cache and staging."""

    def read(self, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """The KV of `blocks` as `[2, len(blocks) * block_size, H, D]`, on the host."""
        ...

    def write(self, cache: torch.Tensor, blocks: torch.Tensor, kv: torch.Tensor) -> None:
        """Inverse of `read`."""
        ...


class PagedBlockCopies:
    """Block copies of a `[2, blocks, block_size, H, D]` cache (`paged_kv_view`), one
    indexed copy each way: a GPU cache the sidecar cannot map, staged through the host."""

    def read(self, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        kv = cache[:, blocks.to(cache.device)]
        return kv.reshape(2, -1, *cache.shape[3:]).cpu()

    def write(self, cache: torch.Tensor, blocks: torch.Tensor, kv: torch.Tensor) -> None:
        values = kv.reshape(2, len(blocks), *cache.shape[2:]).to(cache.device)
        cache[:, blocks.to(cache.device)] = values
