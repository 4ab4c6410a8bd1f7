"""The application API: publish tracks and push objects; subscribe, fetch and read objects.

The session answers nothing by itself and the transport only moves events, so this is where
a process's tracks meet its subscribers, and its own requests meet their answers. The names
an application uses are all here (`__all__`); they live in three modules:

* `publishing`: `Publisher` holds a process's tracks (each a `PublishedTrack`), shared by
  all its sessions. Serving them is not written there: the tracks are local tracks of a
  `protocol.origin.Origin`, and every session hands that origin the peer's SUBSCRIBE,
  FETCH, TRACK_STATUS and SUBSCRIBE_NAMESPACE, so a kvmoq publisher answers exactly as a
  kvmoq relay does (cached objects from an absolute start, FETCH from the cache,
  PUBLISH_NAMESPACE and PUBLISH to a namespace subscriber). A request for a track the
  publisher does not hold yet waits here for `Publisher.resolve` in a task, and is handed
  on once it is made. A session with no publisher (one that only subscribes) builds no
  origin: it answers the peer's requests as an empty one would.
* `receiving`: what the application reads (objects, announcements, each an async iterator
  with a bound on what waits unread) and the errors the API raises.
* this module: `Session`, one MoQT session as the application sees it (`subscribe`,
  `fetch`, `track_status` and `subscribe_namespace` return once the peer answered), and
  `connect` / `serve`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

from sidecar.moqt.aio import transport
from sidecar.moqt.aio.peer_link import ConnectionLink
from sidecar.moqt.aio.publishing import (
    DEFAULT_TRACK_CACHE,
    WRITE_BACKLOG,
    PublishedTrack,
    Publisher,
)
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.moqt.aio.receiving import (
    DEFAULT_RECEIVE_BUFFER,
    Announcement,
    FetchReset,
    FetchStream,
    MoqtApiError,
    NamespaceSubscription,
    Object,
    Queue,
    ReceiveOverflow,
    RequestRefused,
    SessionGone,
    Subscription,
    TrackStatus,
    object_of,
)
from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol.errors import (
    FetchErrorCode,
    PublishErrorCode,
    SubscribeErrorCode,
    UsageError,
)
from sidecar.moqt.protocol.messages import (
    FilterType,
    StandaloneFetch,
    SubscriptionFilter,
)
from sidecar.moqt.protocol.model import (
    FullTrackName,
    Location,
    has_prefix,
)
from sidecar.moqt.protocol.session import MoqtSession

__all__ = [
    "DEFAULT_RECEIVE_BUFFER",
    "DEFAULT_TRACK_CACHE",
    "WRITE_BACKLOG",
    "Announcement",
    "FetchReset",
    "FetchStream",
    "MoqtApiError",
    "NamespaceSubscription",
    "Object",
    "PublishedTrack",
    "Publisher",
    "ReceiveOverflow",
    "RequestRefused",
    "Session",
    "SessionGone",
    "Subscription",
    "TrackStatus",
    "connect",
    "serve",
]

logger = logging.getLogger(__name__)
REQUEST_TIMEOUT = 10.0
MAX_PEER_NAMESPACES = 4096
"""Namespaces the peer announced that a session remembers for a later SUBSCRIBE_NAMESPACE
(the oldest forgotten first): moq-rs announces every broadcast right after setup, unasked."""


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
        self.publisher = publisher
        self.receive_buffer = receive_buffer
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._subscriptions: dict[int, Subscription] = {}
        self._fetches: dict[int, FetchStream] = {}
        self._namespace_subscriptions: dict[int, NamespaceSubscription] = {}
        self._peer_namespaces: OrderedDict[tuple[bytes, ...], None] = OrderedDict()
        """Announced by the peer and not withdrawn, as far as this session still hears."""
        self._peer = (
            None
            if publisher is None
            else ConnectionLink.attach(
                publisher.origin, connection, "session", on_resumed=publisher.notify
            )
        )
        """This session as the publisher's origin serves it (None: no publisher)."""
        self._announced: set[tuple[bytes, ...]] = (
            set() if self._peer is None else self._peer.announced
        )
        """Namespaces the peer was told of: by `publish_namespace`, or by the origin (the
        peer followed a prefix of them). One set: the origin's record of the peer, if any."""
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
        if namespace in self._announced:
            return
        request_id = self._open().publish_namespace(namespace)
        self._announced.add(namespace)
        try:
            await self._await_reply(request_id)
        except RequestRefused:
            self._announced.discard(namespace)
            raise

    def publish_namespace_done(self, namespace: tuple[bytes, ...]) -> None:
        """Withdraw an announced namespace: the relay stops routing requests for it here.
        Nothing to do if it was withdrawn already (`Publisher.remove`)."""
        if namespace in self._announced:
            self._announced.discard(namespace)
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
            if fetch is not None and not fetch.put(object_of(event)):
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
            self._serve(event)  # an answer to the origin (PUBLISH_OK to its offer)
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
        queues: list[Queue[Any]] = [
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
        """Hand a peer's request (or its answer to one of the origin's) to the origin."""
        if self.publisher is None or self._peer is None:
            self._serve_nothing(event)
            return
        self.publisher.origin.handle(self._peer, event)
        self.publisher.notify()

    def _serve_nothing(self, event: ev.MoqtEvent) -> None:
        """Without a publisher: the answers of an origin that holds nothing."""
        moqt = self.connection.moqt
        if isinstance(event, ev.FetchRequested):
            code = FetchErrorCode.TRACK_DOES_NOT_EXIST
            moqt.reject(event.message.request_id, code, "no such track")
        elif isinstance(event, ev.SubscribeRequested | ev.TrackStatusRequested):
            code = SubscribeErrorCode.TRACK_DOES_NOT_EXIST
            moqt.reject(event.message.request_id, code, "no such track")
        elif isinstance(event, ev.NamespaceSubscribeRequested):
            moqt.subscribe_namespace_ok(event.message.request_id)  # nothing to tell of
        else:
            return
        self.connection.transmit()

    def _on_track_request(
        self, event: ev.SubscribeRequested | ev.FetchRequested | ev.TrackStatusRequested
    ) -> None:
        """A request for one track: served at once when the publisher holds the track, else
        once `Publisher.resolve` has made it, while this and other sessions go on being
        served. UNSUBSCRIBE, FETCH_CANCEL or the session's end cancel the wait (the
        publisher's work goes on: another request may be waiting for the same track)."""
        name = event.track if isinstance(event, ev.FetchRequested) else event.message.track
        if self.publisher is None or self.publisher.get(name) is not None:
            self._serve(event)
            return
        publisher = self.publisher
        request_id = event.message.request_id
        task = asyncio.ensure_future(self._resolve_then_serve(publisher, name, event))
        self._resolving[request_id] = task
        task.add_done_callback(lambda _: self._resolving.pop(request_id, None))

    async def _resolve_then_serve(
        self,
        publisher: Publisher,
        name: FullTrackName,
        event: ev.SubscribeRequested | ev.FetchRequested | ev.TrackStatusRequested,
    ) -> None:
        try:
            await publisher.resolve(name)
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
            self._serve(event)  # the origin refuses a track that did not resolve

    def _on_request_over(self, event: ev.Unsubscribed | ev.FetchCancelled) -> None:
        task = self._resolving.pop(event.request_id, None)
        if task is not None:
            task.cancel()  # the origin never heard of it
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
        self._on_namespace_announced(ev.NamespaceAnnounced(event.message.namespace))

    def _on_namespace_announced(self, event: ev.NamespaceAnnounced) -> None:
        namespace = event.namespace
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
        ev.NamespaceAnnounced: _on_namespace_announced,
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

    `publisher`'s tracks are served to the peer (without one the session only subscribes,
    and the peer's requests find nothing); `receive_buffer` bounds the unread bytes of
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
