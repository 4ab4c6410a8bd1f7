"""The application API: publish tracks and push objects; subscribe, fetch and read objects.

The session answers nothing by itself and the transport only moves events, so this is where
a process's tracks meet its subscribers, and its own requests meet their answers:

* `Publisher` holds a process's tracks (each a `PublishedTrack`), shared by all its
  sessions. `track.put(...)` caches an object and sends it to every live subscription.
  Serving them is not written here: the tracks are local tracks of a `relay.core.Relay`,
  and every session hands that core the peer's SUBSCRIBE, FETCH, TRACK_STATUS and
  SUBSCRIBE_NAMESPACE, so a kvmoq publisher answers exactly as a kvmoq relay does (cached
  objects from an absolute start, FETCH from the cache, PUBLISH_NAMESPACE and PUBLISH to a
  namespace subscriber). `await track.write(...)` also paces the writer to the track's
  slowest subscriber (`WRITE_BACKLOG`). What the core
  cannot do, being sans-I/O, stays here: a request for a track the publisher does not hold
  yet waits for `Publisher.resolve` in a task, and is handed on once it is made.
* `Session` is one MoQT session as the application sees it: `subscribe`, `fetch`,
  `track_status` and `subscribe_namespace` return once the peer answered; objects, and the
  namespaces announced under a prefix, arrive through async iterators.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from sidecar.moqt.aio import transport
from sidecar.moqt.aio.peer_link import ConnectionLink
from sidecar.moqt.aio.quic_backend import MiB, QuicSettings
from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol.errors import (
    FetchErrorCode,
    PublishErrorCode,
    SubscribeErrorCode,
    UsageError,
)
from sidecar.moqt.protocol.messages import (
    UNKNOWN_STREAM_COUNT,
    FilterType,
    StandaloneFetch,
    SubscriptionFilter,
)
from sidecar.moqt.protocol.model import (
    FullTrackName,
    Location,
    ObjectStatus,
    TrackObject,
    has_prefix,
)
from sidecar.moqt.protocol.session import MoqtSession
from sidecar.moqt.relay.core import Relay
from sidecar.moqt.relay.records import RelayLimits, Track

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_TRACK_CACHE = 256 * MiB
DEFAULT_RECEIVE_BUFFER = 256 * MiB
WRITE_BACKLOG = 16 * MiB
"""Bytes that may wait for one subscriber of a track before `PublishedTrack.write` waits:
well under `RelayLimits.max_queued_bytes`, so a subscriber that keeps up with the network is
never sent to read the cache instead (which a bounded track cache could evict first)."""
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


class FetchReset(MoqtApiError):
    """The peer reset a FETCH's data stream: its objects stop there, the session stays up.
    A relay does this when its upstream leaves in the middle of the fetch."""


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
    """The tracks one process publishes, served to every session that reaches it.

    Serving is `relay.core`'s: the tracks are local tracks of a `Relay` that holds this
    process's sessions as peers, so a SUBSCRIBE, FETCH, TRACK_STATUS or SUBSCRIBE_NAMESPACE
    gets the answer a kvmoq relay gives, from the same code. `limits` bound what peers can
    make it hold (`RelayLimits`); each track's objects are bounded by its `cache_bytes`;
    `write_backlog` is how far a writer may run ahead of a track's slowest subscriber.
    """

    def __init__(
        self, limits: RelayLimits | None = None, *, write_backlog: int = WRITE_BACKLOG
    ) -> None:
        self.relay = Relay(limits)
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
            track = PublishedTrack(self, self.relay.open_local(full, cache_bytes))
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
            self._tracks.pop(name).ended = True
            self.relay.close_local(name)

    @property
    def namespaces(self) -> set[tuple[bytes, ...]]:
        return {name.namespace for name in self._tracks}

    def held_bytes(self, namespace: tuple[bytes, ...]) -> int:
        """Object bytes the tracks of `namespace` keep cached."""
        return self.relay.local_bytes(namespace)

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
    """A track this process writes; `Publisher.relay` serves it to subscribers."""

    def __init__(self, publisher: Publisher, track: Track) -> None:
        self.name = track.name
        self.ended = False
        self.largest: Location | None = None
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
            self._publisher.relay.write_local(self._track, group_id, obj, end_of_group=end_of_group)
        except ValueError as exc:  # an object bigger than the whole track cache
            raise UsageError(str(exc)) from None
        self.largest = location

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
        publisher, relay = self._publisher, self._publisher.relay
        await publisher.until(lambda: relay.queued_bytes(self._track) <= publisher.write_backlog)

    def end(self) -> None:
        """End the track: subscriptions get PUBLISH_DONE (TRACK_ENDED) once they have every
        object; it is still served from the cache until `Publisher.remove`."""
        self.ended = True
        self._publisher.relay.end_local(self._track)

    @property
    def subscribers(self) -> int:
        """Live subscriptions (on all sessions) to the track."""
        return len(self._track.subscribers)

    async def wait_subscribed(self) -> None:
        """Wait until someone subscribes."""
        await self._publisher.until(lambda: self.subscribers > 0)


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
        self._peer = ConnectionLink.attach(
            self.publisher.relay, connection, "session", on_resumed=self.publisher.notify
        )
        """This session as the publisher's relay core serves it."""
        self._resolving: dict[int, asyncio.Task[None]] = {}
        """The peer's requests that wait for `Publisher.resolve`, by request id."""

    @property
    def closed(self) -> bool:
        """The session is over (either side closed it, or the peer went silent)."""
        return self.connection.closed.done()

    @property
    def resolving(self) -> int:
        """The peer's requests that wait for `Publisher.resolve` to make their track."""
        return len(self._resolving)

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
        request_id = self._open().subscribe(track, filter=filt)
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
        request_id = self._open().fetch(target)
        fetch = self._fetches[request_id] = FetchStream(self, request_id)
        reply = await self._await_reply(request_id, self._fetches)
        fetch.end_location = reply.end
        return fetch

    async def track_status(self, track: FullTrackName) -> TrackStatus:
        request_id = self._open().track_status(track)
        reply = await self._await_reply(request_id)
        return TrackStatus(reply.largest)

    async def publish_namespace(self, namespace: tuple[bytes, ...]) -> None:
        """Announce a namespace (to a relay), so subscribers are routed to this session.
        Done already if the publisher told the peer of it (it followed a prefix of it)."""
        if namespace in self._peer.announced:
            return
        request_id = self._open().publish_namespace(namespace)
        self._peer.announced.add(namespace)
        try:
            await self._await_reply(request_id)
        except RequestRefused:
            self._peer.announced.discard(namespace)
            raise

    def publish_namespace_done(self, namespace: tuple[bytes, ...]) -> None:
        """Withdraw an announced namespace: the relay stops routing requests for it here.
        Nothing to do if it was withdrawn already (`Publisher.remove`)."""
        if namespace in self._peer.announced:
            self._peer.announced.discard(namespace)
            self.connection.moqt.publish_namespace_done(namespace)
            self.connection.transmit()

    async def subscribe_namespace(self, prefix: tuple[bytes, ...]) -> NamespaceSubscription:
        """Hear of every namespace published under `prefix` (a relay's publishers), and of
        its withdrawal, until `unsubscribe`. Announcements that come before the peer's OK
        are kept, so none is missed."""
        request_id = self._open().subscribe_namespace(prefix)
        subscription = NamespaceSubscription(self, request_id, prefix)
        for namespace in self._peer_namespaces:  # announced before we asked (moq-rs)
            if subscription.covers(namespace):
                subscription.put(Announcement(namespace, published=True))
        self._namespace_subscriptions[request_id] = subscription
        await self._await_reply(request_id, self._namespace_subscriptions)
        return subscription

    def cancel(self, request: Subscription | FetchStream | NamespaceSubscription) -> None:
        """Tell the peer to stop serving ``request`` (UNSUBSCRIBE, FETCH_CANCEL,
        UNSUBSCRIBE_NAMESPACE) and forget it; what its queue holds can still be read. On a
        closing connection there is no one to tell (and qh3 raises on the write): forget it."""
        if self.connection.closing:
            self.forget(request)
            return
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

    def forget(self, request: Subscription | FetchStream | NamespaceSubscription) -> None:
        """Stop routing events to a request of ours that is over."""
        registry: dict[int, Any] = (
            self._subscriptions
            if isinstance(request, Subscription)
            else self._fetches
            if isinstance(request, FetchStream)
            else self._namespace_subscriptions
        )
        if registry.get(request.request_id) is request:
            del registry[request.request_id]

    def _open(self) -> MoqtSession:
        """The protocol session, for a new request; SessionGone once either side has closed
        the connection. The session itself hears of the end only after QUIC's draining
        period (a second or two), and meanwhile qh3 raises on every write and aioquic drops
        them: a Publish then failed with qh3's own error instead of the session's end."""
        if self.connection.closing:
            raise SessionGone("session closed: the connection is closing")
        return self.connection.moqt

    async def _await_reply(self, request_id: int, registry: dict[int, Any] | None = None) -> Any:
        """The peer's *_OK message; RequestRefused on *_ERROR, SessionGone if it closes."""
        future = self._replies[request_id] = asyncio.get_running_loop().create_future()
        self.connection.transmit()
        try:
            return await asyncio.wait_for(future, REQUEST_TIMEOUT)
        except (RequestRefused, SessionGone):
            if registry is not None:
                registry.pop(request_id, None)
            raise
        except BaseException:
            # Timed out or given up: withdraw the request, or a late answer would open a
            # subscription nobody reads, and its track could not be asked for again.
            request = None if registry is None else registry.get(request_id)
            if request is not None:
                self.cancel(request)
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
                fetch.fail(FetchReset(f"fetch stream reset (code {event.error_code:#x})"))
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
        if future is None:
            self._serve(event)  # an answer to the relay core (PUBLISH_OK to its offer)
        elif not future.done():
            future.set_result(event.message)

    def _on_rejected(self, event: ev.RequestRejected) -> None:
        future = self._replies.get(event.request_id)
        if future is None:
            self._serve(event)
        elif not future.done():
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
        for task in list(self._resolving.values()):
            task.cancel()
        self._serve(event)

    # Serving our tracks -----------------------------------------------------------------

    def _serve(self, event: ev.MoqtEvent) -> None:
        """Hand a peer's request (or its answer to one of the core's) to the relay core."""
        self.publisher.relay.handle(self._peer, event)
        self.publisher.notify()

    def _on_track_request(
        self, event: ev.SubscribeRequested | ev.FetchRequested | ev.TrackStatusRequested
    ) -> None:
        """A request for one track: served at once when the publisher holds the track, else
        once `Publisher.resolve` has made it, while this and other sessions go on being
        served. UNSUBSCRIBE, FETCH_CANCEL or the session's end cancel the wait (the
        publisher's work goes on: another request may be waiting for the same track)."""
        name = event.track if isinstance(event, ev.FetchRequested) else event.message.track
        if self.publisher.get(name) is not None:
            self._serve(event)
            return
        request_id = event.message.request_id
        task = asyncio.ensure_future(self._resolve_then_serve(name, event))
        self._resolving[request_id] = task
        task.add_done_callback(lambda _: self._resolving.pop(request_id, None))

    async def _resolve_then_serve(
        self,
        name: FullTrackName,
        event: ev.SubscribeRequested | ev.FetchRequested | ev.TrackStatusRequested,
    ) -> None:
        try:
            await self.publisher.resolve(name)
        except Exception:
            logger.exception("resolving %s failed", name)  # the peer hears no details
            if not self.connection.closing:
                internal = (
                    FetchErrorCode.INTERNAL_ERROR
                    if isinstance(event, ev.FetchRequested)
                    else SubscribeErrorCode.INTERNAL_ERROR
                )
                self.connection.moqt.reject(event.message.request_id, internal, "track unavailable")
                self.connection.transmit()
            return
        if not self.connection.closing:
            self._serve(event)  # the core refuses a track that did not resolve

    def _on_request_over(self, event: ev.Unsubscribed | ev.FetchCancelled) -> None:
        task = self._resolving.pop(event.request_id, None)
        if task is not None:
            task.cancel()  # the core never heard of it
        else:
            self._serve(event)

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

    _HANDLERS: ClassVar[dict[type, Callable[[Session, Any], None]]] = {
        ev.ObjectReceived: _on_object,
        ev.DataStreamEnded: _on_stream_over,
        ev.DataStreamReset: _on_stream_over,
        ev.SubscriptionEnded: _on_subscription_ended,
        ev.RequestAccepted: _on_accepted,
        ev.RequestRejected: _on_rejected,
        ev.SessionClosed: _on_closed,
        ev.SubscribeRequested: _on_track_request,
        ev.TrackStatusRequested: _on_track_request,
        ev.FetchRequested: _on_track_request,
        ev.Unsubscribed: _on_request_over,
        ev.FetchCancelled: _on_request_over,
        ev.SubscribeUpdated: _serve,
        ev.DataStreamStopped: _serve,
        ev.NamespaceSubscribeRequested: _serve,
        ev.NamespaceUnsubscribed: _serve,
        ev.NamespacePublishCancelled: _serve,
        ev.PublishRequested: _on_publish_offered,
        ev.NamespacePublished: _on_namespace_published,
        ev.NamespacePublishDone: _on_namespace_done,
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
    token: str | None = None,
) -> AsyncIterator[Session]:
    """A session to a MoQT server or relay at `url` (moqt://host:port/path).

    `publisher`'s tracks are served to the peer; `receive_buffer` bounds the unread bytes of
    each subscription and fetch; `token` is the JWT a relay with `--auth-key` asks for.
    """
    sessions: list[Session] = []
    on_session = _sessions(publisher, sessions.append, receive_buffer)
    async with transport.connect(url, settings, on_session, token=token):
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
