"""Tracks, groups and objects as applications and relays hold them, with no wire format.

The session reports objects; what outlives a stream (a track's groups, a relay's cache) lives
here, so the relay's LRU cache and the KV publisher share one notion of a track.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum


@dataclass(frozen=True, order=True, slots=True)
class Location:
    """A (group, object) position in a track; compared lexicographically as the draft says."""

    group: int
    object: int


def has_prefix(namespace: tuple[bytes, ...], prefix: tuple[bytes, ...]) -> bool:
    """Whether ``prefix`` is a leading run of whole fields of ``namespace`` (() matches all)."""
    return namespace[: len(prefix)] == prefix


@dataclass(frozen=True, slots=True)
class FullTrackName:
    """A track's identity: the namespace tuple plus the track name, compared byte for byte."""

    namespace: tuple[bytes, ...]
    name: bytes

    def __str__(self) -> str:
        parts = [p.decode(errors="backslashreplace") for p in (*self.namespace, self.name)]
        return "/".join(parts)


class ObjectStatus(IntEnum):
    """Object status (draft-14 §Object Status); 0x2 is unused in -14."""

    NORMAL = 0x0
    DOES_NOT_EXIST = 0x1
    END_OF_GROUP = 0x3
    END_OF_TRACK = 0x4


class GroupOrder(IntEnum):
    PUBLISHER_DEFAULT = 0x0
    ASCENDING = 0x1
    DESCENDING = 0x2


def known_order(order: int) -> GroupOrder:
    """Replies may only say ascending or descending; anything else counts as ascending."""
    return GroupOrder.DESCENDING if order == GroupOrder.DESCENDING else GroupOrder.ASCENDING


@dataclass(frozen=True, slots=True)
class TrackObject:
    """One object as stored: the payload plus what a relay must forward untouched."""

    object_id: int
    payload: bytes
    status: ObjectStatus = ObjectStatus.NORMAL
    extensions: bytes = b""
    subgroup_id: int = 0
    publisher_priority: int = 128

    @property
    def size(self) -> int:
        return len(self.payload) + len(self.extensions)


@dataclass(slots=True)
class Group:
    """The objects of one group received so far, keyed by object id."""

    group_id: int
    objects: dict[int, TrackObject] = field(default_factory=dict)
    size: int = 0
    complete: bool = False

    def ordered(self) -> list[TrackObject]:
        return [self.objects[i] for i in sorted(self.objects)]


class TrackCache:
    """Groups of one track, oldest-touched first, with byte accounting.

    Eviction is by whole groups because a subscriber that joins mid-group cannot use half of
    one (a KV chunk is a group). ``max_bytes`` bounds what a peer can make us hold; adding an
    object that would exceed it evicts the least recently used groups other than its own.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self.size = 0
        self._groups: OrderedDict[int, Group] = OrderedDict()
        self.largest: Location | None = None

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, group_id: int) -> bool:
        return group_id in self._groups

    def add(self, group_id: int, obj: TrackObject) -> list[int]:
        """Store an object (replacing one with the same id); return the evicted group ids.

        Every returned group, possibly ``group_id`` itself, is gone from the cache.
        """
        if obj.size > self.max_bytes:
            raise ValueError(f"object of {obj.size} bytes exceeds the cache of {self.max_bytes}")
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = Group(group_id)
        self._groups.move_to_end(group_id)
        previous = group.objects.get(obj.object_id)
        if previous is not None:
            group.size -= previous.size
            self.size -= previous.size
        group.objects[obj.object_id] = obj
        group.size += obj.size
        self.size += obj.size
        if (
            obj.status in (ObjectStatus.END_OF_GROUP, ObjectStatus.END_OF_TRACK)
            and 0 in group.objects
        ):
            group.complete = True  # whole only from object 0: not a mid-group joiner's marker
        location = Location(group_id, obj.object_id)
        if self.largest is None or location > self.largest:
            self.largest = location
        return self._evict(keep=group_id)

    def mark_complete(self, group_id: int) -> None:
        """Record that a group has all its objects (its subgroup stream ended with FIN)."""
        group = self._groups.get(group_id)
        if group is not None:
            group.complete = True

    def group(self, group_id: int) -> Group | None:
        """A group, marked as recently used."""
        group = self._groups.get(group_id)
        if group is not None:
            self._groups.move_to_end(group_id)
        return group

    def objects(
        self, start: Location, end: Location | None = None
    ) -> Iterator[tuple[int, TrackObject]]:
        """Cached objects from ``start`` up to ``end`` inclusive, in ascending order."""
        for group_id in sorted(g for g in self._groups if g >= start.group):
            if end is not None and group_id > end.group:
                break
            for obj in self._groups[group_id].ordered():
                location = Location(group_id, obj.object_id)
                if location < start or (end is not None and location > end):
                    continue
                yield group_id, obj

    def discard(self, group_id: int) -> None:
        group = self._groups.pop(group_id, None)
        if group is not None:
            self.size -= group.size

    def _evict(self, keep: int) -> list[int]:
        """Drop least recently used groups; ``keep`` goes last, only if it alone is too big."""
        evicted: list[int] = []
        while self.size > self.max_bytes:
            victim = next((g for g in self._groups if g != keep), keep)
            self.discard(victim)
            evicted.append(victim)
        return evicted
