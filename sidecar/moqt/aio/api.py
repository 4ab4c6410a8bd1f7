"""The application API: publish tracks and push objects; subscribe, fetch and read objects.

The session answers nothing by itself and the transport only moves events, so this is where
a publisher's tracks meet its subscribers:

* `Publisher` holds a process's tracks (each a `PublishedTrack` with a bounded `TrackCache`),
  shared by all its sessions. `await track.write(...)` caches an object and sends it to every
  live subscription, then waits until every subscriber's connection has room (backpressure).
  SUBSCRIBE, FETCH and TRACK_STATUS from any peer are answered from these tracks: at once
  for a track the publisher holds, else after `Publisher.resolve` has made it, in a task.
* `Session` is one MoQT session as the application sees it: `subscribe`, `fetch`,
  `track_status` and `subscribe_namespace` return once the peer answered; objects, and the
  namespaces announced under a prefix, arrive through async iterators.

Draft-14 semantics kept as the draft says: SUBSCRIBE delivers only objects written after it
(from its start location on; use FETCH for what the publisher already holds); one subgroup
stream per group (a KV chunk), FIN when the next group starts or the group is declared ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from sidecar.moqt.aio import transport
from sidecar.moqt.aio.quic_backend import MiB, QuicSettings
from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol.errors import (
    FetchErrorCode,
    PublishDoneStatus,
    PublishErrorCode,
    SubscribeErrorCode,
    UsageError,
)
from sidecar.moqt.protocol.messages import (
    UNKNOWN_STREAM_COUNT,
    Fetch,
    FilterType,
    JoiningFetch,
    StandaloneFetch,
    Subscribe,
    SubscriptionFilter,
    fetch_end,
)
from sidecar.moqt.protocol.model import (
    FullTrackName,
    Location,
    ObjectStatus,
    TrackCache,
    TrackObject,
    has_prefix,
)
from sidecar.moqt.protocol.quirks import PeerQuirks
from sidecar.moqt.protocol.windows import joining_range, standalone_range, subscription_window

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_TRACK_CACHE = 256 * MiB
DEFAULT_RECEIVE_BUFFER = 256 * MiB
REQUEST_TIMEOUT = 10.0
MAX_PEER_NAMESPACES = 4096
"""Namespaces the peer announced that a session remembers for a later SUBSCRIBE_NAMESPACE
(the oldest forgotten first): moq-rs announces every broadcast right after setup, unasked."""


class MoqtApiError(Exception):
    """Base of the errors this API raises to applications."""


class RequestRefused(MoqtApiError):
    """The peer answered a request with *_ERROR."""

    def __init__(self, request: str, code: int, reason: str) -> None:
        super().__init__(f"{request} refused: {reason or 'no reason'} (code {code:#x})")
        self.request = request
        self.code = code
        self.reason = reason


class SessionGone(MoqtApiError, ConnectionError):
    """The session closed while a request or a stream of objects was still open."""


class ReceiveOverflow(MoqtApiError):
    """The application read objects slower than they came and the buffer bound was reached."""


@dataclass(frozen=True, slots=True)
class Object:
    """One object as the application reads it."""

    group_id: int
    object_id: int
    payload: bytes
    extensions: bytes = b""
    status: ObjectStatus = ObjectStatus.NORMAL

    @property
    def location(self) -> Location:
        return Location(self.group_id, self.object_id)


@dataclass(frozen=True, slots=True)
class Announcement:
    """A namespace the peer announced (PUBLISH_NAMESPACE) or withdrew (PUBLISH_NAMESPACE_DONE)."""

    namespace: tuple[bytes, ...]
    published: bool


@dataclass(frozen=True, slots=True)
class TrackStatus:
    """TRACK_STATUS_OK: the newest object the publisher has (None: nothing yet)."""

    largest: Location | None


# Publishing -----------------------------------------------------------------------------


class Publisher:
    """The tracks one process publishes, looked up by every session that serves them."""

    def __init__(self) -> None:
        self._tracks: dict[FullTrackName, PublishedTrack] = {}

    def track(
        self,
        namespace: tuple[bytes, ...],
        name: bytes,
        *,
        cache_bytes: int = DEFAULT_TRACK_CACHE,
        extensions: bool = False,
    ) -> PublishedTrack:
        """The track `namespace`/`name`, created on first use."""
        full = FullTrackName(namespace, name)
        track = self._tracks.get(full)
        if track is None:
            track = self._tracks[full] = PublishedTrack(full, cache_bytes, extensions)
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

    async def remove(self, namespace: tuple[bytes, ...]) -> None:
        """Withdraw every track of `namespace`, so a long-running process does not keep all it
        ever published: live subscriptions get PUBLISH_DONE (TRACK_ENDED), later requests
        find no track."""
        for name in [name for name in self._tracks if name.namespace == namespace]:
            await self._tracks.pop(name).end()

    @property
    def namespaces(self) -> set[tuple[bytes, ...]]:
        return {name.namespace for name in self._tracks}

    def held_bytes(self, namespace: tuple[bytes, ...]) -> int:
        """Object bytes the tracks of `namespace` keep cached."""
        return sum(
            track.cache.size for name, track in self._tracks.items() if name.namespace == namespace
        )


class PublishedTrack:
    """A track this process produces: its cached objects and its live subscriptions."""

    def __init__(self, name: FullTrackName, cache_bytes: int, extensions: bool) -> None:
        self.name = name
        self.cache = TrackCache(cache_bytes)
        self.extensions = extensions
        self.ended = False
        self._deliveries: set[_Delivery] = set()
        self._subscribed = asyncio.Event()

    @property
    def largest(self) -> Location | None:
        return self.cache.largest

    async def write(
        self,
        group_id: int,
        object_id: int,
        payload: bytes,
        *,
        extensions: bytes = b"",
        end_of_group: bool = False,
    ) -> None:
        """Cache one object, send it to every live subscription, then wait for room.

        Locations must increase: within a group by object id, and a new group above the last.
        `end_of_group` closes the group's streams (the next object must be in a later group).
        """
        if self.ended:
            raise UsageError(f"track {self.name} has ended")
        location = Location(group_id, object_id)
        if self.largest is not None and location <= self.largest:
            raise UsageError(f"{location} is not after the largest object {self.largest}")
        if extensions and not self.extensions:
            raise UsageError("this track was created without extensions")
        try:
            self.cache.add(group_id, TrackObject(object_id, payload, extensions=extensions))
        except ValueError as exc:  # an object bigger than the whole cache
            raise UsageError(str(exc)) from None
        if end_of_group:
            self.cache.mark_complete(group_id)
        for delivery in list(self._deliveries):
            delivery.send(group_id, object_id, payload, extensions, end_of_group)
        await self._drain()

    async def end(self) -> None:
        """End the track: every subscription gets PUBLISH_DONE (TRACK_ENDED)."""
        self.ended = True
        for delivery in list(self._deliveries):
            delivery.finish(PublishDoneStatus.TRACK_ENDED, "track ended")
        await self._drain()

    async def _drain(self) -> None:
        # One slow subscriber holds the producer back: the bound is per connection, and a
        # KV cache that one decoder cannot take in time is better recomputed than dropped.
        connections = {d.connection for d in self._deliveries}
        if not connections:
            await asyncio.sleep(0)  # a producer with no audience still lets the loop run
        for connection in connections:
            try:
                await connection.drain()
            except ConnectionError:
                for delivery in [d for d in self._deliveries if d.connection is connection]:
                    delivery.drop()

    @property
    def subscribers(self) -> int:
        """Live subscriptions (on all sessions) that receive what `write` sends."""
        return len(self._deliveries)

    async def wait_subscribed(self) -> None:
        """Wait until someone subscribes: SUBSCRIBE delivers only objects written after it."""
        await self._subscribed.wait()

    def attach(self, delivery: _Delivery) -> None:
        """A session serves this track to one more subscription."""
        self._deliveries.add(delivery)
        self._subscribed.set()

    def detach(self, delivery: _Delivery) -> None:
        self._deliveries.discard(delivery)
        if not self._deliveries:
            self._subscribed.clear()


class _Delivery:
    """One peer's subscription to one of our tracks: a filter and the current group's stream."""

    def __init__(
        self,
        session: Session,
        track: PublishedTrack,
        request_id: int,
        start: Location,
        end_group: int | None,
    ) -> None:
        self.session = session
        self.connection = session.connection
        self.track = track
        self.request_id = request_id
        self.start = start
        self.end_group = end_group
        self._stream: int | None = None
        self._group: int | None = None

    def send(
        self, group_id: int, object_id: int, payload: bytes, extensions: bytes, end: bool
    ) -> None:
        if Location(group_id, object_id) < self.start:
            return
        if self.end_group is not None and group_id > self.end_group:
            self.finish(PublishDoneStatus.SUBSCRIPTION_ENDED, "range delivered")
            return
        if not self._writable():
            return
        moqt = self.connection.moqt
        if self._group != group_id:
            self._end_stream()
            self._stream = moqt.open_subgroup(
                self.request_id, group_id, extensions=self.track.extensions
            )
            self._group = group_id
        assert self._stream is not None
        moqt.send_object(self._stream, object_id, payload, extensions=extensions, end_stream=end)
        if end:
            self._stream = None
            if group_id == self.end_group:
                self.finish(PublishDoneStatus.SUBSCRIPTION_ENDED, "range delivered")
        self.connection.transmit()

    def replay(self) -> None:
        """Send every object the track still caches, each complete group FINed: what a
        subscription from a peer that needs history gets first (`quirks.PeerQuirks`)."""
        cached = list(self.track.cache.objects(Location(0, 0)))
        for index, (group_id, obj) in enumerate(cached):
            last = index + 1 == len(cached) or cached[index + 1][0] != group_id
            group = self.track.cache.group(group_id) if last else None
            end = group is not None and group.complete
            self.send(group_id, obj.object_id, obj.payload, obj.extensions, end)

    def finish(self, status: PublishDoneStatus, reason: str) -> None:
        """FIN the open stream and send PUBLISH_DONE."""
        if not self._writable():
            return
        self._end_stream()
        self.connection.moqt.publish_done(self.request_id, status, reason)
        self.connection.transmit()
        self.drop()

    def drop(self) -> None:
        self.track.detach(self)
        self.session.forget(self)

    def cancel(self) -> None:
        """The subscriber left (UNSUBSCRIBE): reset the stream in flight, send nothing more."""
        if self._stream is not None and self._writable():
            self.connection.moqt.reset_stream(self._stream)
            self._stream = None
        self.drop()

    def _writable(self) -> bool:
        """False (and the delivery dropped) once the connection is closing: from then on
        qh3 raises on writes and aioquic discards them, before the session hears of it."""
        if self.connection.closing:
            self.drop()
            return False
        return True

    def _end_stream(self) -> None:
        if self._stream is not None:
            self.connection.moqt.end_stream(self._stream)
            self._stream = None


# Receiving ------------------------------------------------------------------------------


class _Queue(Generic[T]):
    """What arrived for the application and waits to be read: an async iterator that stops
    once ended, and raises the error it failed with (dropping what was unread)."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._wakeup = asyncio.Event()
        self._error: BaseException | None = None
        self._ended = False

    def put(self, item: T) -> bool:
        """Queue an item; False if the queue refused it (and failed: see _ObjectQueue)."""
        self._items.append(item)
        self._wakeup.set()
        return True

    def end(self) -> None:
        self._ended = True
        self._wakeup.set()

    def fail(self, error: BaseException) -> None:
        if self._error is None and not self._ended:
            self._error = error
            self._items.clear()
        self._wakeup.set()

    @property
    def finished(self) -> bool:
        return self._ended or self._error is not None

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        while not self._items:
            if self._error is not None:
                raise self._error
            if self._ended:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._items.popleft()


