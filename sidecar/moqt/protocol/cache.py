"""An origin's object cache: every track's groups under one byte budget, evicted LRU by group.

``model.TrackCache`` holds one track's groups and answers range queries; an origin (a relay's
above all) carries many tracks, and a budget per track would let one busy track starve the
others or let many idle ones hold memory nobody reads. So the budget and the recency order are global here, keyed by
(track, group), and each ``TrackCache`` is only the per-track store.

A group counts as used when it begins (its first object) and whenever a reader takes it from
the cache, not each time one more of its objects arrives. A publisher writes several group
streams at once and QUIC interleaves them, so "latest object" would decide which of those
groups goes by which stream QUIC happened to serve last: the newest group could be evicted
half-way in (and the rest of it dropped) while older ones stayed. By when it began, the
oldest goes first and the newest stay whole. The price: a group that takes long to arrive
while many newer ones begin can be evicted before it is whole.

The cache also remembers what it evicted (the most recent ``MAX_EVICTION_RECORDS``): per
track the newest group, because a subscriber reading the cache behind the live edge must
know whether a group it has not read yet was lost rather than never published; and each
evicted group, so that the rest of a group evicted while its objects were still arriving is
not cached as if it were the whole group (a FETCH from the publisher may refill it whole).

Every object is charged ``OBJECT_OVERHEAD`` bytes on top of its payload, so a peer cannot fill
the cache with millions of empty status objects that weigh nothing.

A track this process writes itself (``Origin.open_local``: a publisher's own) is *pinned*: its
objects exist nowhere else, so the budget and the LRU order must not drop them for another
track's sake. A pinned track has a bound of its own, set by its writer, and leaves only when
its writer ``unpin``s it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from .model import FullTrackName, Group, Location, TrackCache, TrackObject

OBJECT_OVERHEAD = 128
MAX_EVICTION_RECORDS = 100_000

_GroupKey = tuple[FullTrackName, int]


class ObjectCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self.size = 0
        self._tracks: dict[FullTrackName, TrackCache] = {}
        self._groups: dict[FullTrackName, set[int]] = {}
        self._charged: OrderedDict[_GroupKey, int] = OrderedDict()  # oldest-touched first
        self._evicted: OrderedDict[FullTrackName, int] = OrderedDict()  # newest evicted group
        self._evicted_groups: OrderedDict[_GroupKey, None] = OrderedDict()
        self._pinned: set[FullTrackName] = set()

    def pin(self, track: FullTrackName, max_bytes: int) -> None:
        """Hold ``track`` outside the budget, in at most ``max_bytes`` (its oldest groups go
        first past that), until ``unpin``. A track already cached keeps nothing it had."""
        self.unpin(track)
        self._drop(track)
        self._tracks[track] = TrackCache(max_bytes)
        self._pinned.add(track)

    def unpin(self, track: FullTrackName) -> None:
        """Forget a pinned track and everything it holds."""
        if track in self._pinned:
            self._pinned.discard(track)
            self._tracks.pop(track, None)
            self._groups.pop(track, None)

    def track_bytes(self, track: FullTrackName) -> int:
        """Object bytes cached for ``track``."""
        cache = self._tracks.get(track)
        return cache.size if cache is not None else 0

    def add(
        self, track: FullTrackName, group_id: int, obj: TrackObject, *, refill: bool = False
    ) -> None:
        """Store an object; one larger than the whole budget is not stored, nor (unless it
        ``refill``s the group from a FETCH) one of a group that was evicted. A pinned track
        evicts only its own groups; an object larger than its bound raises ValueError."""
        if track in self._pinned:
            self._add_pinned(track, group_id, obj)
            return
        cost = obj.size + OBJECT_OVERHEAD
        key = (track, group_id)
        if cost > self.max_bytes or (not refill and key in self._evicted_groups):
            return
        self._evicted_groups.pop(key, None)
        cache = self._tracks.get(track)
        if cache is None:
            # Twice the budget: a track holds at most the budget before an add, plus one
            # object, so the per-track store never evicts by its own order; ours decides.
            cache = self._tracks[track] = TrackCache(2 * self.max_bytes)
        self._groups.setdefault(track, set()).add(group_id)
        group = cache.group(group_id)
        replaced = group.objects.get(obj.object_id) if group is not None else None
        cache.add(group_id, obj)
        extra = cost - (replaced.size + OBJECT_OVERHEAD if replaced is not None else 0)
        self._charged[key] = self._charged.get(key, 0) + extra
        self.size += extra
        self._evict()

    def _add_pinned(self, track: FullTrackName, group_id: int, obj: TrackObject) -> None:
        self._groups.setdefault(track, set()).add(group_id)
        for evicted in self._tracks[track].add(group_id, obj):
            self._groups[track].discard(evicted)
            self._evicted[track] = max(evicted, self._evicted.pop(track, -1))

    def mark_complete(self, track: FullTrackName, group_id: int) -> None:
        cache = self._tracks.get(track)
        if cache is not None:
            cache.mark_complete(group_id)

    def largest(self, track: FullTrackName) -> Location | None:
        cache = self._tracks.get(track)
        return cache.largest if cache is not None else None

    def group(self, track: FullTrackName, group_id: int, *, touch: bool = True) -> Group | None:
        """A cached group, marked as recently used unless ``touch`` is False (a read that
        serves nobody from the cache, such as the live path closing a stream)."""
        cache = self._tracks.get(track)
        group = cache.group(group_id) if cache is not None else None
        if group is not None and touch and track not in self._pinned:
            self._charged.move_to_end((track, group_id))
        return group

    def group_ids(self, track: FullTrackName, first: int, last: int | None = None) -> list[int]:
        """Cached group ids of ``track`` from ``first`` to ``last`` (inclusive), ascending."""
        return sorted(
            g for g in self._groups.get(track, ()) if g >= first and (last is None or g <= last)
        )

    def has_track(self, track: FullTrackName) -> bool:
        return track in self._tracks

    def tracks(self) -> list[FullTrackName]:
        """Every track with cached groups (pinned ones included)."""
        return list(self._tracks)

    def drop(self, track: FullTrackName) -> None:
        """Forget an unpinned track's groups (its retention is over); pinned ones stay."""
        if track not in self._pinned:
            self._drop(track)

    def objects(
        self, track: FullTrackName, start: Location, end: Location
    ) -> Iterator[tuple[int, TrackObject]]:
        """Cached objects from ``start`` to ``end`` inclusive, ascending."""
        cache = self._tracks.get(track)
        if cache is not None:
            yield from cache.objects(start, end)

    def evicted_from(self, track: FullTrackName, group_id: int) -> bool:
        """Whether a group at or after ``group_id`` of ``track`` was ever evicted."""
        return self._evicted.get(track, -1) >= group_id

    def _evict(self) -> None:
        while self.size > self.max_bytes:
            (track, group_id), _ = next(iter(self._charged.items()))
            self._tracks[track].discard(group_id)
            self._forget(track, group_id)
            self._evicted[track] = max(group_id, self._evicted.pop(track, -1))
            self._evicted_groups[(track, group_id)] = None
            for record in (self._evicted, self._evicted_groups):
                if len(record) > MAX_EVICTION_RECORDS:
                    record.popitem(last=False)

    def _drop(self, track: FullTrackName) -> None:
        """Forget every group of an unpinned track, as if each were evicted."""
        for group_id in list(self._groups.get(track, ())):
            self._tracks[track].discard(group_id)
            self._forget(track, group_id)

    def _forget(self, track: FullTrackName, group_id: int) -> None:
        self.size -= self._charged.pop((track, group_id), 0)
        groups = self._groups[track]
        groups.discard(group_id)
        if not groups:
            del self._groups[track]
            del self._tracks[track]
