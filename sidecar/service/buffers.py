"""A model server's registered KV buffers, and the slots a request's tokens occupy in them.

The model server keeps its KV where its attention kernels want it: one tensor per layer
(K and V apart or stacked), token slots in a row or in vLLM-style paged blocks, any
strides. A `BufferSet` holds views of those tensors in one convention, `[blocks, slots,
kv_heads, head_dim]` per layer and part (a contiguous buffer is one block of `max_tokens`
slots), so reading a prompt's KV out and writing a loaded chunk in are the same loop over
block runs for both arrangements.

A buffer set lives on one device, and a prompt read out of it stays there: on a GPU the
codecs encode it where it is (vLLM's paged cache, read in place over CUDA IPC) and a loaded
chunk is decoded there before it is written. Those copies run on the codec streams of the
device (`tensors.streams`): at the lowest priority, after whatever this process queued
before, and finished before `read` or `write` returns, so the model server, told a chunk is
written, finds it there, and may reuse a block once the read that named it has returned.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sidecar.kvcache.layout import MAX_BLOCK_SIZE, MAX_BLOCKS, KVLayout, PagedBlocks
from sidecar.kvcache.naming import NamingError, check_model_name
from sidecar.service.errors import InvalidArgument
from sidecar.tensors import CodecStreams

MAX_CONTIGUOUS_TOKENS = 1 << 24
"""Bounds `max_tokens` (16 M slots) so a typo cannot size a view beyond any real buffer."""


@dataclass(frozen=True, slots=True)
class Contiguous:
    """One slot per token; a request's tokens sit in consecutive slots."""

    max_tokens: int


@dataclass(frozen=True, slots=True)
class Paged:
    """Fixed-size blocks of slots; a request's tokens sit in a list of blocks."""

    block_size: int
    num_blocks: int


Arrangement = Contiguous | Paged


@dataclass(frozen=True, slots=True)
class TokenSlots:
    """Slots `[start, end)` of contiguous buffers hold the request's tokens in order."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class BlockIds:
    """Token i of the request is in block `ids[i // block_size]`, slot `i % block_size`."""

    ids: tuple[int, ...]


Placement = TokenSlots | BlockIds


class KVPart(enum.Enum):
    KEY = "key"
    VALUE = "value"
    KEY_VALUE = "key_value"


@dataclass(frozen=True, slots=True)
class KVBuffer:
    """One opened buffer: a layer's keys, values, or both stacked on a leading 2."""

    layer: int
    part: KVPart
    tensor: torch.Tensor


@dataclass(frozen=True, slots=True)
class _Run:
    """Request tokens `[start, stop)` live in `block` from slot `slot` on."""

    block: int
    slot: int
    start: int
    stop: int


