"""The relay's cache: one byte budget over every track, evicting whole groups LRU."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.moqt.protocol.cache import OBJECT_OVERHEAD, ObjectCache
from sidecar.moqt.protocol.model import FullTrackName, Location, TrackObject

A = FullTrackName((b"ns",), b"a")
B = FullTrackName((b"ns",), b"b")


def obj(object_id: int, size: int) -> TrackObject:
    return TrackObject(object_id, bytes(size))


def test_the_least_recently_used_group_of_any_track_goes_first() -> None:
    cost = 1000 + OBJECT_OVERHEAD
    cache = ObjectCache(3 * cost)
    cache.add(A, 0, obj(0, 1000))
    cache.add(B, 0, obj(0, 1000))
    cache.add(A, 1, obj(0, 1000))
    assert cache.group(A, 0) is not None  # touched: B's group 0 is now the oldest
    cache.add(B, 1, obj(0, 1000))
    assert cache.group_ids(A, 0) == [0, 1]
    assert cache.group_ids(B, 0) == [1]
    assert cache.size == 3 * cost


def test_groups_arriving_together_go_in_the_order_they_began() -> None:
    """Four group streams interleaved, room for four objects: the two oldest go (the first
    half-way in, its rest not kept), and the two newest stay whole. Were every object a use,
    which groups stay would follow the order the streams were served in: here 0 and 2, and
    the newest, 3, lost half-way."""
    cache = ObjectCache(4 * (100 + OBJECT_OVERHEAD))
    for group in range(4):
        cache.add(A, group, obj(0, 100))
    assert cache.group_ids(A, 0) == [0, 1, 2, 3]  # full, each group half-way in
    cache.add(A, 0, obj(1, 100))  # no room: the oldest group, 0, goes, half-way in
    assert cache.group_ids(A, 0) == [1, 2, 3] and cache.evicted_from(A, 0)
    cache.add(A, 0, obj(2, 100))  # and its rest is not kept
    assert cache.group(A, 0) is None
    for group in (1, 2, 3):
        cache.add(A, group, obj(1, 100))
    assert cache.group_ids(A, 0) == [2, 3]
    assert all(len(cache.group(A, g).objects) == 2 for g in (2, 3))  # type: ignore[union-attr]


def test_a_read_that_does_not_touch_leaves_the_order_alone() -> None:
    cost = 1000 + OBJECT_OVERHEAD
    cache = ObjectCache(2 * cost)
    cache.add(A, 0, obj(0, 1000))
    cache.add(A, 1, obj(0, 1000))
    assert cache.group(A, 0, touch=False) is not None
    cache.add(A, 2, obj(0, 1000))
    assert cache.group_ids(A, 0) == [1, 2]


def test_whole_groups_are_evicted_never_half_of_one() -> None:
    cache = ObjectCache(4 * (100 + OBJECT_OVERHEAD))
    for group in range(3):
        for object_id in range(2):
            cache.add(A, group, obj(object_id, 100))
    assert cache.group_ids(A, 0) == [1, 2]
    assert all(len(cache.group(A, g).objects) == 2 for g in (1, 2))  # type: ignore[union-attr]


def test_empty_objects_still_cost_and_oversized_ones_are_not_kept() -> None:
    cache = ObjectCache(10 * OBJECT_OVERHEAD)
    for group in range(50):
        cache.add(A, group, obj(0, 0))
    assert len(cache.group_ids(A, 0)) == 10
    cache.add(B, 0, obj(0, 10 * OBJECT_OVERHEAD))
    assert not cache.has_track(B)


def test_a_replaced_object_is_charged_once() -> None:
    cache = ObjectCache(1 << 20)
    cache.add(A, 0, obj(0, 500))
    cache.add(A, 0, obj(0, 300))
    assert cache.size == 300 + OBJECT_OVERHEAD
    assert cache.largest(A) == Location(0, 0)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([A, B]), st.integers(0, 20), st.integers(0, 5), st.integers(0, 3000)
        ),
        max_size=200,
    )
)
def test_never_over_budget_and_accounting_matches_contents(
    adds: list[tuple[FullTrackName, int, int, int]],
) -> None:
    budget = 20_000
    cache = ObjectCache(budget)
    for track, group, object_id, size in adds:
        cache.add(track, group, obj(object_id, size))
        assert cache.size <= budget
    held = sum(
        o.size + OBJECT_OVERHEAD
        for track in (A, B)
        for g in cache.group_ids(track, 0)
        for o in cache.group(track, g).objects.values()  # type: ignore[union-attr]
    )
    assert held == cache.size
