"""A sans-I/O MoQT draft-14 session over a QUIC connection, in the style of aioquic's H3Connection.

How an adapter drives it:

* Build the QUIC connection (aioquic or qh3, ALPN ``moq-00``), then
  ``MoqtSession(quic, is_client=...)``. A client session queues CLIENT_SETUP at once.
* Pass every QUIC event to ``handle_event(event, now)``; it returns the ``MoqtEvent`` list for
  the application and never raises: a protocol violation closes the QUIC connection with the
  matching MoQT error code and is reported as ``SessionClosed``.
* After ``handle_event`` and after any method call, transmit (the session only writes into the
  QUIC connection; it never sends datagrams itself).
* Call ``tick(now)`` when ``next_timer()`` says, to expire data streams whose track alias never
  became known and subscriptions that finished draining.

Request methods (``subscribe``, ``fetch``, ...) return the request id; replies arrive as
``RequestAccepted`` / ``RequestRejected``. Requests from the peer arrive as ``*Requested``
events and are answered with ``subscribe_ok`` / ``fetch_ok`` / ... or ``reject``. Objects go out
on streams opened with ``open_subgroup`` / ``open_fetch_stream`` and written with
``send_object`` / ``send_fetch_object``, or as datagrams with ``send_datagram``.
Local misuse raises ``UsageError`` (``RequestLimitReached`` when the peer's request limit is reached).

The QUIC object is duck-typed (``QuicConnectionLike``) and QUIC events are recognised by class
name, so aioquic and qh3 both work without importing either here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from . import events as ev
from .data import (
    DEFAULT_MAX_OBJECT_PAYLOAD,
    DataStreamParser,
    FetchHeader,
    FetchObject,
    ObjectBody,
    ObjectDatagram,
    SubgroupHeader,
    SubgroupObject,
    decode_datagram,
)
from .errors import (
    FetchErrorCode,
    NeedMoreData,
    ObjectTooLarge,
    ProtocolError,
    RequestLimitReached,
    SessionErrorCode,
    StreamResetCode,
    UsageError,
)
from .messages import (
    DEFAULT_FILTER,
    DRAFT_14,
    NO_PARAMETERS,
    ClientSetup,
    ControlMessage,
    Fetch,
    FetchCancel,
    FetchError,
    FetchOk,
    Goaway,
    JoiningFetch,
    MaxRequestId,
    Parameters,
    Publish,
    PublishDone,
    PublishError,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceError,
    PublishNamespaceOk,
    PublishOk,
    RequestsBlocked,
    ServerSetup,
    SetupParameters,
    StandaloneFetch,
    Subscribe,
    SubscribeError,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeOk,
    SubscribeUpdate,
    SubscriptionFilter,
    TrackStatus,
    TrackStatusError,
    TrackStatusOk,
    Unsubscribe,
    UnsubscribeNamespace,
    decode_control,
)
from .model import FullTrackName, GroupOrder, Location, ObjectStatus

logger = logging.getLogger(__name__)


class QuicConnectionLike(Protocol):
    """The part of aioquic's (and qh3's) ``QuicConnection`` the session uses."""

    def get_next_available_stream_id(self, is_unidirectional: bool = False) -> int: ...
    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None: ...
    def reset_stream(self, stream_id: int, error_code: int) -> None: ...
    def stop_stream(self, stream_id: int, error_code: int) -> None: ...
    def close(
        self, error_code: int = ..., frame_type: int | None = ..., reason_phrase: str = ...
    ) -> None: ...
    def send_datagram_frame(self, data: bytes) -> None: ...


@dataclass(slots=True)
class SessionLimits:
    """Bounds on what a peer can make the session hold."""

    # Requests the peer may have open at once; credit returns as they finish.
    request_window: int = 100
    max_object_payload: int = DEFAULT_MAX_OBJECT_PAYLOAD
    # Bytes of incomplete objects held across all incoming streams (QUIC flow control alone
    # would let every stream fill its own window).
    max_buffered_bytes: int = 256 * 1024 * 1024
    # Data streams that arrived before their track alias was known.
    max_pending_streams: int = 64
    max_pending_bytes: int = 64 * 1024 * 1024
    pending_stream_timeout: float = 5.0
    # How long a finished subscription keeps its alias for late streams.
    drain_timeout: float = 10.0


@dataclass(slots=True)
class _RemoteTrack:
    """A track the peer publishes to us (our SUBSCRIBE, or its PUBLISH)."""

    request_id: int
    track: FullTrackName
    track_alias: int | None = None
    unsubscribed: bool = False
    done_at: float | None = None


@dataclass(slots=True)
class _LocalTrack:
    """A track we publish to the peer (its SUBSCRIBE we accepted, or our PUBLISH)."""

    request_id: int
    track: FullTrackName
    track_alias: int
    streams_opened: int = 0


@dataclass(slots=True)
class _InStream:
    """An incoming data stream; objects wait in ``pending`` until the alias is known."""

    parser: DataStreamParser
    request_id: int | None = None
    since: float = 0.0
    pending: list[SubgroupObject] = field(default_factory=list)
    pending_bytes: int = 0
    buffered: int = 0  # the parser's partial object, as last counted in the session total
    fin: bool = False


@dataclass(slots=True)
class _OutStream:
    request_id: int
    header: SubgroupHeader | FetchHeader
    previous_id: int | None = None


_OK_FOR: dict[type[ControlMessage], type[ControlMessage]] = {
    SubscribeOk: Subscribe,
    PublishOk: Publish,
    FetchOk: Fetch,
    TrackStatusOk: TrackStatus,
    PublishNamespaceOk: PublishNamespace,
    SubscribeNamespaceOk: SubscribeNamespace,
}
_ERROR_FOR: dict[type[ControlMessage], type[ControlMessage]] = {
    SubscribeError: Subscribe,
    PublishError: Publish,
    FetchError: Fetch,
    TrackStatusError: TrackStatus,
    PublishNamespaceError: PublishNamespace,
    SubscribeNamespaceError: SubscribeNamespace,
}
_ERROR_OF_REQUEST = {request: error for error, request in _ERROR_FOR.items()}


@contextmanager
def _caller_errors() -> Iterator[None]:
    """Bad arguments found while encoding (``ValueError`` from the wire layer) are the
    caller's mistake: report them as ``UsageError``, with nothing written."""
    try:
        yield
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _pop_if(table: dict[tuple[bytes, ...], int], key: tuple[bytes, ...], request_id: int) -> None:
    """Forget ``key`` only if it still belongs to ``request_id`` (not to a later request)."""
    if table.get(key) == request_id:
        del table[key]


