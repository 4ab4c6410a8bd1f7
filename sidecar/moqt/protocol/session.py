"""A sans-I/O MoQT session over a QUIC connection, in the style of aioquic's H3Connection.

How an adapter drives it:

* Build the QUIC connection (aioquic or qh3, the ALPN of a draft in ``drafts``), then
  ``MoqtSession(quic, is_client=..., draft=...)`` with the draft the ALPN named. A client
  session queues CLIENT_SETUP at once.
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
through ``objects`` (``outgoing.Outgoing``): streams opened with ``open_subgroup`` /
``open_fetch_stream`` and written with ``send_object`` / ``send_fetch_object``, or datagrams.
What arrives on the peer's data streams is placed by ``incoming.Incoming``; request ids both
ways are counted by ``request_ids.RequestIds``. Local misuse raises ``UsageError``
(``RequestLimitReached`` when the peer's request limit is reached).

The QUIC object is duck-typed (``QuicConnectionLike``) and QUIC events are recognised by class
name, so aioquic and qh3 both work without importing either here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from . import events as ev
from .connection import QuicConnectionLike, SessionLimits
from .drafts import DRAFT_14, Draft
from .errors import (
    FetchErrorCode,
    ProtocolError,
    RequestErrorCode,
    SessionErrorCode,
    UsageError,
)
from .incoming import Incoming, stream_is_client_initiated
from .messages import (
    REQUEST_OF_ERROR,
    REQUEST_OF_OK,
    ClientSetup,
    ControlMessage,
    Fetch,
    FetchCancel,
    Goaway,
    MaxRequestId,
    Namespace,
    NamespaceDone,
    Publish,
    PublishDone,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    RequestError,
    RequestOk,
    RequestsBlocked,
    ServerSetup,
    Setup,
    SetupParameters,
    StandaloneFetch,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeTracks,
    SubscribeUpdate,
    TrackStatus,
    Unsubscribe,
    UnsubscribeNamespace,
    decode_buffered,
    family_reply,
)
from .messages.parameters import authorization_token
from .model import GroupOrder
from .outgoing import Outgoing, caller_errors
from .request_ids import RequestIds
from .request_streams import RequestStreams, stream_is_unidirectional, withdrawal
from .session_namespaces import NamespaceRequests, pop_if
from .session_requests import Requests

logger = logging.getLogger(__name__)

MAX_EARLY_BYTES = 64 * 1024
"""What a draft-18 peer may send on request streams before its SETUP arrives."""


class MoqtSession(Requests, NamespaceRequests):
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
        draft: Draft = DRAFT_14,
    ) -> None:
        self._quic = quic
        self.is_client = is_client
        self.draft = draft
        """The draft this session speaks (the ALPN's; under `moq-00`, draft 14's SETUP)."""
        self.limits = limits or SessionLimits()
        self._now = now
        self._implementation = implementation
        self._events: list[ev.MoqtEvent] = []
        self.closed = False
        self.setup_complete = False
        self.peer_parameters: SetupParameters | None = None
        self._goaway_received = False

        self._control_stream_id: int | None = None  # where our control messages go
        self._control_in_id: int | None = None  # where the peer's come (the same stream
        # until draft 18, where each side has a unidirectional one)
        self._control_buffer = bytearray()
        self._early: list[tuple[int, bytes, bool]] = []  # request streams before SETUP
        self._early_bytes = 0

        self._ids = RequestIds(
            is_client,
            self.limits.request_window,
            in_order=not draft.namespace_streams,
            credit=not draft.request_streams,
        )

        self._inbound: dict[int, ControlMessage] = {}  # peer's requests still open
        self._answered: set[int] = set()  # ... of which we have answered
        self._outbound: dict[int, ControlMessage] = {}  # our requests awaiting a reply
        self._announced: dict[tuple[bytes, ...], int] = {}  # our PUBLISH_NAMESPACEs
        self._namespace_subscriptions: dict[tuple[bytes, ...], int] = {}  # ours
        # Draft 18: our SUBSCRIBE_TRACKS beside each SUBSCRIBE_NAMESPACE, by the latter's id
        # (what answers them is not reported: the namespace subscription's reply is).
        self._track_subscriptions: dict[int, int] = {}

        self._request_streams = RequestStreams(quic, draft, is_client)
        self._incoming = Incoming(
            quic, self.limits, self._ids, self._emit, draft, fetch_over=self._request_streams.finish
        )
        self.objects = Outgoing(
            quic,
            closed=lambda: self.closed,
            fetch_accepted=self._fetch_accepted,
            fetch_over=self._finish_peer_request,
            draft=draft,
        )
        """Objects this session sends: subgroup and FETCH streams, datagrams."""

        if is_client or draft.request_streams:
            params = SetupParameters(
                path=path,
                max_request_id=None if draft.request_streams else self._ids.granted,
                authorization_tokens=()
                if authorization is None
                else (authorization_token(authorization, draft),),
                authority=authority,
                implementation=implementation,
            )
        if draft.request_streams:  # each side opens its own control stream, SETUP first
            self._control_stream_id = quic.get_next_available_stream_id(True)
            self._send(Setup(params))
        elif is_client:
            self._control_stream_id = self._control_in_id = quic.get_next_available_stream_id()
            versions = () if draft.setup_version is None else (draft.setup_version,)
            self._send(ClientSetup(versions, params))

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
        self._incoming.tick(now)

    def awaiting(self) -> bool:
        """Whether the peer owes us something: an answer, a FETCH's stream, the rest of an
        open data stream. Only then is its silence a sign that it is gone."""
        return bool(self._outbound) or self._incoming.awaiting()

    def next_timer(self) -> float | None:
        """When ``tick`` has work next, or None."""
        return self._incoming.next_timer()

    def close(self, error_code: int = SessionErrorCode.NO_ERROR, reason: str = "") -> None:
        """Close the QUIC connection. The caller knows, so no ``SessionClosed`` follows."""
        if not self.closed:
            self.closed = True
            self._quic.close(error_code=error_code, reason_phrase=reason)

    # ----------------------------------------------------------------------------------------
    # QUIC events.

    def _on_stream_data(self, event: Any) -> None:
        stream_id: int = event.stream_id
        if stream_is_unidirectional(stream_id):
            if self._peer_control(stream_id, event.data):
                self._on_control_data(stream_id, event.data, event.end_stream)
            else:
                self._incoming.stream_data(
                    stream_id, event.data, event.end_stream, is_client=self.is_client, now=self._now
                )
        elif self._request_streams.carries(stream_id, self._control_in_id):
            self._on_request_stream(stream_id, event.data, event.end_stream)
        else:
            self._on_control_data(stream_id, event.data, event.end_stream)

    def _peer_control(self, stream_id: int, data: bytes) -> bool:
        """Whether a unidirectional stream is the peer's control stream (draft 18: its type
        is SETUP's, 0x2F00, whose first byte no data stream type starts with)."""
        if not self.draft.request_streams:
            return False
        if self._control_in_id is not None:
            return stream_id == self._control_in_id
        return stream_is_client_initiated(stream_id) != self.is_client and data[:1] == b"\xaf"

    def _on_stream_reset(self, event: Any) -> None:
        stream_id: int = event.stream_id
        if stream_id in (self._control_stream_id, self._control_in_id):
            raise ProtocolError("control stream reset")
        if not self._request_stream_withdrawn(stream_id):
            self._incoming.stream_reset(stream_id, event.error_code)

    def _on_stop_sending(self, event: Any) -> None:
        if event.stream_id in (self._control_stream_id, self._control_in_id):
            raise ProtocolError("STOP_SENDING on the control stream")
        if self._request_stream_withdrawn(event.stream_id):
            return
        request_id = self.objects.stop_sending(event.stream_id, event.error_code)
        if request_id is not None:
            self._events.append(ev.DataStreamStopped(event.stream_id, request_id, event.error_code))

    def _on_datagram(self, event: Any) -> None:
        self._incoming.datagram(event.data)

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
        if self._control_in_id is None:
            if self.draft.request_streams:
                self._control_in_id = stream_id
            elif not self.is_client and stream_is_client_initiated(stream_id):
                self._control_stream_id = self._control_in_id = stream_id
        if stream_id != self._control_in_id:
            raise ProtocolError(f"stream {stream_id} besides the control stream")
        self._control_buffer += data
        for message in decode_buffered(self._control_buffer, self.draft):
            if self.closed:
                break
            self._on_control_message(message)
        if end_stream:
            raise ProtocolError("control stream closed")

    def _on_control_message(self, message: ControlMessage) -> None:
        if not self.setup_complete:
            self._on_setup(message)
            return
        if self.draft.request_streams and not isinstance(message, Goaway):
            raise ProtocolError(f"{type(message).__name__} on the control stream")
        self._dispatch(message)

    def _dispatch(self, message: ControlMessage) -> None:
        """Handle a message of the control stream or of a request's stream."""
        if message.NEW_REQUEST:
            self._ids.accept_peer(message.request_id)  # type: ignore[attr-defined]
        handler = self._CONTROL_HANDLERS.get(type(message))
        if handler is None:
            raise ProtocolError(f"unexpected {type(message).__name__}")
        handler(self, message)

    def _on_setup(self, message: ControlMessage) -> None:
        if self.draft.request_streams:
            if not isinstance(message, Setup):
                raise ProtocolError(f"expected SETUP, got {type(message).__name__}")
        elif self.is_client:
            if not isinstance(message, ServerSetup):
                raise ProtocolError(f"expected SERVER_SETUP, got {type(message).__name__}")
            if message.version != self.draft.setup_version:
                raise ProtocolError(
                    f"server chose version {message.version!r}",
                    SessionErrorCode.VERSION_NEGOTIATION_FAILED,
                )
        else:
            if not isinstance(message, ClientSetup):
                raise ProtocolError(f"expected CLIENT_SETUP, got {type(message).__name__}")
            version = self.draft.setup_version
            if version is not None and version not in message.versions:
                raise ProtocolError(
                    "no common version", SessionErrorCode.VERSION_NEGOTIATION_FAILED
                )
            reply = SetupParameters(
                max_request_id=self._ids.granted, implementation=self._implementation
            )
            self._send(ServerSetup(version, reply))
        params = message.parameters
        self.setup_complete = True
        self.peer_parameters = params
        self._ids.limit = params.max_request_id or 0
        self._events.append(ev.SetupCompleted(self.draft, params))
        early, self._early = self._early, []
        for stream_id, data, end_stream in early:
            self._on_request_stream(stream_id, data, end_stream)

    # Requests' own streams (draft 16's namespace subscriptions; every request of draft 18).

    def _on_request_stream(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        if not self.setup_complete:
            # Draft 18 lets a peer send requests before our SETUP reached it: they wait
            # for the peer's (a bounded amount).
            self._early_bytes += len(data)
            if not self.draft.request_streams or self._early_bytes > MAX_EARLY_BYTES:
                raise ProtocolError("a request stream before SETUP")
            self._early.append((stream_id, data, end_stream))
            return
        if self._request_streams.stale(stream_id):
            return  # the rest of a request that is over
        stream, messages = self._request_streams.received(stream_id, data)
        for message in messages:
            if self.closed:
                return
            if isinstance(message, Namespace | NamespaceDone):
                self._on_namespace_told(stream, message)
            else:
                self._dispatch(message)
        if end_stream:
            if stream.buffer or stream.request is None:
                raise ProtocolError("a request's stream ended inside a message")
            self._request_streams.ended(stream_id)
            if isinstance(stream.request, SubscribeNamespace):
                self._namespace_stream_over(stream)

    def _request_stream_withdrawn(self, stream_id: int) -> bool:
        """The peer reset a request's stream or asked us to stop sending on it: the request
        is withdrawn (draft 18's UNSUBSCRIBE, FETCH_CANCEL, ...). False: no request's."""
        stream = self._request_streams.withdrawn(stream_id)
        if stream is None:
            return False
        if isinstance(stream.request, SubscribeNamespace):
            self._namespace_stream_over(stream)
            return True
        message = withdrawal(stream)
        if message is not None:
            self._CONTROL_HANDLERS[type(message)](self, message)
        return True

    # Requests from the peer.

    def _on_subscribe(self, message: Subscribe) -> None:
        for request_id, request in self._inbound.items():
            if isinstance(request, Subscribe) and request.track == message.track:
                raise ProtocolError(f"second subscription {request_id} to {message.track}")
        self._inbound[message.request_id] = message
        self._events.append(ev.SubscribeRequested(message))

    def _on_subscribe_update(self, message: SubscribeUpdate) -> None:
        target = message.subscription_request_id
        subscription = self.objects.has_track(target) or isinstance(
            self._inbound.get(target), Subscribe
        )
        if not subscription and not (self.draft.request_replies and target in self._inbound):
            raise ProtocolError(f"update of unknown subscription {target}")
        self._grant_credit()  # an update takes an id but leaves nothing open
        if not subscription:
            # Draft 16 lets a FETCH or a namespace request be updated too: refused, in words.
            reason = "kvmoq updates subscriptions only"
            self._send(RequestError(message.request_id, RequestErrorCode.NOT_SUPPORTED, 0, reason))
            return
        if self.draft.request_replies:
            self._send(RequestOk(message.request_id))
        self._events.append(ev.SubscribeUpdated(message))

    def _on_unsubscribe(self, message: Unsubscribe) -> None:
        request_id = message.request_id
        known = self.objects.drop_track(request_id) is not None
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
            if not isinstance(joined, Subscribe) or not self.objects.has_track(
                target.joining_request_id
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
            self.objects.fetch_cancelled(message.request_id)
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
        self._incoming.pushed(message.request_id, message.track, message.track_alias)
        self._events.append(ev.PublishRequested(message))

    def _on_track_status(self, message: TrackStatus) -> None:
        self._inbound[message.request_id] = message
        self._events.append(ev.TrackStatusRequested(message))

    # Replies to our requests.

    def _on_request_reply(self, message: RequestOk | RequestError) -> None:
        """Draft 16's REQUEST_OK or REQUEST_ERROR, handled as the reply of the request's
        family; to an update (which only draft 16 answers) there is nothing more to do."""
        request = self._outbound.get(message.request_id)
        if request is None:
            raise ProtocolError(f"a reply to request {message.request_id}, which awaits none")
        if isinstance(request, SubscribeUpdate):
            del self._outbound[message.request_id]
            if isinstance(message, RequestError):
                self._events.append(ev.RequestRejected(message.request_id, message))
            return
        reply = family_reply(message, request)
        self._CONTROL_HANDLERS[type(reply)](self, reply)

    def _on_ok(self, message: Any) -> None:
        request = self._take_reply(message, REQUEST_OF_OK)
        if isinstance(request, SubscribeTracks):
            return
        if isinstance(request, TrackStatus):
            self._request_streams.finish(message.request_id)
        elif isinstance(request, Fetch) and request.group_order == GroupOrder.PUBLISHER_DEFAULT:
            # The publisher's order, which a draft-18 FETCH stream counts its groups in.
            descending = message.group_order == GroupOrder.DESCENDING
            self._incoming.fetch(message.request_id, descending)
        self._events.append(ev.RequestAccepted(message.request_id, message))
        if isinstance(message, SubscribeOk):
            self._incoming.accepted(message.request_id, message.track_alias)

    def _on_error(self, message: Any) -> None:
        request = self._take_reply(message, REQUEST_OF_ERROR)
        request_id = message.request_id
        self._request_streams.finish(request_id)
        if isinstance(request, SubscribeTracks):
            logger.info("moqt session: the peer offers no tracks under %r", request.namespace)
            return
        if isinstance(request, Subscribe):
            self._incoming.forget(request_id)
        elif isinstance(request, Publish):
            self.objects.drop_track(request_id)
        elif isinstance(request, Fetch):
            self._incoming.fetch_refused(request_id)
        elif isinstance(request, PublishNamespace):
            pop_if(self._announced, request.namespace, request_id)
        elif isinstance(request, SubscribeNamespace):
            pop_if(self._namespace_subscriptions, request.namespace, request_id)
            tracks = self._track_subscriptions.pop(request_id, None)
            stream = None if tracks is None else self._request_streams.of(tracks)
            if stream is not None:  # its SUBSCRIBE_TRACKS goes with it
                self._request_streams.cancel(stream)
                self._outbound.pop(tracks, None)  # type: ignore[arg-type]
        self._events.append(ev.RequestRejected(request_id, message))

    def _on_publish_done(self, message: PublishDone) -> None:
        if not self._incoming.ended(message.request_id, self._now):
            return
        self._request_streams.finish(message.request_id)
        if isinstance(self._inbound.get(message.request_id), Publish):
            self._finish_peer_request(message.request_id)
        self._events.append(ev.SubscriptionEnded(message.request_id, message))

    def _on_goaway(self, message: Goaway) -> None:
        if self._goaway_received:
            raise ProtocolError("second GOAWAY")
        if not self.is_client and message.new_session_uri:
            raise ProtocolError("GOAWAY from a client names a URI")
        self._goaway_received = True
        self._events.append(ev.GoawayReceived(message.new_session_uri))

    def _on_max_request_id(self, message: MaxRequestId) -> None:
        self._ids.raise_limit(message.request_id)
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
        PublishNamespace: NamespaceRequests._on_publish_namespace,
        PublishNamespaceDone: NamespaceRequests._on_publish_namespace_done,
        PublishNamespaceCancel: NamespaceRequests._on_publish_namespace_cancel,
        SubscribeNamespace: NamespaceRequests._on_subscribe_namespace,
        SubscribeTracks: NamespaceRequests._on_subscribe_namespace,
        UnsubscribeNamespace: NamespaceRequests._on_unsubscribe_namespace,
        **dict.fromkeys(REQUEST_OF_OK, _on_ok),
        **dict.fromkeys(REQUEST_OF_ERROR, _on_error),
        RequestOk: _on_request_reply,
        RequestError: _on_request_reply,
        PublishDone: _on_publish_done,
        Goaway: _on_goaway,
        MaxRequestId: _on_max_request_id,
        RequestsBlocked: _on_requests_blocked,
    }

    # ----------------------------------------------------------------------------------------
    # Helpers.

    def _send(self, message: ControlMessage) -> None:
        """Encode and queue a control message, on the stream of the request it concerns
        where the draft puts it there (`RequestStreams.route`), else on the control stream;
        raises before anything is written."""
        if self.closed:
            raise UsageError("session is closed")
        if self._request_streams.route(message):
            return
        if self._control_stream_id is None:
            raise UsageError("the client has not opened the control stream yet")
        with caller_errors():
            data = message.encode(self.draft)
        self._quic.send_stream_data(self._control_stream_id, data, False)

    def _request(self, message: Any, expects_reply: bool = True) -> int:
        """Send a request numbered by ``_next_id`` (``RequestIds.take``)."""
        self._send(message)
        self._ids.spent()
        if expects_reply:
            self._outbound[message.request_id] = message
        return message.request_id

    def _next_id(self) -> int:
        """The id the next request will take, if the session and the peer's limit allow one."""
        if not self.setup_complete or self.closed:
            raise UsageError("session is not established")
        blocked = self._ids.blocked()
        if blocked is not None:
            self._send(RequestsBlocked(blocked))
        return self._ids.take()

    def _finish_peer_request(self, request_id: int) -> None:
        """Forget a peer request that is over, and return its credit."""
        if self._inbound.pop(request_id, None) is None:
            return
        self._answered.discard(request_id)
        self._request_streams.finish(request_id)
        self._grant_credit()

    def _grant_credit(self) -> None:
        limit = self._ids.peer_finished()
        if limit is not None:
            self._send(MaxRequestId(limit))

    def _fetch_accepted(self, request_id: int) -> bool:
        """Whether the peer's FETCH ``request_id`` got our FETCH_OK and is not over."""
        return isinstance(self._inbound.get(request_id), Fetch) and request_id in self._answered

    def _emit(self, event: ev.MoqtEvent) -> None:
        self._events.append(event)

    def _answerable(self, request_id: int, request_type: type[ControlMessage]) -> Any:
        """The peer's open request ``request_id`` of ``request_type`` that awaits our answer."""
        request = self._inbound.get(request_id)
        if not isinstance(request, request_type) or request_id in self._answered:
            raise UsageError(f"no unanswered {request_type.__name__} {request_id}")
        return request

    def _reply(self, message: Any) -> None:
        """Answer a request of the peer's (on its own stream where it has one: a refusal
        closes that)."""
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

    def _fail(self, code: int, reason: str) -> None:
        logger.info("moqt session closing: %s (%#x)", reason, code)
        self.close(code, reason)
        self._events.append(ev.SessionClosed(code, reason, False))