class BufferSet:
    """Every layer's K and V of one model, opened from the handles a model server sent."""

    def __init__(
        self,
        model: str,
        layout: KVLayout,
        arrangement: Arrangement,
        buffers: Sequence[KVBuffer],
    ) -> None:
        try:
            check_model_name(model)
        except NamingError as exc:
            raise InvalidArgument(str(exc)) from None
        _check_arrangement(arrangement)
        self.model = model
        self.layout = layout
        self.arrangement = arrangement
        self._views: dict[tuple[int, int], torch.Tensor] = {}
        for buffer in buffers:
            self._add(buffer)
        missing = [
            f"layer {layer} {'KV'[kv]}"
            for layer in range(layout.num_layers)
            for kv in (0, 1)
            if (layer, kv) not in self._views
        ]
        if missing:
            raise InvalidArgument(f"no buffer holds {', '.join(missing[:8])}")
        devices = {view.device for view in self._views.values()}
        if len(devices) > 1:
            names = ", ".join(sorted(str(device) for device in devices))
            raise InvalidArgument(f"the buffers of one set must be on one device, not {names}")
        self.device: torch.device = devices.pop()
        self._streams = CodecStreams.for_device(self.device)

    @property
    def slot_dims(self) -> tuple[int, ...]:
        """The leading dimensions a K or V buffer has before `[kv_heads, head_dim]`."""
        if isinstance(self.arrangement, Contiguous):
            return (self.arrangement.max_tokens,)
        return (self.arrangement.num_blocks, self.arrangement.block_size)

    def _add(self, buffer: KVBuffer) -> None:
        layout = self.layout
        if not 0 <= buffer.layer < layout.num_layers:
            raise InvalidArgument(
                f"buffer for layer {buffer.layer}: the layout has layers 0..{layout.num_layers - 1}"
            )
        expected = (*self.slot_dims, layout.num_kv_heads, layout.head_dim)
        if buffer.part is KVPart.KEY_VALUE:
            expected = (2, *expected)
        tensor = buffer.tensor
        if tuple(tensor.shape) != expected:
            raise InvalidArgument(
                f"layer {buffer.layer} {buffer.part.value} buffer has shape {tuple(tensor.shape)};"
                f" the layout and arrangement need {expected}"
            )
        if tensor.dtype != layout.torch_dtype:
            raise InvalidArgument(
                f"layer {buffer.layer} {buffer.part.value} buffer is {tensor.dtype};"
                f" the layout says {layout.dtype}"
            )
        parts = {
            KVPart.KEY: [(0, tensor)],
            KVPart.VALUE: [(1, tensor)],
            KVPart.KEY_VALUE: [(0, tensor[0]), (1, tensor[1])],
        }[buffer.part]
        for kv, view in parts:
            key = (buffer.layer, kv)
            if key in self._views:
                raise InvalidArgument(f"layer {buffer.layer} {'KV'[kv]} is given twice")
            if isinstance(self.arrangement, Contiguous):
                view = view.unsqueeze(0)
            self._views[key] = view

    def check(self, placement: Placement, tokens: int) -> None:
        """Refuse a placement that does not hold exactly `tokens` tokens inside the buffers."""
        arrangement = self.arrangement
        if isinstance(placement, TokenSlots):
            if not isinstance(arrangement, Contiguous):
                raise InvalidArgument("paged buffers take a block list, not a token range")
            if not 0 <= placement.start <= placement.end <= arrangement.max_tokens:
                raise InvalidArgument(
                    f"token range [{placement.start}, {placement.end}) is outside the"
                    f" {arrangement.max_tokens} slots of the buffers"
                )
            if placement.end - placement.start != tokens:
                raise InvalidArgument(
                    f"token range [{placement.start}, {placement.end}) holds"
                    f" {placement.end - placement.start} slots for {tokens} tokens"
                )
            return
        if not isinstance(arrangement, Paged):
            raise InvalidArgument("contiguous buffers take a token range, not a block list")
        needed = -(-tokens // arrangement.block_size)
        if len(placement.ids) != needed:
            raise InvalidArgument(
                f"{tokens} tokens need {needed} blocks of {arrangement.block_size},"
                f" got {len(placement.ids)}"
            )
        outside = [b for b in placement.ids if not 0 <= b < arrangement.num_blocks]
        if outside:
            raise InvalidArgument(
                f"block ids {outside[:8]} are outside the {arrangement.num_blocks} blocks"
            )
        if len(set(placement.ids)) != len(placement.ids):
            raise InvalidArgument("a block appears twice in the block list")

    def read(self, placement: Placement, tokens: int) -> torch.Tensor:
        """A copy of the request's KV, `[L, 2, tokens, H, D]`, on the buffers' device: the
        model server may reuse the slots as soon as this returns."""
        self.check(placement, tokens)
        shape, dtype = self.layout.shape(tokens), self.layout.torch_dtype
        out = torch.empty(shape, dtype=dtype, device=self.device)
        with self._streams.run():
            slots = self._slot_index(placement, 0, tokens)
            for (layer, kv), view in self._views.items():
                if slots is not None:
                    out[layer, kv] = view[slots]
                    continue
                for run in self._runs(placement, 0, tokens):
                    out[layer, kv, run.start : run.stop] = _slots(view, run)
        return out

    def write(self, placement: Placement, tokens: range, kv: torch.Tensor) -> None:
        """Write `kv` (`[L, 2, len(tokens), H, D]`, any device) at the request's token
        positions."""
        with self._streams.run():
            kv = kv.to(self.device)
            slots = self._slot_index(placement, tokens.start, tokens.stop)
            for (layer, part), view in self._views.items():
                if slots is not None:
                    view.index_put_(slots, kv[layer, part])
                    continue
                for run in self._runs(placement, tokens.start, tokens.stop):
                    source = kv[layer, part, run.start - tokens.start : run.stop - tokens.start]
                    _slots(view, run).copy_(source)

    def _slot_index(
        self, placement: Placement, start: int, stop: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(block, slot) of each token `[start, stop)` as index tensors on a GPU, where every
        copy is a kernel launch and one indexed copy per buffer beats one per block (16-token
        blocks: 8 per chunk); None on the CPU, where a run of slots is one memcpy."""
        if self.device.type != "cuda" or not isinstance(placement, BlockIds):
            return None
        assert isinstance(self.arrangement, Paged)  # check() matched them
        blocks, slots = PagedBlocks(self.arrangement.block_size, placement.ids).slots(start, stop)
        return blocks.to(self.device), slots.to(self.device)

    def _runs(self, placement: Placement, start: int, stop: int) -> list[_Run]:
        if isinstance(placement, TokenSlots):
            return [_Run(0, placement.start + start, start, stop)]
        assert isinstance(self.arrangement, Paged)  # check() matched them
        blocks = PagedBlocks(self.arrangement.block_size, placement.ids)
        return [_Run(r.block_id, r.offset, r.start, r.stop) for r in blocks.runs(start, stop)]


def _slots(view: torch.Tensor, run: _Run) -> torch.Tensor:
    return view[run.block, run.slot : run.slot + run.stop - run.start]


def _check_arrangement(arrangement: Arrangement) -> None:
    if isinstance(arrangement, Contiguous):
        _check_count("max_tokens", arrangement.max_tokens, MAX_CONTIGUOUS_TOKENS)
    else:
        _check_count("block_size", arrangement.block_size, MAX_BLOCK_SIZE)
        _check_count("num_blocks", arrangement.num_blocks, MAX_BLOCKS)


def _check_count(name: str, value: int, upper: int) -> None:
    if not 1 <= value <= upper:
        raise InvalidArgument(f"{name} must be in [1, {upper}], got {value}")