class _ObjectQueue(_Queue[Object]):
    """Objects of one subscription or fetch, waiting for the application; bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__()
        self._bytes = 0
        self._max_bytes = max_bytes

    def put(self, item: Object) -> bool:
        """Queue an object; False (and the queue fails) when the bound is exceeded."""
        self._bytes += len(item.payload)
        if self._bytes > self._max_bytes:
            self.fail(ReceiveOverflow(f"more than {self._max_bytes} bytes unread"))
            return False
        return super().put(item)

    async def __anext__(self) -> Object:
        obj = await super().__anext__()
        self._bytes -= len(obj.payload)
        return obj


class Subscription(_ObjectQueue):
    """A SUBSCRIBE the peer accepted: iterate to read objects; ends after PUBLISH_DONE.

    The iteration ends once PUBLISH_DONE came and as many data streams as it counts have
    ended, so objects on streams that overtake nothing are never cut off.
    """

    def __init__(self, session: Session, request_id: int, track: FullTrackName) -> None:
        super().__init__(session.receive_buffer)
        self.session = session
        self.request_id = request_id
        self.track = track
        self.largest: Location | None = None
        self.done_status: int | None = None
        self._streams_open: set[int] = set()
        self._streams_ended = 0
        self._expected_streams: int | None = None

    async def unsubscribe(self) -> None:
        """Stop the subscription; objects already queued can still be read."""
        if not self.finished:
            self.session.cancel(self)
            self.end()

    def _object(self, event: ev.ObjectReceived) -> None:
        if event.stream_id is not None and event.stream_id not in self._streams_open:
            self._streams_open.add(event.stream_id)
        self.put(_object_of(event))

    def _stream_over(self, stream_id: int) -> None:
        self._streams_open.discard(stream_id)
        self._streams_ended += 1
        self._maybe_end()

    def _publish_done(self, event: ev.SubscriptionEnded) -> None:
        self.done_status = event.message.status_code
        count = event.message.stream_count
        self._expected_streams = None if count == UNKNOWN_STREAM_COUNT else count
        self._maybe_end()

    def _maybe_end(self) -> None:
        if self.done_status is None or self._streams_open:
            return
        if self._expected_streams is None or self._streams_ended >= self._expected_streams:
            self.session.forget(self)
            self.end()


class FetchStream(_ObjectQueue):
    """A FETCH the peer accepted: iterate to read the objects; ends with the fetch stream."""

    def __init__(self, session: Session, request_id: int) -> None:
        super().__init__(session.receive_buffer)
        self.session = session
        self.request_id = request_id
        self.end_location: Location | None = None
        """FETCH_OK's End Location, in FETCH's encoding: the last object + 1 (0: whole group)."""

    async def cancel(self) -> None:
        if not self.finished:
            self.session.cancel(self)
            self.end()


class NamespaceSubscription(_Queue[Announcement]):
    """A SUBSCRIBE_NAMESPACE the peer accepted: iterate to read the announcements of the
    namespaces under its prefix, those already published first; ends after `unsubscribe`.

    Not bounded in bytes like the object queues: announcements are small, and the peer (a
    relay) bounds how many namespaces it routes.
    """

    def __init__(self, session: Session, request_id: int, prefix: tuple[bytes, ...]) -> None:
        super().__init__()
        self.session = session
        self.request_id = request_id
        self.prefix = prefix

    def covers(self, namespace: tuple[bytes, ...]) -> bool:
        return has_prefix(namespace, self.prefix)

    async def unsubscribe(self) -> None:
        """UNSUBSCRIBE_NAMESPACE; announcements already queued can still be read."""
        if not self.finished:
            self.session.cancel(self)
            self.end()


def _object_of(event: ev.ObjectReceived) -> Object:
    return Object(event.group_id, event.object_id, event.payload, event.extensions, event.status)


# The session ----------------------------------------------------------------------------


class Session:
    """One MoQT session for an application: requests it makes, and tracks it serves."""

    def __init__(
        self,
        connection: transport.MoqtConnection,
        publisher: Publisher | None = None,
        *,
        receive_buffer: int = DEFAULT_RECEIVE_BUFFER,
    ) -> None:
        self.connection = connection
        self.publisher = publisher or Publisher()
        self.receive_buffer = receive_buffer
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._subscriptions: dict[int, Subscription] = {}
        self._fetches: dict[int, FetchStream] = {}
        self._namespace_subscriptions: dict[int, NamespaceSubscription] = {}
        self._peer_namespaces: OrderedDict[tuple[bytes, ...], None] = OrderedDict()
        """Announced by the peer and not withdrawn, as far as this session still hears."""
        self._deliveries: dict[int, _Delivery] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        """Work for a peer's request (a track being resolved, a fetch being sent), by id."""

    # Requests ---------------------------------------------------------------------------

    async def subscribe(
        self,
        track: FullTrackName,
        *,
        start: Location | None = None,
        end_group: int | None = None,
    ) -> Subscription:
        """Subscribe from the next object (default), from `start`, or for start..end_group."""
        if start is None:
            if end_group is not None:
                raise UsageError("a range subscription needs a start")
            filt = SubscriptionFilter()
        elif end_group is None:
            filt = SubscriptionFilter(FilterType.ABSOLUTE_START, start)
        else:
            filt = SubscriptionFilter(FilterType.ABSOLUTE_RANGE, start, end_group)
        request_id = self.connection.moqt.subscribe(track, filter=filt)
        subscription = self._subscriptions[request_id] = Subscription(self, request_id, track)
        reply = await self._await_reply(request_id, self._subscriptions)
        subscription.largest = reply.largest
        return subscription

    async def fetch(
        self,
        track: FullTrackName,
        start: Location,
        end_group: int,
        end_object: int | None = None,
    ) -> FetchStream:
        """Fetch what the publisher holds from `start` to (end_group, end_object) inclusive."""
        target = StandaloneFetch(track, start, end_group, end_object)
        request_id = self.connection.moqt.fetch(target)
        fetch = self._fetches[request_id] = FetchStream(self, request_id)
        reply = await self._await_reply(request_id, self._fetches)
        fetch.end_location = reply.end
        return fetch

    async def track_status(self, track: FullTrackName) -> TrackStatus:
        request_id = self.connection.moqt.track_status(track)
        reply = await self._await_reply(request_id)
        return TrackStatus(reply.largest)

    async def publish_namespace(self, namespace: tuple[bytes, ...]) -> None:
        """Announce a namespace (to a relay), so subscribers are routed to this session."""
        request_id = self.connection.moqt.publish_namespace(namespace)
        await self._await_reply(request_id)

    def publish_namespace_done(self, namespace: tuple[bytes, ...]) -> None:
        """Withdraw an announced namespace: the relay stops routing requests for it here."""
        self.connection.moqt.publish_namespace_done(namespace)
        self.connection.transmit()

    async def subscribe_namespace(self, prefix: tuple[bytes, ...]) -> NamespaceSubscription:
        """Hear of every namespace published under `prefix` (a relay's publishers), and of
        its withdrawal, until `unsubscribe`. Announcements that come before the peer's OK
        are kept, so none is missed."""
        request_id = self.connection.moqt.subscribe_namespace(prefix)
        subscription = NamespaceSubscription(self, request_id, prefix)
        for namespace in self._peer_namespaces:  # announced before we asked (moq-rs)
            if subscription.covers(namespace):
                subscription.put(Announcement(namespace, published=True))
        self._namespace_subscriptions[request_id] = subscription
        await self._await_reply(request_id, self._namespace_subscriptions)
        return subscription

    def cancel(self, request: Subscription | FetchStream | NamespaceSubscription) -> None:
        """Tell the peer to stop serving ``request`` (UNSUBSCRIBE, FETCH_CANCEL,
        UNSUBSCRIBE_NAMESPACE) and forget it; what its queue holds can still be read."""
        moqt = self.connection.moqt
        if isinstance(request, Subscription):
            moqt.unsubscribe(request.request_id)
        elif isinstance(request, FetchStream):
            moqt.fetch_cancel(request.request_id)
        else:
            moqt.unsubscribe_namespace(request.prefix)
            self._forget_namespaces_under(request.prefix)
        self.forget(request)
        self.connection.transmit()

    def forget(
        self, request: Subscription | FetchStream | NamespaceSubscription | _Delivery
    ) -> None:
        """Stop routing events to a request that is over (ours, or the peer's to us)."""
        registry: dict[int, Any] = (
            self._subscriptions
            if isinstance(request, Subscription)
            else self._fetches
            if isinstance(request, FetchStream)
            else self._deliveries
            if isinstance(request, _Delivery)
            else self._namespace_subscriptions
        )
        if registry.get(request.request_id) is request:
            del registry[request.request_id]

    async def _await_reply(self, request_id: int, registry: dict[int, Any] | None = None) -> Any:
        """The peer's *_OK message; RequestRefused on *_ERROR, SessionGone if it closes."""
        future = self._replies[request_id] = asyncio.get_running_loop().create_future()
        self.connection.transmit()
        try:
            return await asyncio.wait_for(future, REQUEST_TIMEOUT)
        except BaseException:
            if registry is not None:
                registry.pop(request_id, None)
            raise
        finally:
            self._replies.pop(request_id, None)

    # Events -----------------------------------------------------------------------------

    def handle(self, event: ev.MoqtEvent) -> None:
        """The transport's event callback for this session."""
        handler = self._HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _on_object(self, event: ev.ObjectReceived) -> None:
        if event.source is ev.ObjectSource.FETCH:
            fetch = self._fetches.get(event.request_id)
            if fetch is not None and not fetch.put(_object_of(event)):
                self.cancel(fetch)  # overflowed: failed already
            return
        subscription = self._subscriptions.get(event.request_id)
        if subscription is not None:
            subscription._object(event)
            if subscription.finished:  # overflowed
                self.cancel(subscription)

    def _on_stream_over(self, event: ev.DataStreamEnded | ev.DataStreamReset) -> None:
        fetch = self._fetches.get(event.request_id)
        if fetch is not None:
            self._fetches.pop(event.request_id)
            if isinstance(event, ev.DataStreamReset):
                fetch.fail(SessionGone(f"fetch stream reset (code {event.error_code:#x})"))
            else:
                fetch.end()
            return
        subscription = self._subscriptions.get(event.request_id)
        if subscription is not None:
            subscription._stream_over(event.stream_id)

    def _on_subscription_ended(self, event: ev.SubscriptionEnded) -> None:
        subscription = self._subscriptions.get(event.request_id)
        if subscription is not None:
            subscription._publish_done(event)

    def _on_accepted(self, event: ev.RequestAccepted) -> None:
        future = self._replies.get(event.request_id)
        if future is not None and not future.done():
            future.set_result(event.message)

    def _on_rejected(self, event: ev.RequestRejected) -> None:
        future = self._replies.get(event.request_id)
        if future is not None and not future.done():
            name = type(event.message).__name__.removesuffix("Error")
            future.set_exception(
                RequestRefused(name, event.message.error_code, event.message.reason)
            )
        self._subscriptions.pop(event.request_id, None)
        self._fetches.pop(event.request_id, None)
        self._namespace_subscriptions.pop(event.request_id, None)

    def _on_closed(self, event: ev.SessionClosed) -> None:
        gone = SessionGone(f"session closed: {event.reason or 'no reason'} ({event.error_code:#x})")
        for future in self._replies.values():
            if not future.done():
                future.set_exception(gone)
        queues: list[_Queue[Any]] = [
            *self._subscriptions.values(),
            *self._fetches.values(),
            *self._namespace_subscriptions.values(),
        ]
        for queue in queues:
            queue.fail(gone)
        self._subscriptions.clear()
        self._fetches.clear()
        self._namespace_subscriptions.clear()
        for delivery in list(self._deliveries.values()):
            delivery.drop()
        for task in list(self._tasks.values()):
            task.cancel()

    # Serving our tracks -----------------------------------------------------------------

    def _with_track(
        self,
        request_id: int,
        name: FullTrackName,
        answer: Callable[[PublishedTrack | None], None],
        internal_error: int,
    ) -> None:
        """Answer a peer's request for one of our tracks: at once when the publisher holds it,
        else once `Publisher.resolve` has made it, while this and other sessions go on being
        served. UNSUBSCRIBE, FETCH_CANCEL or the session's end cancel the wait (the
        publisher's work goes on: another request may be waiting for the same track)."""
        track = self.publisher.get(name)
        if track is not None:
            answer(track)
            self.connection.transmit()
        else:
            self._spawn(request_id, self._resolve_then(request_id, name, answer, internal_error))

    async def _resolve_then(
        self,
        request_id: int,
        name: FullTrackName,
        answer: Callable[[PublishedTrack | None], None],
        internal_error: int,
    ) -> None:
        try:
            track = await self.publisher.resolve(name)
        except Exception:
            logger.exception("resolving %s failed", name)  # the peer hears no details
            if not self.connection.closing:
                self.connection.moqt.reject(request_id, internal_error, "track unavailable")
                self.connection.transmit()
            return
        if not self.connection.closing:
            answer(track)
            self.connection.transmit()

    def _spawn(self, request_id: int, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` for request `request_id`, cancelled if the request or session ends."""
        task = asyncio.ensure_future(work)
        self._tasks[request_id] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._tasks.get(request_id) is done:  # not the task that replaced it
                del self._tasks[request_id]

        task.add_done_callback(forget)

    def _cancel_task(self, request_id: int) -> None:
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()

    def _on_subscribe(self, event: ev.SubscribeRequested) -> None:
        message = event.message
        self._with_track(
            message.request_id,
            message.track,
            lambda track: self._answer_subscribe(message, track),
            SubscribeErrorCode.INTERNAL_ERROR,
        )

    def _answer_subscribe(self, message: Subscribe, track: PublishedTrack | None) -> None:
        moqt = self.connection.moqt
        if track is None:
            moqt.reject(
                message.request_id, SubscribeErrorCode.TRACK_DOES_NOT_EXIST, "no such track"
            )
            return
        start, end_group = subscription_window(message.filter, track.largest)
        replay = PeerQuirks.of(moqt.peer_parameters).replays_history
        if replay:
            start, end_group = Location(0, 0), None
        moqt.subscribe_ok(message.request_id, largest=track.largest)
        delivery = _Delivery(self, track, message.request_id, start, end_group)
        self._deliveries[message.request_id] = delivery
        if replay:
            delivery.replay()
        past_range = end_group is not None and track.largest and end_group < track.largest.group
        if track.ended or past_range:
            delivery.finish(PublishDoneStatus.SUBSCRIPTION_ENDED, "nothing left to deliver")
        else:
            track.attach(delivery)

    def _on_subscribe_updated(self, event: ev.SubscribeUpdated) -> None:
        delivery = self._deliveries.get(event.message.subscription_request_id)
        if delivery is not None:  # an update only narrows
            delivery.start = max(delivery.start, event.message.start)
            delivery.end_group = event.message.end_group

    def _on_unsubscribed(self, event: ev.Unsubscribed) -> None:
        self._cancel_task(event.request_id)
        delivery = self._deliveries.get(event.request_id)
        if delivery is not None:
            delivery.cancel()
            self.connection.transmit()

    def _on_track_status(self, event: ev.TrackStatusRequested) -> None:
        message = event.message
        self._with_track(
            message.request_id,
            message.track,
            lambda track: self._answer_track_status(message.request_id, track),
            SubscribeErrorCode.INTERNAL_ERROR,
        )

    def _answer_track_status(self, request_id: int, track: PublishedTrack | None) -> None:
        if track is None:
            self.connection.moqt.reject(
                request_id, SubscribeErrorCode.TRACK_DOES_NOT_EXIST, "no such track"
            )
        else:
            self.connection.moqt.track_status_ok(request_id, largest=track.largest)

    def _on_fetch(self, event: ev.FetchRequested) -> None:
        message = event.message
        self._with_track(
            message.request_id,
            event.track,
            lambda track: self._answer_fetch(message, track),
            FetchErrorCode.INTERNAL_ERROR,
        )

    def _answer_fetch(self, message: Fetch, track: PublishedTrack | None) -> None:
        moqt = self.connection.moqt
        if track is None:
            moqt.reject(message.request_id, FetchErrorCode.TRACK_DOES_NOT_EXIST, "no such track")
            return
        window = self._fetch_window(message.target)
        objects = [] if window is None else list(track.cache.objects(*window))
        if not objects:
            moqt.reject(message.request_id, FetchErrorCode.NO_OBJECTS, "nothing in range")
            return
        group_id, last = objects[-1]
        final = Location(group_id, last.object_id)
        moqt.fetch_ok(
            message.request_id,
            fetch_end(objects),
            end_of_track=track.ended and final == track.largest,
        )
        self._spawn(message.request_id, self._serve_fetch(message.request_id, objects))

    def _fetch_window(
        self, target: StandaloneFetch | JoiningFetch
    ) -> tuple[Location, Location] | None:
        if isinstance(target, StandaloneFetch):
            return standalone_range(target)
        joined = self._deliveries.get(target.joining_request_id)
        return None if joined is None else joining_range(target, joined.start)

    async def _serve_fetch(self, request_id: int, objects: list[tuple[int, TrackObject]]) -> None:
        moqt = self.connection.moqt
        stream = moqt.open_fetch_stream(request_id)
        try:
            for group_id, obj in objects:
                moqt.send_fetch_object(
                    stream,
                    group_id,
                    obj.subgroup_id,
                    obj.object_id,
                    obj.payload,
                    publisher_priority=obj.publisher_priority,
                    status=obj.status,
                    extensions=obj.extensions,
                )
                self.connection.transmit()
                await self.connection.drain()
            moqt.end_stream(stream)
            self.connection.transmit()
        except ConnectionError:
            pass  # the session is gone; nothing left to tell

    def _on_fetch_cancelled(self, event: ev.FetchCancelled) -> None:
        self._cancel_task(event.request_id)

    def _on_publish_offered(self, event: ev.PublishRequested) -> None:
        # This endpoint subscribes explicitly; tracks pushed at it are declined.
        self.connection.moqt.reject(
            event.message.request_id, PublishErrorCode.NOT_SUPPORTED, "PUBLISH not accepted"
        )
        self.connection.transmit()

    def _on_namespace_published(self, event: ev.NamespacePublished) -> None:
        self.connection.moqt.publish_namespace_ok(event.message.request_id)
        self.connection.transmit()
        namespace = event.message.namespace
        if namespace in self._peer_namespaces:  # already announced (a relay repeats them)
            self._peer_namespaces.move_to_end(namespace)
            return
        self._peer_namespaces[namespace] = None
        if len(self._peer_namespaces) > MAX_PEER_NAMESPACES:
            self._peer_namespaces.popitem(last=False)
        self._announce(Announcement(namespace, published=True))

    def _on_namespace_done(self, event: ev.NamespacePublishDone) -> None:
        self._peer_namespaces.pop(event.namespace, None)
        self._announce(Announcement(event.namespace, published=False))

    def _forget_namespaces_under(self, prefix: tuple[bytes, ...]) -> None:
        """After UNSUBSCRIBE_NAMESPACE a relay no longer says when those are withdrawn."""
        for namespace in [ns for ns in self._peer_namespaces if has_prefix(ns, prefix)]:
            if not any(sub.covers(namespace) for sub in self._namespace_subscriptions.values()):
                del self._peer_namespaces[namespace]

    def _announce(self, announcement: Announcement) -> None:
        for subscription in self._namespace_subscriptions.values():
            if subscription.covers(announcement.namespace):
                subscription.put(announcement)

    def _on_namespace_subscribe(self, event: ev.NamespaceSubscribeRequested) -> None:
        # moq-rs subscribes to every namespace right after setup; accepting costs nothing.
        self.connection.moqt.subscribe_namespace_ok(event.message.request_id)
        self.connection.transmit()

    _HANDLERS: ClassVar[dict[type, Callable[[Session, Any], None]]] = {
        ev.ObjectReceived: _on_object,
        ev.DataStreamEnded: _on_stream_over,
        ev.DataStreamReset: _on_stream_over,
        ev.SubscriptionEnded: _on_subscription_ended,
        ev.RequestAccepted: _on_accepted,
        ev.RequestRejected: _on_rejected,
        ev.SessionClosed: _on_closed,
        ev.SubscribeRequested: _on_subscribe,
        ev.SubscribeUpdated: _on_subscribe_updated,
        ev.Unsubscribed: _on_unsubscribed,
        ev.TrackStatusRequested: _on_track_status,
        ev.FetchRequested: _on_fetch,
        ev.FetchCancelled: _on_fetch_cancelled,
        ev.PublishRequested: _on_publish_offered,
        ev.NamespacePublished: _on_namespace_published,
        ev.NamespacePublishDone: _on_namespace_done,
        ev.NamespaceSubscribeRequested: _on_namespace_subscribe,
    }


# Entry points ---------------------------------------------------------------------------


def _sessions(
    publisher: Publisher | None,
    on_session: Callable[[Session], None] | None,
    receive_buffer: int,
) -> transport.OnSession:
    def create(connection: transport.MoqtConnection) -> transport.MoqtEventHandler:
        session = Session(connection, publisher, receive_buffer=receive_buffer)
        if on_session is not None:
            on_session(session)
        return session.handle

    return create


@asynccontextmanager
async def connect(
    url: str,
    settings: QuicSettings,
    *,
    publisher: Publisher | None = None,
    receive_buffer: int = DEFAULT_RECEIVE_BUFFER,
) -> AsyncIterator[Session]:
    """A session to a MoQT server or relay at `url` (moqt://host:port/path).

    `publisher`'s tracks are served to the peer; `receive_buffer` bounds the unread bytes of
    each subscription and fetch.
    """
    sessions: list[Session] = []
    on_session = _sessions(publisher, sessions.append, receive_buffer)
    async with transport.connect(url, settings, on_session):
        yield sessions[0]


async def serve(
    host: str,
    port: int,
    settings: QuicSettings,
    *,
    cert: Path,
    key: Path,
    publisher: Publisher | None = None,
    on_session: Callable[[Session], None] | None = None,
    receive_buffer: int = DEFAULT_RECEIVE_BUFFER,
) -> transport.MoqtServer:
    """Accept sessions that may subscribe to and fetch from `publisher`'s tracks."""
    sessions = _sessions(publisher, on_session, receive_buffer)
    return await transport.serve(host, port, settings, sessions, cert=cert, key=key)