def _stream_is_unidirectional(stream_id: int) -> bool:
    return bool(stream_id & 0x2)


def _stream_is_client_initiated(stream_id: int) -> bool:
    return not stream_id & 0x1


class MoqtSession:
    """One MoQT session (client or server role) on one QUIC connection. See the module doc."""

    def __init__(
        self,
        quic: QuicConnectionLike,
        *,
        is_client: bool,
        path: bytes | None = None,
        authority: bytes | None = None,
        implementation: bytes = b"kvmoq",
        authorization: bytes | None = None,
        limits: SessionLimits | None = None,
        now: float = 0.0,
    ) -> None:
        self._quic = quic
        self.is_client = is_client
        self.limits = limits or SessionLimits()
        self._now = now
        self._implementation = implementation
        self._events: list[ev.MoqtEvent] = []
        self.closed = False
        self.setup_complete = False
        self.peer_parameters: SetupParameters | None = None
        self._goaway_received = False

        self._control_stream_id: int | None = None
        self._control_buffer = bytearray()

        # Request ids: ours are even for a client, odd for a server; the peer's the other parity.
        self._next_request_id = 0 if is_client else 1
        self._peer_first_request_id = 1 if is_client else 0
        self._peer_next_request_id = self._peer_first_request_id
        self._peer_limit = 0  # ids we may use: < this
        self._blocked_sent_for: int | None = None
        self._granted_limit = self._limit_for(self.limits.request_window)
        self._peer_requests_finished = 0

        self._inbound: dict[int, ControlMessage] = {}  # peer's requests still open
        self._answered: set[int] = set()  # ... of which we have answered
        self._outbound: dict[int, ControlMessage] = {}  # our requests awaiting a reply
        self._remote_tracks: dict[int, _RemoteTrack] = {}
        self._remote_by_alias: dict[int, _RemoteTrack] = {}
        self._local_tracks: dict[int, _LocalTrack] = {}
        self._next_track_alias = 0
        self._fetches: set[int] = set()  # our fetches whose stream may still come
        self._announced: dict[tuple[bytes, ...], int] = {}  # our PUBLISH_NAMESPACEs
        self._namespace_subscriptions: dict[tuple[bytes, ...], int] = {}  # ours

        self._in_streams: dict[int, _InStream] = {}
        self._ignored_streams: set[int] = set()
        self._pending_bytes = 0
        self._buffered_bytes = 0
        self._out_streams: dict[int, _OutStream] = {}

        if is_client:
            self._control_stream_id = quic.get_next_available_stream_id(False)
            params = SetupParameters(
                path=path,
                max_request_id=self._granted_limit,
                authorization_tokens=() if authorization is None else (authorization,),
                authority=authority,
                implementation=implementation,
            )
            self._send(ClientSetup((DRAFT_14,), params))

    # ----------------------------------------------------------------------------------------
    # Driving the session.

    def handle_event(self, event: Any, now: float | None = None) -> list[ev.MoqtEvent]:
        """Process one QUIC event; return what the application must know. Never raises."""
        if now is not None:
            self._now = now
        if self.closed:
            return []
        handler = self._QUIC_HANDLERS.get(type(event).__name__)
        if handler is not None:
            try:
                handler(self, event)
            except ProtocolError as exc:
                self._fail(exc.code, exc.reason)
            except Exception:
                logger.exception("moqt session: internal error on %s", type(event).__name__)
                self._fail(SessionErrorCode.INTERNAL_ERROR, "internal error")
        events, self._events = self._events, []
        return events

    def tick(self, now: float) -> None:
        """Expire alias-less data streams and drained subscriptions older than their timeouts."""
        self._now = now
        limits = self.limits
        for stream_id, state in list(self._in_streams.items()):
            if state.request_id is None and now - state.since >= limits.pending_stream_timeout:
                self._drop_in_stream(stream_id)
        for track in list(self._remote_tracks.values()):
            if track.done_at is not None and now - track.done_at >= limits.drain_timeout:
                self._forget_remote(track)

    def awaiting(self) -> bool:
        """Whether the peer owes us something: an answer, a FETCH's stream, the rest of an
        open data stream. Only then is its silence a sign that it is gone."""
        return bool(self._outbound or self._fetches or self._in_streams)

    def next_timer(self) -> float | None:
        """When ``tick`` has work next, or None."""
        times = [
            s.since + self.limits.pending_stream_timeout
            for s in self._in_streams.values()
            if s.request_id is None
        ]
        times += [
            t.done_at + self.limits.drain_timeout
            for t in self._remote_tracks.values()
            if t.done_at is not None
        ]
        return min(times, default=None)

    def close(self, error_code: int = SessionErrorCode.NO_ERROR, reason: str = "") -> None:
        """Close the QUIC connection. The caller knows, so no ``SessionClosed`` follows."""
        if not self.closed:
            self.closed = True
            self._quic.close(error_code=error_code, reason_phrase=reason)

    # ----------------------------------------------------------------------------------------
    # Requests we make.

    def subscribe(
        self,
        track: FullTrackName,
        *,
        filter: SubscriptionFilter = DEFAULT_FILTER,
        subscriber_priority: int = 128,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        forward: bool = True,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        if any(t.track == track and t.done_at is None for t in self._remote_tracks.values()):
            raise UsageError(f"already subscribed to {track}")
        request_id = self._request(
            Subscribe(
                self._next_id(),
                track,
                subscriber_priority,
                group_order,
                forward,
                filter,
                parameters,
            )
        )
        self._remote_tracks[request_id] = _RemoteTrack(request_id, track)
        return request_id

    def subscribe_update(
        self,
        subscription_request_id: int,
        start: Location,
        end_group: int | None = None,
        *,
        subscriber_priority: int = 128,
        forward: bool = True,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        if subscription_request_id not in self._remote_tracks:
            raise UsageError(f"no subscription {subscription_request_id}")
        update = SubscribeUpdate(
            self._next_id(),
            subscription_request_id,
            start,
            end_group,
            subscriber_priority,
            forward,
            parameters,
        )
        return self._request(update, expects_reply=False)

    def unsubscribe(self, request_id: int) -> None:
        """End our subscription (or one the peer made with PUBLISH); late objects are dropped."""
        track = self._remote_tracks.get(request_id)
        if track is None or track.unsubscribed:
            raise UsageError(f"no subscription {request_id}")
        track.unsubscribed = True
        if track.done_at is None:
            track.done_at = self._now
        self._send(Unsubscribe(request_id))

    def fetch(
        self,
        target: StandaloneFetch | JoiningFetch,
        *,
        subscriber_priority: int = 128,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        if (
            isinstance(target, JoiningFetch)
            and target.joining_request_id not in self._remote_tracks
        ):
            raise UsageError(f"no subscription {target.joining_request_id} to join")
        request_id = self._request(
            Fetch(self._next_id(), target, subscriber_priority, group_order, parameters)
        )
        self._fetches.add(request_id)
        return request_id

    def fetch_cancel(self, request_id: int) -> None:
        if request_id not in self._fetches:
            raise UsageError(f"no fetch {request_id}")
        self._fetches.discard(request_id)
        for stream_id, state in list(self._in_streams.items()):
            if state.request_id == request_id:
                self._drop_in_stream(stream_id)
        self._send(FetchCancel(request_id))

    def publish(
        self,
        track: FullTrackName,
        *,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        largest: Location | None = None,
        forward: bool = True,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        """Offer a track to the peer; objects may be sent right away with the returned id."""
        self._check_not_publishing(track)
        alias = self._allocate_alias()
        request_id = self._request(
            Publish(self._next_id(), track, alias, group_order, largest, forward, parameters)
        )
        self._local_tracks[request_id] = _LocalTrack(request_id, track, alias)
        return request_id

    def track_status(
        self,
        track: FullTrackName,
        *,
        filter: SubscriptionFilter = DEFAULT_FILTER,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        return self._request(
            TrackStatus(self._next_id(), track, 128, GroupOrder.ASCENDING, True, filter, parameters)
        )

    def publish_namespace(
        self, namespace: tuple[bytes, ...], parameters: Parameters = NO_PARAMETERS
    ) -> int:
        if namespace in self._announced:
            raise UsageError(f"namespace {namespace!r} already published")
        request_id = self._request(PublishNamespace(self._next_id(), namespace, parameters))
        self._announced[namespace] = request_id
        return request_id

    def publish_namespace_done(self, namespace: tuple[bytes, ...]) -> None:
        if self._announced.pop(namespace, None) is None:
            raise UsageError(f"namespace {namespace!r} is not published")
        self._send(PublishNamespaceDone(namespace))

    def subscribe_namespace(
        self, prefix: tuple[bytes, ...], parameters: Parameters = NO_PARAMETERS
    ) -> int:
        if prefix in self._namespace_subscriptions:
            raise UsageError(f"already subscribed to namespace prefix {prefix!r}")
        request_id = self._request(SubscribeNamespace(self._next_id(), prefix, parameters))
        self._namespace_subscriptions[prefix] = request_id
        return request_id

    def unsubscribe_namespace(self, prefix: tuple[bytes, ...]) -> None:
        request_id = self._namespace_subscriptions.pop(prefix, None)
        if request_id is None:
            raise UsageError(f"no namespace subscription {prefix!r}")
        self._send(UnsubscribeNamespace(prefix))

    def goaway(self, new_session_uri: bytes = b"") -> None:
        if self.is_client and new_session_uri:
            raise UsageError("only a server may name a new session URI")
        self._send(Goaway(new_session_uri))

    # ----------------------------------------------------------------------------------------
    # Answers to the peer's requests.

    def subscribe_ok(
        self,
        request_id: int,
        *,
        expires: int = 0,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        largest: Location | None = None,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        """Accept a SUBSCRIBE; returns the track alias we chose for it."""
        request = self._answerable(request_id, Subscribe)
        self._check_not_publishing(request.track)
        alias = self._allocate_alias()
        self._reply(SubscribeOk(request_id, alias, expires, group_order, largest, parameters))
        self._local_tracks[request_id] = _LocalTrack(request_id, request.track, alias)
        return alias

    def publish_ok(
        self,
        request_id: int,
        *,
        forward: bool = True,
        subscriber_priority: int = 128,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        filter: SubscriptionFilter = DEFAULT_FILTER,
        parameters: Parameters = NO_PARAMETERS,
    ) -> None:
        self._answerable(request_id, Publish)
        self._reply(
            PublishOk(request_id, forward, subscriber_priority, group_order, filter, parameters)
        )

    def fetch_ok(
        self,
        request_id: int,
        end: Location,
        *,
        end_of_track: bool = False,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        parameters: Parameters = NO_PARAMETERS,
    ) -> None:
        self._answerable(request_id, Fetch)
        self._reply(FetchOk(request_id, end, end_of_track, group_order, parameters))

    def track_status_ok(
        self,
        request_id: int,
        *,
        largest: Location | None = None,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        expires: int = 0,
        parameters: Parameters = NO_PARAMETERS,
    ) -> None:
        self._answerable(request_id, TrackStatus)
        self._reply(TrackStatusOk(request_id, 0, expires, group_order, largest, parameters))
        self._finish_peer_request(request_id)

    def publish_namespace_ok(self, request_id: int) -> None:
        self._answerable(request_id, PublishNamespace)
        self._reply(PublishNamespaceOk(request_id))

    def subscribe_namespace_ok(self, request_id: int) -> None:
        self._answerable(request_id, SubscribeNamespace)
        self._reply(SubscribeNamespaceOk(request_id))

    def reject(self, request_id: int, error_code: int, reason: str = "") -> None:
        """Refuse any open request of the peer with the *_ERROR message of its family."""
        request = self._answerable(request_id, ControlMessage)
        self._reply(_ERROR_OF_REQUEST[type(request)](request_id, error_code, reason))
        if isinstance(request, Publish):
            self._forget_remote(self._remote_tracks[request_id])
        self._finish_peer_request(request_id)

    def publish_done(self, request_id: int, status_code: int, reason: str = "") -> None:
        """End a track we publish (the peer's subscription, or our PUBLISH)."""
        track = self._local_track(request_id)
        self._send(PublishDone(request_id, status_code, track.streams_opened, reason))
        del self._local_tracks[request_id]
        self._finish_peer_request(request_id)

    def publish_namespace_cancel(
        self, namespace: tuple[bytes, ...], error_code: int, reason: str = ""
    ) -> None:
        """Stop accepting a namespace the peer published."""
        request_id = self._find_inbound(PublishNamespace, namespace)
        if request_id is None:
            raise UsageError(f"the peer has not published {namespace!r}")
        self._send(PublishNamespaceCancel(namespace, error_code, reason))
        self._finish_peer_request(request_id)

    # ----------------------------------------------------------------------------------------
    # Objects we send.

    def track_alias(self, request_id: int) -> int:
        """The alias of a track we publish (chosen in ``subscribe_ok`` or ``publish``)."""
        return self._local_track(request_id).track_alias

    def open_subgroup(
        self,
        request_id: int,
        group_id: int,
        subgroup_id: int = 0,
        publisher_priority: int = 128,
        *,
        extensions: bool = False,
        end_of_group: bool = False,
    ) -> int:
        """Open a subgroup stream of a track we publish; returns its stream id.

        ``extensions`` must be set for objects on it to carry extension headers;
        ``end_of_group`` declares that the stream's last object ends the group.
        """
        track = self._local_track(request_id)
        header = SubgroupHeader.for_subgroup(
            track.track_alias, group_id, subgroup_id, publisher_priority, extensions, end_of_group
        )
        stream_id = self._open_out_stream(request_id, header)
        track.streams_opened += 1
        return stream_id

    def send_object(
        self,
        stream_id: int,
        object_id: int,
        payload: bytes = b"",
        *,
        status: ObjectStatus = ObjectStatus.NORMAL,
        extensions: bytes = b"",
        end_stream: bool = False,
    ) -> None:
        """Write one object on a subgroup stream; ids must increase along the stream."""
        stream = self._out_stream(stream_id, SubgroupHeader)
        with _caller_errors():
            body = ObjectBody(payload, status, extensions)
            data = SubgroupObject(object_id, body).encode(stream.header, stream.previous_id)  # type: ignore[arg-type]
        stream.previous_id = object_id
        self._write_stream(stream_id, data, end_stream)

    def open_fetch_stream(self, request_id: int) -> int:
        """Open the response stream of a FETCH we accepted."""
        request = self._inbound.get(request_id)
        if not isinstance(request, Fetch) or request_id not in self._answered:
            raise UsageError(f"no accepted fetch {request_id}")
        return self._open_out_stream(request_id, FetchHeader(request_id))

    def send_fetch_object(
        self,
        stream_id: int,
        group_id: int,
        subgroup_id: int,
        object_id: int,
        payload: bytes = b"",
        *,
        publisher_priority: int = 128,
        status: ObjectStatus = ObjectStatus.NORMAL,
        extensions: bytes = b"",
        end_stream: bool = False,
    ) -> None:
        self._out_stream(stream_id, FetchHeader)
        with _caller_errors():
            body = ObjectBody(payload, status, extensions)
            data = FetchObject(group_id, subgroup_id, object_id, publisher_priority, body).encode()
        self._write_stream(stream_id, data, end_stream)

    def end_stream(self, stream_id: int) -> None:
        """FIN a data stream after its last object."""
        self._out_stream(stream_id, object)
        self._write_stream(stream_id, b"", True)

    def reset_stream(self, stream_id: int, error_code: int = StreamResetCode.CANCELLED) -> None:
        stream = self._out_streams.pop(stream_id, None)
        if stream is None:
            raise UsageError(f"no open data stream {stream_id}")
        self._quic.reset_stream(stream_id, error_code)
        self._stream_closed(stream)

    def send_datagram(
        self,
        request_id: int,
        group_id: int,
        object_id: int,
        payload: bytes = b"",
        *,
        publisher_priority: int = 128,
        status: ObjectStatus = ObjectStatus.NORMAL,
        extensions: bytes = b"",
        end_of_group: bool = False,
    ) -> None:
        """Send a small object as a QUIC datagram (dropped by QUIC if it does not fit)."""
        track = self._local_track(request_id)
        with _caller_errors():
            body = ObjectBody(payload, status, extensions)
            data = ObjectDatagram(
                track.track_alias, group_id, object_id, publisher_priority, body, end_of_group
            ).encode()
        self._quic.send_datagram_frame(data)

    # ----------------------------------------------------------------------------------------
    # QUIC events.

    def _on_stream_data(self, event: Any) -> None:
        stream_id: int = event.stream_id
        if not _stream_is_unidirectional(stream_id):
            self._on_control_data(stream_id, event.data, event.end_stream)
        elif stream_id in self._ignored_streams:
            if event.end_stream:
                self._ignored_streams.discard(stream_id)
        else:
            self._on_data_stream(stream_id, event.data, event.end_stream)

    def _on_stream_reset(self, event: Any) -> None:
        stream_id: int = event.stream_id
        if stream_id == self._control_stream_id:
            raise ProtocolError("control stream reset")
        self._ignored_streams.discard(stream_id)
        state = self._pop_in_stream(stream_id)
        if state is not None and state.request_id is not None:
            self._events.append(ev.DataStreamReset(stream_id, state.request_id, event.error_code))

    def _on_stop_sending(self, event: Any) -> None:
        stream = self._out_streams.pop(event.stream_id, None)
        if stream is not None:
            self._quic.reset_stream(event.stream_id, event.error_code)
            self._stream_closed(stream)
            self._events.append(
                ev.DataStreamStopped(event.stream_id, stream.request_id, event.error_code)
            )

    def _on_datagram(self, event: Any) -> None:
        datagram = decode_datagram(event.data)
        track = self._remote_by_alias.get(datagram.track_alias)
        if track is None or track.unsubscribed:
            return  # datagrams may be dropped; an unknown alias is no violation
        self._events.append(
            ev.ObjectReceived(
                track.request_id,
                ev.ObjectSource.DATAGRAM,
                datagram.group_id,
                None,
                datagram.object_id,
                datagram.publisher_priority,
                datagram.body,
                None,
                datagram.track_alias,
                datagram.end_of_group,
            )
        )

    def _on_terminated(self, event: Any) -> None:
        self.closed = True
        self._events.append(ev.SessionClosed(event.error_code, event.reason_phrase, True))

    _QUIC_HANDLERS: ClassVar[dict[str, Callable[[MoqtSession, Any], None]]] = {
        "StreamDataReceived": _on_stream_data,
        "StreamReset": _on_stream_reset,
        "StopSendingReceived": _on_stop_sending,
        "DatagramFrameReceived": _on_datagram,
        "ConnectionTerminated": _on_terminated,
    }

    # ----------------------------------------------------------------------------------------
    # Control stream.

    def _on_control_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        if (
            self._control_stream_id is None
            and not self.is_client
            and _stream_is_client_initiated(stream_id)
        ):
            self._control_stream_id = stream_id
        if stream_id != self._control_stream_id:
            raise ProtocolError(f"bidirectional stream {stream_id} besides the control stream")
        buffer = self._control_buffer
        buffer += data
        consumed = 0
        try:
            while consumed < len(buffer) and not self.closed:
                message, length = decode_control(memoryview(buffer)[consumed:])
                consumed += length
                self._on_control_message(message)
        except NeedMoreData:
            pass
        # Not in a ``finally``: a propagating error's traceback still holds views of the
        # buffer, so it cannot be resized then, and a failed session needs no compaction.
        del buffer[:consumed]
        if end_stream:
            raise ProtocolError("control stream closed")

    def _on_control_message(self, message: ControlMessage) -> None:
        if not self.setup_complete:
            self._on_setup(message)
            return
        if message.NEW_REQUEST:
            self._accept_peer_request_id(message.request_id)  # type: ignore[attr-defined]
        handler = self._CONTROL_HANDLERS.get(type(message))
        if handler is None:
            raise ProtocolError(f"unexpected {type(message).__name__}")
        handler(self, message)

    def _on_setup(self, message: ControlMessage) -> None:
        if self.is_client:
            if not isinstance(message, ServerSetup):
                raise ProtocolError(f"expected SERVER_SETUP, got {type(message).__name__}")
            if message.version != DRAFT_14:
                raise ProtocolError(
                    f"server chose version {message.version:#x}",
                    SessionErrorCode.VERSION_NEGOTIATION_FAILED,
                )
            version, params = message.version, message.parameters
        else:
            if not isinstance(message, ClientSetup):
                raise ProtocolError(f"expected CLIENT_SETUP, got {type(message).__name__}")
            if DRAFT_14 not in message.versions:
                raise ProtocolError(
                    "no common version", SessionErrorCode.VERSION_NEGOTIATION_FAILED
                )
            version, params = DRAFT_14, message.parameters
            reply = SetupParameters(
                max_request_id=self._granted_limit, implementation=self._implementation
            )
            self._send(ServerSetup(DRAFT_14, reply))
        self.setup_complete = True
        self.peer_parameters = params
        self._peer_limit = params.max_request_id or 0
        self._events.append(ev.SetupCompleted(version, params))

    def _accept_peer_request_id(self, request_id: int) -> None:
        if request_id != self._peer_next_request_id:
            raise ProtocolError(
                f"request id {request_id}, expected {self._peer_next_request_id}",
                SessionErrorCode.INVALID_REQUEST_ID,
            )
        if request_id >= self._granted_limit:
            raise ProtocolError(
                f"request id {request_id} at or above the limit {self._granted_limit}",
                SessionErrorCode.TOO_MANY_REQUESTS,
            )
        self._peer_next_request_id += 2

    # Requests from the peer.

    def _on_subscribe(self, message: Subscribe) -> None:
        for request_id, request in self._inbound.items():
            if isinstance(request, Subscribe) and request.track == message.track:
                raise ProtocolError(f"second subscription {request_id} to {message.track}")
        self._inbound[message.request_id] = message
        self._events.append(ev.SubscribeRequested(message))

    def _on_subscribe_update(self, message: SubscribeUpdate) -> None:
        target = message.subscription_request_id
        if target not in self._local_tracks and not isinstance(
            self._inbound.get(target), Subscribe
        ):
            raise ProtocolError(f"update of unknown subscription {target}")
        self._peer_requests_finished += 1  # an update takes an id but leaves nothing open
        self._grant_credit()
        self._events.append(ev.SubscribeUpdated(message))

    def _on_unsubscribe(self, message: Unsubscribe) -> None:
        request_id = message.request_id
        known = self._local_tracks.pop(request_id, None) is not None
        if isinstance(self._inbound.get(request_id), Subscribe):
            known = not self._unheard(request_id)
            self._finish_peer_request(request_id)
        if known:
            self._events.append(ev.Unsubscribed(request_id))

    def _on_fetch(self, message: Fetch) -> None:
        target = message.target
        if isinstance(target, StandaloneFetch):
            track = target.track
        else:
            joined = self._inbound.get(target.joining_request_id)
            if (
                not isinstance(joined, Subscribe)
                or target.joining_request_id not in self._local_tracks
            ):
                self._inbound[message.request_id] = message
                self.reject(
                    message.request_id,
                    FetchErrorCode.INVALID_JOINING_REQUEST_ID,
                    "joining fetch names no active subscription",
                )
                return
            track = joined.track
        self._inbound[message.request_id] = message
        self._events.append(ev.FetchRequested(message, track))

    def _on_fetch_cancel(self, message: FetchCancel) -> None:
        if isinstance(self._inbound.get(message.request_id), Fetch):
            for stream_id, stream in list(self._out_streams.items()):
                if stream.request_id == message.request_id:
                    self.reset_stream(stream_id, StreamResetCode.CANCELLED)
            self._finish_peer_request(message.request_id)
            if not self._unheard(message.request_id):
                self._events.append(ev.FetchCancelled(message.request_id))

    def _unheard(self, request_id: int) -> bool:
        """Withdraw the peer's SUBSCRIBE or FETCH from the events not yet returned, if it is
        there: it came with its own UNSUBSCRIBE or FETCH_CANCEL, and an application that
        saw it would answer a request that is already over. The withdrawal is then not
        reported either."""
        for index, event in enumerate(self._events):
            if (
                isinstance(event, ev.SubscribeRequested | ev.FetchRequested)
                and event.message.request_id == request_id
            ):
                del self._events[index]
                return True
        return False

    def _on_publish(self, message: Publish) -> None:
        self._inbound[message.request_id] = message
        track = _RemoteTrack(message.request_id, message.track)
        self._remote_tracks[message.request_id] = track
        self._bind_alias(track, message.track_alias)
        self._events.append(ev.PublishRequested(message))

    def _on_track_status(self, message: TrackStatus) -> None:
        self._inbound[message.request_id] = message
        self._events.append(ev.TrackStatusRequested(message))

    def _on_publish_namespace(self, message: PublishNamespace) -> None:
        self._inbound[message.request_id] = message
        self._events.append(ev.NamespacePublished(message))

    def _on_publish_namespace_done(self, message: PublishNamespaceDone) -> None:
        request_id = self._find_inbound(PublishNamespace, message.namespace)
        if request_id is not None:
            self._finish_peer_request(request_id)
            self._events.append(ev.NamespacePublishDone(message.namespace))

    def _on_publish_namespace_cancel(self, message: PublishNamespaceCancel) -> None:
        if self._announced.pop(message.namespace, None) is not None:
            self._events.append(ev.NamespacePublishCancelled(message))

    def _on_subscribe_namespace(self, message: SubscribeNamespace) -> None:
        self._inbound[message.request_id] = message
        self._events.append(ev.NamespaceSubscribeRequested(message))

    def _on_unsubscribe_namespace(self, message: UnsubscribeNamespace) -> None:
        request_id = self._find_inbound(SubscribeNamespace, message.namespace)
        if request_id is not None:
            self._finish_peer_request(request_id)
            self._events.append(ev.NamespaceUnsubscribed(message.namespace))

    # Replies to our requests.

    def _on_ok(self, message: Any) -> None:
        self._take_reply(message, _OK_FOR)
        self._events.append(ev.RequestAccepted(message.request_id, message))
        if isinstance(message, SubscribeOk):
            track = self._remote_tracks.get(message.request_id)
            if track is not None:  # even if unsubscribed: its streams are then dropped at once
                self._bind_alias(track, message.track_alias)

    def _on_error(self, message: Any) -> None:
        request = self._take_reply(message, _ERROR_FOR)
        request_id = message.request_id
        if isinstance(request, Subscribe) and request_id in self._remote_tracks:
            self._forget_remote(self._remote_tracks[request_id])
        elif isinstance(request, Publish):
            self._local_tracks.pop(request_id, None)
        elif isinstance(request, Fetch):
            self._fetches.discard(request_id)
        elif isinstance(request, PublishNamespace):
            _pop_if(self._announced, request.namespace, request_id)
        elif isinstance(request, SubscribeNamespace):
            _pop_if(self._namespace_subscriptions, request.namespace, request_id)
        self._events.append(ev.RequestRejected(request_id, message))

    def _on_publish_done(self, message: PublishDone) -> None:
        track = self._remote_tracks.get(message.request_id)
        if track is None:
            return  # already forgotten after our UNSUBSCRIBE drained
        if isinstance(self._inbound.get(message.request_id), Publish):
            self._finish_peer_request(message.request_id)
        if track.done_at is None:
            track.done_at = self._now
        self._events.append(ev.SubscriptionEnded(message.request_id, message))

    def _on_goaway(self, message: Goaway) -> None:
        if self._goaway_received:
            raise ProtocolError("second GOAWAY")
        if not self.is_client and message.new_session_uri:
            raise ProtocolError("GOAWAY from a client names a URI")
        self._goaway_received = True
        self._events.append(ev.GoawayReceived(message.new_session_uri))

    def _on_max_request_id(self, message: MaxRequestId) -> None:
        if message.request_id <= self._peer_limit:
            raise ProtocolError(
                f"MAX_REQUEST_ID {message.request_id} does not exceed {self._peer_limit}"
            )
        self._peer_limit = message.request_id
        self._events.append(ev.MaxRequestIdReceived(message.request_id))

    def _on_requests_blocked(self, message: RequestsBlocked) -> None:
        self._events.append(ev.RequestsBlockedReceived(message.request_id))

    _CONTROL_HANDLERS: ClassVar[dict[type[ControlMessage], Callable[[MoqtSession, Any], None]]] = {
        Subscribe: _on_subscribe,
        SubscribeUpdate: _on_subscribe_update,
        Unsubscribe: _on_unsubscribe,
        Fetch: _on_fetch,
        FetchCancel: _on_fetch_cancel,
        Publish: _on_publish,
        TrackStatus: _on_track_status,
        PublishNamespace: _on_publish_namespace,
        PublishNamespaceDone: _on_publish_namespace_done,
        PublishNamespaceCancel: _on_publish_namespace_cancel,
        SubscribeNamespace: _on_subscribe_namespace,
        UnsubscribeNamespace: _on_unsubscribe_namespace,
        **dict.fromkeys(_OK_FOR, _on_ok),
        **dict.fromkeys(_ERROR_FOR, _on_error),
        PublishDone: _on_publish_done,
        Goaway: _on_goaway,
        MaxRequestId: _on_max_request_id,
        RequestsBlocked: _on_requests_blocked,
    }

    # ----------------------------------------------------------------------------------------
    # Data streams.

    def _on_data_stream(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        if _stream_is_client_initiated(stream_id) == self.is_client:
            raise ProtocolError(f"data on our own unidirectional stream {stream_id}")
        state = self._in_streams.get(stream_id)
        if state is None:
            parser = DataStreamParser(self.limits.max_object_payload)
            state = self._in_streams[stream_id] = _InStream(parser, since=self._now)
        state.fin = end_stream
        try:
            items = state.parser.feed(data, end_stream)
        except ObjectTooLarge as exc:
            logger.warning("moqt: dropping stream %d: %s", stream_id, exc.reason)
            self._drop_in_stream(stream_id)
            return
        self._buffered_bytes += state.parser.buffered - state.buffered
        state.buffered = state.parser.buffered
        if self._buffered_bytes > self.limits.max_buffered_bytes:
            logger.warning("moqt: dropping stream %d: incoming buffers are full", stream_id)
            self._drop_in_stream(stream_id)
            return
        for item in items:
            if stream_id not in self._in_streams:
                return  # dropped while handling an earlier item
            if isinstance(item, SubgroupHeader):
                self._on_subgroup_header(stream_id, state, item)
            elif isinstance(item, FetchHeader):
                if item.request_id not in self._fetches:
                    if not self._made(item.request_id):
                        raise ProtocolError(f"fetch stream for unknown fetch {item.request_id}")
                    # A fetch we cancelled: the peer may have opened its stream before our
                    # FETCH_CANCEL reached it.
                    self._drop_in_stream(stream_id)
                    return
                state.request_id = item.request_id
            elif state.request_id is None:
                self._hold(stream_id, state, item)  # type: ignore[arg-type]
            else:
                self._deliver(stream_id, state, item)
        if end_stream and stream_id in self._in_streams and state.request_id is not None:
            self._end_in_stream(stream_id, state)

    def _on_subgroup_header(self, stream_id: int, state: _InStream, header: SubgroupHeader) -> None:
        track = self._remote_by_alias.get(header.track_alias)
        if track is not None and track.unsubscribed:
            self._drop_in_stream(stream_id)
        elif track is not None:
            state.request_id = track.request_id
        elif (
            sum(s.request_id is None for s in self._in_streams.values())
            > self.limits.max_pending_streams
        ):
            self._drop_in_stream(stream_id)

    def _hold(self, stream_id: int, state: _InStream, obj: SubgroupObject) -> None:
        size = len(obj.body.payload) + len(obj.body.extensions)
        if self._pending_bytes + size > self.limits.max_pending_bytes:
            self._drop_in_stream(stream_id)
            return
        state.pending.append(obj)
        state.pending_bytes += size
        self._pending_bytes += size

    def _deliver(
        self, stream_id: int, state: _InStream, item: SubgroupObject | FetchObject
    ) -> None:
        request_id = state.request_id
        assert request_id is not None
        header = state.parser.header
        if isinstance(item, FetchObject):
            event = ev.ObjectReceived(
                request_id,
                ev.ObjectSource.FETCH,
                item.group_id,
                item.subgroup_id,
                item.object_id,
                item.publisher_priority,
                item.body,
                stream_id,
            )
        else:
            assert isinstance(header, SubgroupHeader)
            event = ev.ObjectReceived(
                request_id,
                ev.ObjectSource.SUBGROUP,
                header.group_id,
                state.parser.subgroup_id,
                item.object_id,
                header.publisher_priority,
                item.body,
                stream_id,
                header.track_alias,
            )
        self._events.append(event)

    def _end_in_stream(self, stream_id: int, state: _InStream) -> None:
        self._pop_in_stream(stream_id)
        assert state.request_id is not None
        header = state.parser.header
        if isinstance(header, FetchHeader):
            self._fetches.discard(state.request_id)
            self._events.append(
                ev.DataStreamEnded(stream_id, state.request_id, ev.ObjectSource.FETCH)
            )
        else:
            assert isinstance(header, SubgroupHeader)
            self._events.append(
                ev.DataStreamEnded(
                    stream_id,
                    state.request_id,
                    ev.ObjectSource.SUBGROUP,
                    header.group_id,
                    header.end_of_group,
                )
            )

    def _bind_alias(self, track: _RemoteTrack, alias: int) -> None:
        """Give a remote track its alias and release the streams that were waiting for it.

        An alias may be reused once its subscription has ended (PUBLISH_DONE, UNSUBSCRIBE);
        the ended one, kept only to place late streams, gives way.
        """
        previous = self._remote_by_alias.get(alias)
        if previous is not None:
            if previous.done_at is None:
                raise ProtocolError(
                    f"track alias {alias} already in use", SessionErrorCode.DUPLICATE_TRACK_ALIAS
                )
            self._forget_remote(previous)
        track.track_alias = alias
        self._remote_by_alias[alias] = track
        for stream_id, state in list(self._in_streams.items()):
            header = state.parser.header
            if (
                state.request_id is None
                and isinstance(header, SubgroupHeader)
                and header.track_alias == alias
            ):
                if track.unsubscribed:
                    self._drop_in_stream(stream_id)
                    continue
                state.request_id = track.request_id
                pending, state.pending = state.pending, []
                self._pending_bytes -= state.pending_bytes
                state.pending_bytes = 0
                for obj in pending:
                    self._deliver(stream_id, state, obj)
                if state.fin:
                    self._end_in_stream(stream_id, state)

    def _pop_in_stream(self, stream_id: int) -> _InStream | None:
        """Forget an incoming stream and the bytes it held."""
        state = self._in_streams.pop(stream_id, None)
        if state is not None:
            self._pending_bytes -= state.pending_bytes
            self._buffered_bytes -= state.buffered
        return state

    def _drop_in_stream(self, stream_id: int) -> None:
        """Stop reading a stream we will not deliver (unknown alias too long, over a limit).

        A stream that already ended needs no STOP_SENDING (and the QUIC stack may have
        discarded it, which would make ``stop_stream`` raise).
        """
        state = self._pop_in_stream(stream_id)
        if state is not None and state.fin:
            return
        self._ignored_streams.add(stream_id)
        self._quic.stop_stream(stream_id, StreamResetCode.CANCELLED)

    def _forget_remote(self, track: _RemoteTrack) -> None:
        self._remote_tracks.pop(track.request_id, None)
        if track.track_alias is not None:
            self._remote_by_alias.pop(track.track_alias, None)

    # ----------------------------------------------------------------------------------------
    # Helpers.

    def _send(self, message: ControlMessage) -> None:
        """Encode and queue a control message; raises before anything is written."""
        if self.closed:
            raise UsageError("session is closed")
        if self._control_stream_id is None:
            raise UsageError("the client has not opened the control stream yet")
        with _caller_errors():
            data = message.encode()
        self._quic.send_stream_data(self._control_stream_id, data, False)

    def _request(self, message: Any, expects_reply: bool = True) -> int:
        """Send a request numbered by ``_next_id``; the id is spent only once it is sent, so a
        request refused locally never leaves a gap the peer would see as INVALID_REQUEST_ID."""
        self._send(message)
        self._next_request_id += 2
        if expects_reply:
            self._outbound[message.request_id] = message
        return message.request_id

    def _made(self, request_id: int) -> bool:
        """Whether this session has sent a request with this id (ids alternate by side)."""
        return request_id < self._next_request_id and request_id % 2 == self._next_request_id % 2

    def _next_id(self) -> int:
        """The id the next request will take, if the session and the peer's limit allow one."""
        if not self.setup_complete or self.closed:
            raise UsageError("session is not established")
        request_id = self._next_request_id
        if request_id >= self._peer_limit:
            if self._blocked_sent_for != self._peer_limit:
                self._blocked_sent_for = self._peer_limit
                self._send(RequestsBlocked(self._peer_limit))
            raise RequestLimitReached(f"peer allows request ids below {self._peer_limit}")
        return request_id

    def _limit_for(self, requests: int) -> int:
        """The MAX_REQUEST_ID value that lets the peer make ``requests`` requests in all."""
        return self._peer_first_request_id + 2 * requests

    def _finish_peer_request(self, request_id: int) -> None:
        """Forget a peer request that is over, and return its credit."""
        if self._inbound.pop(request_id, None) is None:
            return
        self._answered.discard(request_id)
        self._peer_requests_finished += 1
        self._grant_credit()

    def _grant_credit(self) -> None:
        """Keep ``request_window`` peer requests open; grant in steps of half a window."""
        window = self.limits.request_window
        limit = self._limit_for(self._peer_requests_finished + window)
        if limit - self._granted_limit >= max(2, window):  # ids step by two: window ids = half
            self._granted_limit = limit
            self._send(MaxRequestId(limit))

    def _answerable(self, request_id: int, request_type: type[ControlMessage]) -> Any:
        """The peer's open request ``request_id`` of ``request_type`` that awaits our answer."""
        request = self._inbound.get(request_id)
        if not isinstance(request, request_type) or request_id in self._answered:
            raise UsageError(f"no unanswered {request_type.__name__} {request_id}")
        return request

    def _reply(self, message: Any) -> None:
        self._send(message)
        self._answered.add(message.request_id)

    def _take_reply(
        self, message: Any, table: dict[type[ControlMessage], type[ControlMessage]]
    ) -> ControlMessage:
        request = self._outbound.get(message.request_id)
        if request is None or not isinstance(request, table[type(message)]):
            raise ProtocolError(f"{type(message).__name__} answers no open request")
        del self._outbound[message.request_id]
        return request

    def _find_inbound(self, request_type: type[Any], namespace: tuple[bytes, ...]) -> int | None:
        for request_id, request in self._inbound.items():
            if isinstance(request, request_type) and request.namespace == namespace:
                return request_id
        return None

    def _check_not_publishing(self, track: FullTrackName) -> None:
        if any(t.track == track for t in self._local_tracks.values()):
            raise UsageError(f"{track} is already published on this session")

    def _allocate_alias(self) -> int:
        alias = self._next_track_alias
        self._next_track_alias += 1
        return alias

    def _local_track(self, request_id: int) -> _LocalTrack:
        track = self._local_tracks.get(request_id)
        if track is None:
            raise UsageError(f"no published track {request_id}")
        return track

    def _open_out_stream(self, request_id: int, header: SubgroupHeader | FetchHeader) -> int:
        if self.closed:
            raise UsageError("session is closed")
        with _caller_errors():
            data = header.encode()
        stream_id = self._quic.get_next_available_stream_id(True)
        self._quic.send_stream_data(stream_id, data, False)
        self._out_streams[stream_id] = _OutStream(request_id, header)
        return stream_id

    def _out_stream(self, stream_id: int, header_type: type) -> _OutStream:
        stream = self._out_streams.get(stream_id)
        if stream is None or not isinstance(stream.header, header_type):
            raise UsageError(f"no open {header_type.__name__} stream {stream_id}")
        return stream

    def _write_stream(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        if self.closed:
            raise UsageError("session is closed")
        self._quic.send_stream_data(stream_id, data, end_stream)
        if end_stream:
            self._stream_closed(self._out_streams.pop(stream_id))

    def _stream_closed(self, stream: _OutStream) -> None:
        """A fetch is over once its stream is; the request's credit returns."""
        if isinstance(stream.header, FetchHeader):
            self._finish_peer_request(stream.request_id)

    def _fail(self, code: int, reason: str) -> None:
        logger.info("moqt session closing: %s (%#x)", reason, code)
        self.close(code, reason)
        self._events.append(ev.SessionClosed(code, reason, False))
