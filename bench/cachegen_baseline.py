"""CacheGen as it ships (LMCache's serde), measured honestly, as the `ac` codec's baseline.

The same quantizer as `ac` (CacheGen's level bins, per-token maxima), but CacheGen's model:
one histogram per (K|V, layer, channel) over the tokens of each 256-token chunk, turned into
a 16-bit CDF of 33 entries exactly as its `calculate_cdf` kernel does, shipped with that chunk
and used to entropy code the chunk's symbols. Sizes count what CacheGen ships: coded symbols,
the CDF tables (33 x 16 bits per (K|V, layer, channel) and chunk) and the fp16 maxima; the
per-stream length table it also ships is left out, which flatters the baseline slightly.
The symbols really go through the coder and back, so the KV returned is a true round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

import constriction
import numpy as np
import torch

from sidecar.kvcache.codecs.base import token_major, write_layer_major
from sidecar.kvcache.codecs.binning import DEFAULT_LEVEL, dequantize, level_bins, quantize
from sidecar.kvcache.layout import KVLayout, chunk_ranges

CHUNK_TOKENS = 256
CDF_ENTRIES = 33
CDF_ENTRY_BYTES = 2
CDF_PRECISION = 16


@dataclass(frozen=True)
class CacheGenResult:
    kv: torch.Tensor
    symbol_bytes: int
    table_bytes: int
    maxima_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.symbol_bytes + self.table_bytes + self.maxima_bytes


def cachegen_cdf(counts: torch.Tensor) -> torch.Tensor:
    """CacheGen's integer CDF `[..., 33]` from symbol counts `[..., 32]` (strictly increasing)."""
    entries = counts.shape[-1] + 1
    cumulative = torch.cumsum(counts.double(), dim=-1) / counts.sum(-1, keepdim=True)
    cdf = torch.cat((torch.zeros_like(cumulative[..., :1]), cumulative), dim=-1)
    scaled = (cdf * (2**CDF_PRECISION - (entries - 1))).round().long()
    return scaled + torch.arange(entries)


def cachegen_roundtrip(
    kv: torch.Tensor, level: int = DEFAULT_LEVEL, chunk_tokens: int = CHUNK_TOKENS
) -> CacheGenResult:
    """CacheGen's compression of `kv` `[L, 2, T, H, D]`: round-tripped KV and bytes shipped."""
    layers, _, num_tokens, heads, head_dim = kv.shape
    layout = KVLayout(layers, heads, head_dim, dtype="float32")
    bins = level_bins(layers, level)
    symbols, maxima = quantize(token_major(kv, layout), bins)
    flat = symbols.view(num_tokens, -1)
    decoded = torch.empty_like(flat)
    symbol_bytes = 0
    for span in chunk_ranges(num_tokens, chunk_tokens):
        channel_major = flat[span.start : span.stop].t().contiguous()
        counts = torch.zeros(channel_major.shape[0], CDF_ENTRIES - 1)
        counts.scatter_add_(1, channel_major.long(), torch.ones(channel_major.shape))
        frequencies = torch.diff(cachegen_cdf(counts), dim=-1).double().numpy()
        models = [constriction.stream.model.Categorical(row, perfect=False) for row in frequencies]
        rows = channel_major.numpy()
        coder = constriction.stream.stack.AnsCoder()
        for row, model in zip(reversed(rows), reversed(models), strict=True):
            coder.encode_reverse(row, model)
        words = coder.get_compressed()
        symbol_bytes += 4 * len(words)
        decoder = constriction.stream.stack.AnsCoder(words)
        restored = np.stack([decoder.decode(model, len(span)) for model in models])
        decoded[span.start : span.stop] = torch.from_numpy(restored).t()
    if not torch.equal(decoded, flat):
        raise RuntimeError("the entropy coder did not round-trip CacheGen's symbols")
    values = dequantize(decoded.view(symbols.shape), maxima, bins)
    restored_kv = write_layer_major(values, layout, torch.empty(kv.shape, dtype=torch.float32))
    chunks = len(chunk_ranges(num_tokens, chunk_tokens))
    return CacheGenResult(
        kv=restored_kv,
        symbol_bytes=symbol_bytes,
        table_bytes=chunks * layers * 2 * heads * head_dim * CDF_ENTRIES * CDF_ENTRY_BYTES,
        maxima_bytes=2 * num_tokens * layers * 2,
    )
