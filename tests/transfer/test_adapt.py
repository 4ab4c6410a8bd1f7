"""Per-chunk track choice against a deadline, and the throughput estimate it relies on."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.kvcache.naming import PAYLOAD_TRACKS
from sidecar.transfer.adapt import (
    DEFAULT_PRIOR_BYTES_PER_SECOND,
    RECENT_WEIGHT,
    ThroughputEstimate,
    choose_track,
    paying_tracks,
    time_share,
)
from sidecar.transfer.track_quality import QUALITY_ORDER, rank_by_quality

rates = st.floats(1.0, 1e11)
samples = st.tuples(st.integers(1, 1 << 30), st.floats(1e-6, 100.0))


def test_quality_order_covers_every_payload_track() -> None:
    assert sorted(QUALITY_ORDER) == sorted(PAYLOAD_TRACKS)


def test_quality_order_is_the_measured_ranking_the_docs_state() -> None:
    assert QUALITY_ORDER == ("fp16", "bf16", "int8", "fp8", "int4", "fp4", "ac")
    wire_format = (Path(__file__).parents[2] / "docs" / "wire-format.md").read_text()
    assert f"`{' '.join(QUALITY_ORDER)}`" in wire_format


def test_ranking_puts_lower_kl_first_and_breaks_ties_by_name() -> None:
    assert rank_by_quality({"int4": 0.02, "fp4": 0.01, "ac": 0.05}) == ("fp4", "int4", "ac")
    assert rank_by_quality({"b": 0.1, "a": 0.1}) == ("a", "b")


@given(
    st.dictionaries(st.sampled_from(PAYLOAD_TRACKS), st.floats(0.0, 1.0), min_size=2),
    st.dictionaries(st.sampled_from(PAYLOAD_TRACKS), st.integers(1, 10_000), min_size=2),
    st.floats(0.0, 100.0),
)
def test_a_track_larger_and_worse_than_another_is_never_chosen(
    kl: dict[str, float], sizes: dict[str, int], time_left: float
) -> None:
    order = rank_by_quality(kl)
    chosen = choose_track(sizes, 100.0, time_left, 1, order)
    if chosen is not None:
        assert not any(
            kl[other] < kl[chosen] and sizes[other] <= sizes[chosen]
            for other in order
            if other in sizes
        )


def test_the_first_sample_replaces_the_prior() -> None:
    estimate = ThroughputEstimate()
    assert estimate.bytes_per_second == DEFAULT_PRIOR_BYTES_PER_SECOND
    assert estimate.observe(1000, 2.0).bytes_per_second == 500.0


def test_later_samples_are_weighted_by_alpha() -> None:
    estimate = ThroughputEstimate(alpha=0.25).observe(100, 1.0).observe(500, 1.0)
    assert estimate.bytes_per_second == pytest.approx(0.25 * 500 + 0.75 * 100)
    assert estimate.samples == 2


@given(st.lists(samples, min_size=1, max_size=20), st.floats(0.01, 1.0))
def test_the_estimate_stays_within_the_measured_rates(
    measured: list[tuple[int, float]], alpha: float
) -> None:
    estimate = ThroughputEstimate(alpha=alpha)
    for nbytes, seconds in measured:
        estimate = estimate.observe(nbytes, seconds)
    observed = [n / s for n, s in measured]
    assert min(observed) * (1 - 1e-9) <= estimate.bytes_per_second <= max(observed) * (1 + 1e-9)


@given(st.integers(1, 1 << 40), st.integers(1, 1 << 40), st.floats(0.01, 1.0), st.integers(0, 30))
def test_a_change_of_rate_is_followed_geometrically(
    before: int, after: int, alpha: float, steps: int
) -> None:
    estimate = ThroughputEstimate(alpha=alpha).observe(before, 1.0)
    for _ in range(steps):
        estimate = estimate.observe(after, 1.0)
    expected = after + (before - after) * (1 - alpha) ** steps
    assert estimate.bytes_per_second == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("nbytes", "seconds"), [(0, 1.0), (-1, 1.0), (1, 0.0), (1, math.inf)])
def test_meaningless_samples_are_refused(nbytes: int, seconds: float) -> None:
    with pytest.raises(ValueError):
        ThroughputEstimate().observe(nbytes, seconds)


@pytest.mark.parametrize(
    "kwargs",
    [{"bytes_per_second": 0.0}, {"bytes_per_second": math.nan}, {"alpha": 0.0}, {"alpha": 1.5}],
)
def test_estimator_parameters_are_checked(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ThroughputEstimate(**kwargs)


SIZES = {"fp16": 1000, "int8": 500, "ac": 300, "int4": 250}
ORDER = ("fp16", "int8", "ac", "int4")


@pytest.mark.parametrize(
    ("time_left", "chunks_left", "expected"),
    [
        (10.0, 1, "fp16"),
        (10.0, 10, "fp16"),
        (10.0, 11, "int8"),
        (10.0, 20, "int8"),
        (10.0, 30, "ac"),
        (10.0, 40, "int4"),
        (10.0, 41, "int4"),  # over its share, but in long before the deadline
        (0.0, 1, None),
        (-1.0, 1, None),
    ],
)
def test_best_track_within_the_share_of_time_left(
    time_left: float, chunks_left: int, expected: str | None
) -> None:
    """CacheGen's equal shares, when the last chunk is not the load's most recent."""
    assert choose_track(SIZES, 1000.0, time_left, chunks_left, ORDER, last_is_recent=False) == (
        expected
    )


def test_the_most_recent_chunk_weighs_recent_weight_shares() -> None:
    assert RECENT_WEIGHT == 2.0
    assert time_share(12.0, 1) == 12.0
    assert time_share(12.0, 5) == pytest.approx(12.0 / 6)
    assert time_share(12.0, 5, last_is_recent=False) == pytest.approx(12.0 / 5)
    assert time_share(-1.0, 3) == 0.0
    with pytest.raises(ValueError):
        time_share(1.0, 0)


def test_a_load_takes_its_last_chunk_on_a_better_track_with_the_time_others_leave() -> None:
    """Four chunks, 1000 B/s, 2 s: equal shares give each chunk 500 B, int8; with the most
    recent chunk weighing two shares the first three get ac (300 B) and the last one the
    1.1 s they leave: fp16."""

    def plan(last_is_recent: bool) -> list[str | None]:
        time_left, chosen = 2.0, []
        for index in range(4):
            track = choose_track(
                SIZES, 1000.0, time_left, 4 - index, ORDER, last_is_recent=last_is_recent
            )
            chosen.append(track)
            time_left -= SIZES[track] / 1000.0 if track else 0.0
        assert time_left >= -1e-12
        return chosen

    assert plan(last_is_recent=False) == ["int8"] * 4
    assert plan(last_is_recent=True) == ["ac", "ac", "ac", "fp16"]


def test_past_its_share_a_chunk_takes_the_quickest_track_that_lands_in_time() -> None:
    """No track fits a hundredth of 1 s at 1000 B/s (10 B): the chunk still loads, on the
    track whose bytes arrive first, as long as they arrive within the time left; only a
    chunk that cannot land at all stops the load."""
    assert choose_track(SIZES, 1000.0, 1.0, 100, ORDER) == "int4"  # 0.25 s
    assert choose_track(SIZES, 1000.0, 0.26, 100, ORDER) == "int4"
    assert choose_track(SIZES, 1000.0, 0.24, 100, ORDER) is None
    # Quickest by time, not bytes: int4 measured at 100 B/s takes 2.5 s, ac 0.3 s.
    rates = {"int4": 100.0}
    assert choose_track(SIZES, 1000.0, 1.0, 100, ORDER, track_rates=rates) == "ac"


def test_tracks_outside_the_order_are_never_chosen() -> None:
    assert choose_track(SIZES, 1000.0, 10.0, 1, ("int4", "ac")) == "int4"
    assert choose_track({"fp16": 1}, 1000.0, 10.0, 1, ("int4",)) is None


def test_chunks_left_counts_this_chunk() -> None:
    with pytest.raises(ValueError):
        choose_track(SIZES, 1000.0, 10.0, 0)


def test_slack_from_an_early_chunk_goes_to_the_next() -> None:
    sizes = {"fp16": 100, "int4": 25}
    assert choose_track(sizes, 1.0, 125.0, 2) == "int4"
    assert choose_track(sizes, 1.0, 125.0 - 25, 1) == "fp16"


chunk_sizes = st.lists(
    st.fixed_dictionaries({}, optional={t: st.integers(1, 10_000) for t in PAYLOAD_TRACKS}).filter(
        bool
    ),
    min_size=1,
    max_size=30,
)


@given(chunk_sizes, rates, st.floats(0.0, 100.0))
def test_with_a_true_estimate_a_load_never_misses_its_deadline(
    chunks: list[dict[str, int]], rate: float, deadline: float
) -> None:
    """Each chunk takes the best track within its share, else the quickest one that lands
    in time; the load stops only where nothing lands in time, and never runs late."""
    time_left = deadline
    for index, sizes in enumerate(chunks):
        left = len(chunks) - index
        track = choose_track(sizes, rate, time_left, left)
        shares = 1 if left == 1 else left - 1 + RECENT_WEIGHT
        budget = time_left / shares * rate
        smallest = min(sizes.values())
        if track is None:
            assert smallest / rate > time_left
            break
        if sizes[track] <= budget:
            better = QUALITY_ORDER[: QUALITY_ORDER.index(track)]
            assert all(sizes[t] > budget for t in better if t in sizes)
        else:
            assert all(sizes[t] > budget for t in sizes)
            assert sizes[track] == smallest and smallest / rate <= time_left
        time_left -= sizes[track] / rate
    assert time_left >= -1e-9 * deadline


def test_each_track_is_timed_at_its_own_measured_rate() -> None:
    """A shared rate dragged down by a slow-decoding track (ac on loopback) must not refuse a
    track measured fast, and a track measured slow is not taken at the shared rate."""
    shared = 400.0  # in 1 s: 400 B, so ac (300 B) is the best track that fits
    assert choose_track(SIZES, shared, 1.0, 1, ORDER, track_rates={}) == "ac"
    # fp16's own loads moved 2000 B/s.
    assert choose_track(SIZES, shared, 1.0, 1, ORDER, track_rates={"fp16": 2000.0}) == "fp16"
    # ac measured at 100 B/s: the next track, int4, timed at the shared rate.
    assert choose_track(SIZES, shared, 1.0, 1, ORDER, track_rates={"ac": 100.0}) == "int4"


def test_a_chunk_pays_on_the_tracks_that_beat_computing_it() -> None:
    """The model server computes this chunk in `compute_seconds`: only the tracks whose bytes
    arrive sooner may take it, each timed at its own rate where measured, in the given
    order; tracks not on offer are not named."""
    order = ["fp16", "int8", "int4"]
    # At 1000 B/s: fp16 1.0 s, int8 0.5 s, int4 0.25 s.
    assert paying_tracks(SIZES, 1000.0, order, 2.0) == order
    assert paying_tracks(SIZES, 1000.0, order, 0.5) == ["int8", "int4"]
    assert paying_tracks(SIZES, 1000.0, order, 0.2) == []
    # fp16 measured at 4000 B/s (0.25 s), int4 at 100 B/s (2.5 s).
    rates = {"fp16": 4000.0, "int4": 100.0}
    assert paying_tracks(SIZES, 1000.0, order, 0.5, rates) == ["fp16", "int8"]
    assert paying_tracks({"int8": 500}, 1000.0, order, 2.0) == ["int8"]
