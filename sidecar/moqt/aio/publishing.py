"""A process's tracks (`Publisher`, each a `PublishedTrack`), shared by all its sessions.

Serving them is not written here: the tracks are local tracks of a `protocol.origin.Origin`,
and every session hands that origin the peer's requests (see `api`), so a kvmoq publisher
answers exactly as a kvmoq relay (an origin too) does from what it holds. What the origin
cannot do, being sans-I/O, stays here: pacing a writer to the track's slowest subscriber
(`WRITE_BACKLOG`), and tracks made on first request (`Publisher.resolve`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sidecar.moqt.aio.quic_backend import MiB
from sidecar.moqt.protocol.errors import UsageError
from sidecar.moqt.protocol.model import FullTrackName, Location, TrackObject
from sidecar.moqt.protocol.origin import Origin
from sidecar.moqt.protocol.records import OriginLimits, Track

DEFAULT_TRACK_CACHE = 256 * MiB
WRITE_BACKLOG = 16 * MiB
"""Bytes that may wait for one subscriber of a track before `PublishedTrack.write` waits:
well under `OriginLimits.max_queued_bytes`, so a subscriber that keeps up with the network is
never sent to read the cache instead (which a bounded track cache could evict first)."""


class Publisher:
    """The tracks one process publishes, served to every session that reaches it.

    Serving is `protocol.origin`'s: the tracks are local tracks of an `Origin` that holds
    this process's sessions as peers, so a SUBSCRIBE, FETCH, TRACK_STATUS or
    SUBSCRIBE_NAMESPACE gets the answer a kvmoq relay gives, from the same code. `limits`
    bound what peers can make it hold (`OriginLimits`); each track's objects are bounded by its `cache_bytes`;
    `write_backlog` is how far a writer may run ahead of a track's slowest subscriber.
    """

    def __init__(
        self, limits: OriginLimits | None = None, *, write_backlog: int = WRITE_BACKLOG
    ) -> None:
        self.origin = Origin(limits)
        self.write_backlog = write_backlog
        self._tracks: dict[FullTrackName, PublishedTrack] = {}
        self._changed = asyncio.Event()

    def track(
        self,
        namespace: tuple[bytes, ...],
        name: bytes,
        *,
        cache_bytes: int = DEFAULT_TRACK_CACHE,
    ) -> PublishedTrack:
        """The track `namespace`/`name`, created on first use. The oldest groups past
        `cache_bytes` go: subscribers that had not read them end TOO_FAR_BEHIND."""
        full = FullTrackName(namespace, name)
        track = self._tracks.get(full)
        if track is None:
            track = PublishedTrack(self, self.origin.open_local(full, cache_bytes))
            self._tracks[full] = track
        return track

    def get(self, name: FullTrackName) -> PublishedTrack | None:
        """The track `name` if it is held now: a request for it is answered at once."""
        return self._tracks.get(name)

    async def resolve(self, name: FullTrackName) -> PublishedTrack | None:
        """A track `get` does not hold, made ready while the request for it waits.

        Sessions call this only after `get` missed, from a task of their own, so a publisher
        that must first produce a track (a KV track encoded on first request) does that work
        without holding up the event loop. The default holds nothing beyond `get`.
        """
        return self.get(name)

    def remove(self, namespace: tuple[bytes, ...]) -> None:
        """Withdraw every track of `namespace`, so a long-running process does not keep all it
        ever published: live subscriptions get PUBLISH_DONE (TRACK_ENDED), later requests
        find no track, and sessions that were told of the namespace hear it is gone."""
        for name in [name for name in self._tracks if name.namespace == namespace]:
            del self._tracks[name]
            self.origin.close_local(name)

    @property
    def namespaces(self) -> set[tuple[bytes, ...]]:
        return {name.namespace for name in self._tracks}

    def held_bytes(self, namespace: tuple[bytes, ...]) -> int:
        """Object bytes the tracks of `namespace` keep cached."""
        return self.origin.local_bytes(namespace)

    def notify(self) -> None:
        """A session's request was served, or a session's connection drained: what `until`
        waits for may hold now."""
        self._changed.set()

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait until `condition()` holds, checked at each `notify`."""
        while not condition():
            self._changed.clear()
            await self._changed.wait()


class PublishedTrack:
    """A track this process writes; `Publisher.origin` serves it to subscribers."""

    def __init__(self, publisher: Publisher, track: Track) -> None:
        self.name = track.name
        self._publisher = publisher
        self._track = track

    def put(
        self,
        group_id: int,
        object_id: int,
        payload: bytes,
        *,
        extensions: bytes = b"",
        end_of_group: bool = False,
    ) -> None:
        """Cache one object and send it to every live subscription.

        Locations must increase: within a group by object id, and a new group above the last.
        A group ends (its streams FIN) with `end_of_group` or when a later group begins.
        Never waits (see `write`): a subscriber that falls behind reads the cache instead.
        """
        if self.ended:
            raise UsageError(f"track {self.name} has ended")
        location = Location(group_id, object_id)
        if self.largest is not None and location <= self.largest:
            raise UsageError(f"{location} is not after the largest object {self.largest}")
        obj = TrackObject(object_id, payload, extensions=extensions)
        try:
            self._publisher.origin.write_local(
                self._track, group_id, obj, end_of_group=end_of_group
            )
        except ValueError as exc:  # an object bigger than the whole track cache
            raise UsageError(str(exc)) from None

    async def write(
        self,
        group_id: int,
        object_id: int,
        payload: bytes,
        *,
        extensions: bytes = b"",
        end_of_group: bool = False,
    ) -> None:
        """`put`, then wait while more than `Publisher.write_backlog` bytes wait for one of
        the track's subscribers: the writer goes at the pace of its slowest subscriber, as
        a live source with a bounded cache must (one gone for good stops counting when its
        session ends). Always yields to the event loop at least once."""
        self.put(group_id, object_id, payload, extensions=extensions, end_of_group=end_of_group)
        await asyncio.sleep(0)
        publisher, origin = self._publisher, self._publisher.origin
        await publisher.until(lambda: origin.queued_bytes(self._track) <= publisher.write_backlog)

    def end(self) -> None:
        """End the track: subscriptions get PUBLISH_DONE (TRACK_ENDED) once they have every
        object; it is still served from the cache until `Publisher.remove`."""
        self._publisher.origin.end_local(self._track)

    @property
    def largest(self) -> Location | None:
        """The last object written: the origin's record of the track holds it."""
        return self._track.largest

    @property
    def ended(self) -> bool:
        """`end` was called, or `Publisher.remove` withdrew the track: the origin that
        serves it holds it as ended."""
        return not self._track.local

    @property
    def subscribers(self) -> int:
        """Live subscriptions (on all sessions) to the track."""
        return len(self._track.subscribers)

    async def wait_subscribed(self) -> None:
        """Wait until someone subscribes."""
        await self._publisher.until(lambda: self.subscribers > 0)
