"""`ac`: CacheGen-style layer-wise quantization, entropy coded with ANS, one stream per token.

Payload: `version u8 | maxima fp16 [L, 2] | ANS words u32 LE`. The words are a constriction
`AnsCoder` stream (64-bit state, 32-bit words, 24-bit model precision) holding the token's
`L * 2 * H * D` symbols grouped by model: models in ascending index, and within a model its
channels in ascending (layer, K|V, channel) order. Each model is constriction's
`Categorical(frequencies / 2^16, perfect=False)` built from the shared tables.

Why this is fast without giving up per-token streams: the tables map thousands of channels
onto about a hundred models, so a token costs one constriction call per model (each coding
a hundred-odd symbols against a prebuilt model) instead of a probability table per symbol;
the quantization and the channel reordering run on whole batches of tokens (torch, numpy).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import constriction
import numpy as np
import torch

from ..errors import PayloadError, TablesError
from ..layout import KVLayout
from .ac_tables import FREQUENCY_TOTAL, ACTables, fit_tables
from .base import (
    PAYLOAD_VERSION,
    Codec,
    all_finite,
    check_payloads,
    destination,
    token_major,
    write_layer_major,
)
from .binning import DEFAULT_LEVEL, centers, dequantize, quantize

MAX_TABLES_CACHED = 16
MAX_BITS_PER_SYMBOL = 24
"""No symbol costs more than the model precision, which bounds a valid payload's length."""


@dataclass(frozen=True, eq=False)
class _Plan:
    """What encode and decode derive from a prompt's tables, built once per tables."""

    tables: ACTables
    order: np.ndarray
    inverse: np.ndarray
    segments: tuple[tuple[object, int, int], ...]
    top_symbol: torch.Tensor
    max_words: int


@functools.lru_cache(maxsize=MAX_TABLES_CACHED)
def _plan(layout: KVLayout, data: bytes) -> _Plan:
    tables = ACTables.from_bytes(layout, data)
    order = torch.sort(tables.model_of.long(), stable=True).indices
    counts = torch.bincount(tables.model_of.long(), minlength=tables.num_models).tolist()
    bounds = np.cumsum([0, *counts]).tolist()
    models = [
        constriction.stream.model.Categorical(row / FREQUENCY_TOTAL, perfect=False)
        for row in tables.frequencies.double().numpy()
    ]
    segments = tuple(
        (models[m], bounds[m], bounds[m + 1]) for m in range(tables.num_models) if counts[m]
    )
    top = (2 * centers(tables.bins)).to(torch.uint8).view(layout.num_layers, 2)
    return _Plan(
        tables=tables,
        order=order.numpy(),
        inverse=torch.argsort(order).numpy(),
        segments=segments,
        top_symbol=top,
        max_words=2 + layout.elements_per_token * MAX_BITS_PER_SYMBOL // 32,
    )


class ACCodec(Codec):
    """The `ac` track; `level` (1-3) only changes the bins chosen when fitting tables."""

    name = "ac"

    def __init__(self, level: int = DEFAULT_LEVEL) -> None:
        self.level = level

    def fit_tables(self, layout: KVLayout, sample: torch.Tensor) -> bytes:
        return fit_tables(layout, sample, self.level).to_bytes()

    def plan(self, layout: KVLayout, tables: bytes | None) -> _Plan:
        if tables is None:
            raise TablesError("the ac codec needs the prompt's tables (see fit_tables)")
        if not isinstance(tables, bytes):
            raise TablesError(f"ac tables must be bytes, got {type(tables).__name__}")
        return _plan(layout, tables)

    def _encode_batch(
        self, kv: torch.Tensor, layout: KVLayout, tables: bytes | None
    ) -> list[bytes]:
        plan = self.plan(layout, tables)
        num_tokens = kv.shape[2]
        symbols, maxima = quantize(token_major(kv, layout), plan.tables.bins.to(kv.device))
        ordered = np.take(symbols.view(num_tokens, -1).cpu().numpy(), plan.order, axis=1)
        heads = torch.cat(
            (
                torch.full((num_tokens, 1), PAYLOAD_VERSION, dtype=torch.uint8),
                maxima.cpu().view(torch.uint8).view(num_tokens, -1),
            ),
            dim=1,
        ).numpy()
        payloads = []
        backwards = plan.segments[::-1]
        for head, row in zip(heads, ordered, strict=True):
            coder = constriction.stream.stack.AnsCoder()
            encode = coder.encode_reverse
            for model, start, stop in backwards:
                encode(row[start:stop], model)
            words = coder.get_compressed().astype("<u4", copy=False)
            payloads.append(head.tobytes() + words.tobytes())
        return payloads

    def decode(
        self,
        payloads: Sequence[bytes],
        layout: KVLayout,
        tables: bytes | None = None,
        *,
        device: torch.device | str | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        plan = self.plan(layout, tables)
        num_tokens = check_payloads(payloads)
        dst = destination(layout, num_tokens, device, out)
        head = 1 + 2 * layout.num_layers * 2
        # Symbols are below the alphabet (<= 63): one byte each keeps the reordering gather
        # and the range check at a quarter of the memory traffic of int32.
        symbols = np.empty((num_tokens, layout.elements_per_token), dtype=np.uint8)
        maxima = bytearray(num_tokens * (head - 1))
        for index, payload in enumerate(payloads):
            words = len(payload) - head
            if words < 0 or words % 4 or words // 4 > plan.max_words:
                raise PayloadError(f"ac payload {index} has an impossible length {len(payload)}")
            maxima[index * (head - 1) : (index + 1) * (head - 1)] = payload[1:head]
            self._decode_symbols(payload, head, plan, symbols[index], index)
        # numpy's take: 4x faster on CPU than torch's indexing by the same int64 tensor.
        ordered = np.take(symbols, plan.inverse, axis=1)
        values = torch.from_numpy(ordered).to(dst.device)
        values = values.view(num_tokens, layout.num_layers, 2, layout.channels)
        # Each row's largest symbol, then one compare per row: 4x faster than comparing all.
        if bool((values.amax(dim=-1) > plan.top_symbol.to(dst.device)).any()):
            raise PayloadError("ac payload decodes to symbols outside its layer's bins")
        scales = torch.frombuffer(maxima, dtype=torch.float16)
        scales = scales.view(num_tokens, layout.num_layers, 2).to(dst.device)
        if bool((scales < 0).any()) or not all_finite(scales):
            raise PayloadError("ac payload carries a negative or non-finite maximum")
        bins = plan.tables.bins.to(dst.device)
        return write_layer_major(dequantize(values, scales, bins), layout, dst)

    @staticmethod
    def _decode_symbols(
        payload: bytes, head: int, plan: _Plan, row: np.ndarray, index: int
    ) -> None:
        try:
            words = np.frombuffer(payload, "<u4", offset=head).astype(np.uint32, copy=False)
            coder = constriction.stream.stack.AnsCoder(words)
            decode = coder.decode  # bound once: ~100 calls per token are the decoder's cost
            # Joined in one call: a slice assignment per model cost 10% of the decode.
            symbols = [decode(model, stop - start) for model, start, stop in plan.segments]
            np.concatenate(symbols, out=row, casting="unsafe")
        except ValueError as error:
            raise PayloadError(f"ac payload {index} is corrupt: {error}") from None
        if not coder.is_empty():
            raise PayloadError(f"ac payload {index} is corrupt: its stream does not end cleanly")


AC = ACCodec()
