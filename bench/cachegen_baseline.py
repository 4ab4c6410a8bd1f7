"""CacheGen as it ships (LMCache's serde), measured honestly, as the `ac` codec's baseline.

The same quantizer as `ac` (CacheGen's level bins, per-token maxima), but CacheGen's model:
one histogram per (K|V, layer, channel) over the tokens of each chunk (LMCache's default
chunk is 256 tokens), turned into a 16-bit CDF of 33 entries exactly as its `calculate_cdf`
kernel does, shipped with that chunk and used to entropy code the chunk's symbols. A chunk
really is serialised (header, fp16 maxima, the CDF as u16, the ANS words) and parsed back,
so the sizes are bytes on the wire and the KV is a true round trip. CacheGen's per-stream
length table (int32 per (K|V, layer, channel)) is left out, which flatters the baseline.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import constriction
import numpy as np
import torch

from bench.compression import Compression
from sidecar.kvcache.codecs.base import token_major, write_layer_major
from sidecar.kvcache.codecs.binning import DEFAULT_LEVEL, cachegen_bins, dequantize, quantize
from sidecar.kvcache.layout import KVLayout, iter_chunks

CHUNK_TOKENS = 256
CDF_ENTRIES = 33
CDF_PRECISION = 16
_HEADER = struct.Struct("<II")


def cachegen_cdf(counts: torch.Tensor) -> torch.Tensor:
    """CacheGen's integer CDF `[..., 33]` from symbol counts `[..., 32]` (strictly increasing)."""
    entries = counts.shape[-1] + 1
    cumulative = torch.cumsum(counts.double(), dim=-1) / counts.sum(-1, keepdim=True)
    cdf = torch.cat((torch.zeros_like(cumulative[..., :1]), cumulative), dim=-1)
    scaled = (cdf * (2**CDF_PRECISION - (entries - 1))).round().long()
    return scaled + torch.arange(entries)


def _models(cdf: np.ndarray) -> list[constriction.stream.model.Categorical]:
    frequencies = np.diff(cdf, axis=-1).astype(np.float64)
    return [constriction.stream.model.Categorical(row, perfect=False) for row in frequencies]


def encode_chunk(kv: torch.Tensor, layout: KVLayout, level: int = DEFAULT_LEVEL) -> bytes:
    """One CacheGen chunk: `T u32 | words u32 | maxima f16 [T,L,2] | CDF u16 [2L*C,33] | words`."""
    num_tokens = layout.check(kv)
    symbols, maxima = quantize(token_major(kv, layout), cachegen_bins(layout.num_layers, level))
    channel_major = symbols.view(num_tokens, -1).t().contiguous()
    counts = torch.zeros(channel_major.shape[0], CDF_ENTRIES - 1)
    counts.scatter_add_(1, channel_major.long(), torch.ones(channel_major.shape))
    cdf = cachegen_cdf(counts).numpy()
    coder = constriction.stream.stack.AnsCoder()
    for row, model in zip(reversed(channel_major.numpy()), reversed(_models(cdf)), strict=True):
        coder.encode_reverse(row, model)
    words = coder.get_compressed().astype("<u4")
    return b"".join(
        (
            _HEADER.pack(num_tokens, len(words)),
            maxima.view(torch.uint8).numpy().tobytes(),
            (cdf & 0xFFFF).astype("<u2").tobytes(),
            words.tobytes(),
        )
    )


def decode_chunk(blob: bytes, layout: KVLayout, level: int = DEFAULT_LEVEL) -> torch.Tensor:
    """Inverse of `encode_chunk`: float32 KV `[L, 2, T, H, D]`."""
    num_tokens, _ = _HEADER.unpack_from(blob)
    rows = layout.num_layers * 2 * layout.channels
    maxima_end = _HEADER.size + 2 * num_tokens * layout.num_layers * 2
    cdf_end = maxima_end + 2 * rows * CDF_ENTRIES
    maxima = torch.frombuffer(bytearray(blob[_HEADER.size : maxima_end]), dtype=torch.float16)
    cdf = np.frombuffer(blob[maxima_end:cdf_end], dtype="<u2").reshape(rows, CDF_ENTRIES)
    cdf = cdf.astype(np.int64)
    cdf[:, -1] = 1 << CDF_PRECISION  # 2^16 wraps to 0 in 16 bits; it always ends the CDF
    decoder = constriction.stream.stack.AnsCoder(
        np.frombuffer(blob[cdf_end:], dtype="<u4").astype(np.uint32)
    )
    channel_major = np.stack([decoder.decode(model, num_tokens) for model in _models(cdf)])
    symbols = (
        torch.from_numpy(channel_major)
        .t()
        .reshape(num_tokens, layout.num_layers, 2, layout.channels)
    )
    values = dequantize(
        symbols,
        maxima.view(num_tokens, layout.num_layers, 2),
        cachegen_bins(layout.num_layers, level),
    )
    out = torch.empty(layout.shape(num_tokens), dtype=torch.float32)
    return write_layer_major(values, layout, out)


@dataclass(frozen=True)
class CacheGenResult:
    kv: torch.Tensor
    symbol_bytes: int
    table_bytes: int
    maxima_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.symbol_bytes + self.table_bytes + self.maxima_bytes


def cachegen_roundtrip(
    kv: torch.Tensor, level: int = DEFAULT_LEVEL, chunk_tokens: int = CHUNK_TOKENS
) -> CacheGenResult:
    """CacheGen's compression of `kv` `[L, 2, T, H, D]`: round-tripped KV and bytes shipped."""
    layers, _, _, heads, head_dim = kv.shape
    layout = KVLayout(layers, heads, head_dim, dtype="float32")
    blobs = [encode_chunk(chunk, layout, level) for chunk in iter_chunks(kv, layout, chunk_tokens)]
    restored = torch.cat([decode_chunk(blob, layout, level) for blob in blobs], dim=2)
    table_bytes = len(blobs) * layers * 2 * layout.channels * CDF_ENTRIES * 2
    maxima_bytes = kv.shape[2] * layers * 2 * 2
    total = sum(len(blob) for blob in blobs)
    return CacheGenResult(
        kv=restored,
        symbol_bytes=total - table_bytes - maxima_bytes - _HEADER.size * len(blobs),
        table_bytes=table_bytes,
        maxima_bytes=maxima_bytes,
    )


def compression(layout: KVLayout, level: int = DEFAULT_LEVEL) -> Compression:
    """Each chunk handed to `encode` is one CacheGen chunk with its own CDF: call it with
    256-token chunks to measure CacheGen's default."""
    return Compression(
        name="cachegen",
        fit=lambda sample: None,
        encode=lambda chunk, tables: [encode_chunk(chunk, layout, level)],
        decode=lambda blobs, tables: torch.cat(
            [decode_chunk(blob, layout, level) for blob in blobs], dim=2
        ),
    )
