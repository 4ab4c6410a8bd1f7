"""Track model: names, locations, and the byte-accounted group cache."""

from __future__ import annotations

import pytest

from sidecar.moqt.protocol.model import (
    FullTrackName,
    Location,
    ObjectStatus,
    TrackCache,
    TrackObject,
)


def _obj(object_id: int, size: int, status: ObjectStatus = ObjectStatus.NORMAL) -> TrackObject:
    return TrackObject(object_id, b"x" * size, status)


def test_full_track_name_compares_bytes_and_prints_readably() -> None:
    name = FullTrackName((b"kvcache.moq.arpa/v1", b"m"), b"fp16")
    assert name == FullTrackName((b"kvcache.moq.arpa/v1", b"m"), b"fp16")
    assert name != FullTrackName((b"kvcache.moq.arpa/v1", b"M"), b"fp16")
    assert str(name) == "kvcache.moq.arpa/v1/m/fp16"
    assert len({name, FullTrackName(name.namespace, name.name)}) == 1


def test_cache_accounts_bytes_and_tracks_the_largest_location() -> None:
    cache = TrackCache(max_bytes=1000)
    cache.add(2, _obj(0, 100))
    cache.add(2, _obj(1, 50))
    cache.add(1, _obj(5, 10))
    assert cache.size == 160 and len(cache) == 2
    assert cache.largest == Location(2, 1)
    cache.add(2, _obj(1, 70))  # replacing an object replaces its bytes
    assert cache.size == 180
    cache.discard(2)
    assert cache.size == 10 and 2 not in cache


def test_cache_evicts_least_recently_used_whole_groups() -> None:
    cache = TrackCache(max_bytes=300)
    for group in range(3):
        cache.add(group, _obj(0, 100))
    cache.group(0)  # touch group 0: group 1 is now the oldest
    assert cache.add(3, _obj(0, 100)) == [1]
    assert sorted(g for g in range(4) if g in cache) == [0, 2, 3]
    assert cache.size == 300


def test_a_group_larger_than_the_cache_evicts_itself_last() -> None:
    cache = TrackCache(max_bytes=250)
    cache.add(0, _obj(0, 100))
    cache.add(1, _obj(0, 100))
    assert cache.add(1, _obj(1, 100)) == [0]
    assert cache.add(1, _obj(2, 100)) == [1]
    assert len(cache) == 0 and cache.size == 0
    with pytest.raises(ValueError):
        cache.add(0, _obj(0, 251))


def test_cache_range_and_completion() -> None:
    cache = TrackCache(max_bytes=10_000)
    for group in range(3):
        for object_id in range(3):
            cache.add(group, _obj(object_id, 1))
    cache.add(1, TrackObject(3, b"", ObjectStatus.END_OF_GROUP))
    cache.mark_complete(2)
    got = [(g, o.object_id) for g, o in cache.objects(Location(0, 2), Location(2, 0))]
    assert got == [(0, 2), (1, 0), (1, 1), (1, 2), (1, 3), (2, 0)]
    assert [cache.group(g).complete for g in range(3)] == [False, True, True]  # type: ignore[union-attr]
