"""The CacheGen baseline of bench/: a true round trip, and the bytes CacheGen ships."""

from __future__ import annotations

import torch

from bench.cachegen_baseline import (
    CDF_ENTRIES,
    cachegen_cdf,
    cachegen_roundtrip,
    compression,
)
from sidecar.kvcache.codecs.base import token_major
from sidecar.kvcache.codecs.binning import cachegen_bins, dequantize, quantize
from sidecar.kvcache.layout import KVLayout


def test_cdf_is_cachegens_16_bit_table() -> None:
    counts = torch.tensor([[0.0] * 10 + [5.0, 90.0, 5.0] + [0.0] * 19, [1.0] * 32])
    cdf = cachegen_cdf(counts)
    assert cdf.shape == (2, CDF_ENTRIES)
    assert cdf[:, 0].tolist() == [0, 0]
    assert cdf[:, -1].tolist() == [65536, 65536]
    assert bool((torch.diff(cdf, dim=-1) >= 1).all())
    assert torch.diff(cdf[1]).tolist() == [2048] * 32


def test_round_trip_is_the_quantizer_and_sizes_add_up() -> None:
    layout = KVLayout(3, 2, 8, dtype="float32")
    kv = torch.randn(layout.shape(300), generator=torch.Generator().manual_seed(0))
    result = cachegen_roundtrip(kv, chunk_tokens=256)
    bins = cachegen_bins(3)
    symbols, maxima = quantize(token_major(kv, layout), bins)
    expected = dequantize(symbols, maxima, bins).view(300, 3, 2, 2, 8).permute(1, 2, 0, 3, 4)
    assert torch.equal(result.kv, expected)
    assert result.table_bytes == 2 * 3 * 2 * 16 * CDF_ENTRIES * 2
    assert result.maxima_bytes == 300 * 3 * 2 * 2
    assert 0 < result.symbol_bytes < 300 * 3 * 2 * 16 * 5 / 8


def test_bench_shape_round_trips_a_chunk() -> None:
    layout = KVLayout(2, 1, 4, dtype="float32")
    kv = torch.randn(layout.shape(40), generator=torch.Generator().manual_seed(1))
    baseline = compression(layout)
    blobs = baseline.encode(kv, baseline.fit(kv))
    assert len(blobs) == 1
    assert torch.equal(baseline.decode(blobs, None), cachegen_roundtrip(kv).kv)
