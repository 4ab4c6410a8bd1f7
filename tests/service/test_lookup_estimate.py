"""Lookup's time estimate: the bytes of the tracks a load would choose, from a real catalog
(real encodings of synthetic KV), at a given throughput."""

from __future__ import annotations

import math

import pytest
import torch

from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.layout import KVLayout
from sidecar.transfer.adapt import chunk_sizes, load_seconds_estimate
from sidecar.transfer.track_quality import TrackChoice
from tests.support.sidecar import synthetic_kv

ANY_TRACK = TrackChoice(max_kl=math.inf)
"""No quality floor: the deadline rule alone."""
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, dtype="float16")
CHUNK = 16
TRACKS = ("fp16", "int8", "int4")


def catalog_of(kv: torch.Tensor, token_ids: list[int], ready: int) -> Catalog:
    """The catalog a publisher would revise to after encoding `ready` chunks of `kv`."""
    tables = {name: get_codec(name).fit_tables(LAYOUT, kv[:, :, :CHUNK]) for name in TRACKS}
    catalog = Catalog.for_prompt("m", LAYOUT, token_ids, tables, CHUNK)
    for index in range(ready):
        chunk = kv[:, :, index * CHUNK : (index + 1) * CHUNK]
        catalog = catalog.with_chunk(
            {name: get_codec(name).encode(chunk, LAYOUT, tables[name]) for name in TRACKS}
        )
    return catalog


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    tokens = 56  # chunks of 16, 16, 16, 8
    return catalog_of(synthetic_kv(LAYOUT, tokens), list(range(tokens)), ready=4)


def test_each_chunk_counts_on_the_track_the_deadline_rule_takes(catalog: Catalog) -> None:
    sizes = chunk_sizes(catalog, 4)
    assert sizes == [catalog.chunk_bytes(i) for i in range(4)]
    rate = 1e6
    fp16 = sum(s["fp16"] for s in sizes)
    int8 = sum(s["int8"] for s in sizes)
    int4 = sum(s["int4"] for s in sizes)
    assert int4 < int8 < fp16
    # Room for fp16 everywhere: the best track.
    assert load_seconds_estimate(sizes, rate, budget=10.0) == pytest.approx(fp16 / rate)
    # Three whole chunks and the time for int8 on each. The most recent weighs two shares, so
    # the first two get a quarter and then a third of what is left (room for int4, not int8)
    # and the last takes int8 with what they leave (not enough for fp16).
    whole = sizes[:3]
    assert len({(s["int8"], s["int4"], s["fp16"]) for s in whole}) == 1  # fixed-size codecs
    int8_chunk, int4_chunk, fp16_chunk = whole[0]["int8"], whole[0]["int4"], whole[0]["fp16"]
    budget = 3 * int8_chunk / rate
    assert int4_chunk <= 3 * int8_chunk / 4 < int8_chunk
    assert int4_chunk <= (3 * int8_chunk - int4_chunk) / 3 < int8_chunk
    assert int8_chunk <= 3 * int8_chunk - 2 * int4_chunk < fp16_chunk
    expected = (2 * int4_chunk + int8_chunk) / rate
    assert load_seconds_estimate(whole, rate, budget, ANY_TRACK) == pytest.approx(expected)
    # A narrower order, as a Load's track list would give.
    assert load_seconds_estimate(sizes, rate, 10.0, TrackChoice.only("int4")) == pytest.approx(
        int4 / rate
    )
    # Nothing fits: every chunk at its smallest, more than the budget (the load would stop);
    # under the default quality floor the smallest it admits.
    assert load_seconds_estimate(sizes, rate, 1e-9, ANY_TRACK) == pytest.approx(int4 / rate)
    assert load_seconds_estimate(sizes, rate, budget=1e-9) == pytest.approx(int8 / rate)
    # A floor that admits int4 everywhere but the most recent chunk.
    looser = TrackChoice(max_kl=0.01)
    at_most_int8 = sum(s["int4"] for s in sizes[:3]) + sizes[3]["int8"]
    assert load_seconds_estimate(sizes, rate, 1e-9, looser) == pytest.approx(at_most_int8 / rate)


def test_chunks_not_described_yet_count_at_the_bytes_per_token_of_those_that_are() -> None:
    tokens = 56
    kv = synthetic_kv(LAYOUT, tokens)
    partial = catalog_of(kv, list(range(tokens)), ready=2)
    sizes = chunk_sizes(partial, 4)
    assert sizes[:2] == [partial.chunk_bytes(0), partial.chunk_bytes(1)]
    for track in TRACKS:
        per_token = (sizes[0][track] + sizes[1][track]) / 32
        assert sizes[2][track] == round(per_token * 16)
        assert sizes[3][track] == round(per_token * 8)  # the last chunk is half as long
    assert chunk_sizes(partial, 1) == [partial.chunk_bytes(0)]


def test_each_chunk_takes_as_long_as_its_tracks_own_rate_says(catalog: Catalog) -> None:
    """The rule chooses at the overall rate; the time counts at the chosen track's rate
    where one was measured (ac and int4 decode slower than fp16 moves)."""
    sizes = chunk_sizes(catalog, 4)
    fp16 = sum(s["fp16"] for s in sizes)
    int4 = sum(s["int4"] for s in sizes)
    rates = {"fp16": 2e6, "int4": 0.25e6}  # int8 unmeasured: the overall rate
    assert load_seconds_estimate(sizes, 1e6, 10.0, track_rates=rates) == pytest.approx(fp16 / 2e6)
    only_int4 = load_seconds_estimate(sizes, 1e6, 10.0, TrackChoice.only("int4"), track_rates=rates)
    assert only_int4 == pytest.approx(int4 / 0.25e6)
    # Nothing lands in time: each chunk at its quickest track, at that track's own rate
    # (int4, the smallest, is not the quickest at 0.25 MB/s).
    quickest = sum(min(size / rates.get(t, 1e6) for t, size in s.items()) for s in sizes)
    assert quickest < int4 / 0.25e6
    assert load_seconds_estimate(sizes, 1e6, 1e-9, ANY_TRACK, rates) == pytest.approx(quickest)
    int8 = sum(s["int8"] for s in sizes)
    assert load_seconds_estimate(
        sizes, 1e6, 10.0, TrackChoice.only("int8"), track_rates=rates
    ) == pytest.approx(int8 / 1e6)
