"""Requests on bidirectional streams of their own: draft 16's namespace subscriptions, and
every request of draft 18.

Such a stream starts with its request; what answers, updates or ends the request follows on
it, and draft 18 leaves the request id out of those (the stream names it: `received` fills
it in, so the session handles the same messages in every draft). A request is withdrawn by
closing its stream: draft 18 has no UNSUBSCRIBE, FETCH_CANCEL, PUBLISH_NAMESPACE_DONE or
_CANCEL, so `route` turns those into a reset of our side and STOP_SENDING of the peer's, and
the session hears the peer's resets as those messages (`withdrawal`).

`RequestStreams` only moves messages between streams and requests; what a message means is
the session's.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field

from .connection import QuicConnectionLike
from .drafts import Draft
from .errors import ProtocolError, PublishDoneStatus, StreamResetCode
from .incoming import stream_is_client_initiated
from .messages import (
    ERROR_OF_REQUEST,
    ON_STREAM,
    ClientSetup,
    ControlMessage,
    Fetch,
    FetchCancel,
    FetchError,
    Goaway,
    MaxRequestId,
    Namespace,
    NamespaceDone,
    NamespaceOptions,
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
    Subscribe,
    SubscribeNamespace,
    SubscribeUpdate,
    TrackStatus,
    TrackStatusOk,
    Unsubscribe,
    decode_buffered,
)
from .messages.replies import READ_AS
from .model import has_prefix
from .outgoing import caller_errors

OPENERS = (Subscribe, Publish, Fetch, TrackStatus, PublishNamespace, SubscribeNamespace)
"""The requests that open a stream in draft 18 (draft 16: SUBSCRIBE_NAMESPACE alone)."""
SESSION_MESSAGES = (ClientSetup, ServerSetup, Setup, Goaway, MaxRequestId, RequestsBlocked)
"""What concerns the session, not a request: the control stream's."""
WITHDRAWALS = (Unsubscribe, FetchCancel, PublishNamespaceDone, PublishNamespaceCancel)
"""Draft 14's messages that end a request; draft 18 resets the request's stream instead."""
_LAST = (PublishDone, TrackStatusOk, RequestError, *ERROR_OF_REQUEST.values())
"""What ends our side of a request's stream once sent: nothing follows it there."""


def stream_is_unidirectional(stream_id: int) -> bool:
    return bool(stream_id & 0x2)


@dataclass(slots=True)
class RequestStream:
    """One request's stream. `request` is None on a peer's stream until its request came;
    `answered` once the request's own reply went either way; `updates` are our
    REQUEST_UPDATEs on it that await their replies, oldest first; `peer_updates` the
    peer's that we have not answered."""

    stream_id: int
    ours: bool
    request: ControlMessage | None = None
    answered: bool = False
    updates: deque[int] = field(default_factory=deque)
    peer_updates: list[int] = field(default_factory=list)
    buffer: bytearray = field(default_factory=bytearray)
    sent_end: bool = False
    received_end: bool = False


class RequestStreams:
    """The requests' streams of one session, ours and the peer's."""

    def __init__(self, quic: QuicConnectionLike, draft: Draft, is_client: bool) -> None:
        self._quic = quic
        self._draft = draft
        self._is_client = is_client
        self._streams: dict[int, RequestStream] = {}
        self._by_request: dict[int, RequestStream] = {}
        self._newest_peer_stream = -1

    def of(self, request_id: int) -> RequestStream | None:
        return self._by_request.get(request_id)

    def carries(self, stream_id: int, control_stream_id: int | None) -> bool:
        """Whether a bidirectional stream is a request's: in draft 18 every one is; in
        draft 16 ours and the peer's after the control stream."""
        if self._draft.request_streams or stream_id in self._streams:
            return True
        return (
            self._draft.namespace_streams
            and control_stream_id is not None
            and stream_id != control_stream_id
            and stream_is_client_initiated(stream_id) != self._is_client
        )

    def opens(self, message: ControlMessage) -> bool:
        """Whether `message`, a request, goes on a new stream of its own (ours, or the
        first message of a stream the peer opened)."""
        if self._draft.request_streams:
            return isinstance(message, OPENERS)
        return self._draft.namespace_streams and isinstance(message, SubscribeNamespace)

    # ------------------------------------------------------------------------------------
    # Sending.

    def route(self, message: ControlMessage) -> bool:
        """Send `message` on the stream of the request it concerns, where that request has
        one (a new request that `opens` one gets it now); False: it goes on the control
        stream. In draft 18 only GOAWAY does: what concerns a request whose stream is gone
        (withdrawn, or ended both ways) is not sent at all."""
        if self.opens(message):
            self._open(message)
            return True
        if isinstance(message, SESSION_MESSAGES):
            return False
        anchor = (
            message.subscription_request_id
            if isinstance(message, SubscribeUpdate)
            else getattr(message, "request_id", None)
        )
        stream = None if anchor is None else self._by_request.get(anchor)
        if stream is None or stream.sent_end:
            return stream is not None or self._draft.request_streams
        if isinstance(message, WITHDRAWALS):
            self.cancel(stream)
            return True
        with caller_errors():
            data = message.encode(self._draft)
        end = False
        if isinstance(message, SubscribeUpdate):
            stream.updates.append(message.request_id)
        elif anchor in stream.peer_updates:  # our answer to the peer's update
            stream.peer_updates.remove(anchor)
            del self._by_request[anchor]
        else:
            stream.answered = True
            end = isinstance(message, _LAST)
        self._quic.send_stream_data(stream.stream_id, data, end)
        if end:
            self._sent_end(stream)
        return True

    def _open(self, request: ControlMessage) -> None:
        with caller_errors():
            data = request.encode(self._draft)
        stream_id = self._quic.get_next_available_stream_id(False)
        stream = RequestStream(stream_id, ours=True, request=request)
        self._streams[stream_id] = stream
        self._by_request[request.request_id] = stream  # type: ignore[attr-defined]
        self._quic.send_stream_data(stream_id, data, False)

    def close(self, stream: RequestStream) -> None:
        """End our side (FIN): this side says no more on the request."""
        if not stream.sent_end:
            self._quic.send_stream_data(stream.stream_id, b"", True)
            self._sent_end(stream)

    def finish(self, request_id: int) -> None:
        """The request is over for the session: our side ends, if it has not."""
        stream = self._by_request.get(request_id)
        if stream is not None:
            self.close(stream)

    def cancel(self, stream: RequestStream) -> None:
        """Withdraw the request: reset our side, ask the peer to stop sending on its."""
        if not stream.sent_end:
            self._quic.reset_stream(stream.stream_id, StreamResetCode.CANCELLED)
        if not stream.received_end:
            self._quic.stop_stream(stream.stream_id, StreamResetCode.CANCELLED)
        stream.sent_end = stream.received_end = True
        self._forget(stream)

    def _sent_end(self, stream: RequestStream) -> None:
        stream.sent_end = True
        if stream.received_end:
            self._forget(stream)

    def _forget(self, stream: RequestStream) -> None:
        self._streams.pop(stream.stream_id, None)
        if stream.request is not None:
            self._by_request.pop(stream.request.request_id, None)  # type: ignore[attr-defined]
        for update in stream.peer_updates:
            self._by_request.pop(update, None)

    # ------------------------------------------------------------------------------------
    # Receiving.

    def stale(self, stream_id: int) -> bool:
        """A stream we forgot (both sides ended, or withdrawn): what still comes on it
        is late, not a new request."""
        if stream_id in self._streams:
            return False
        if stream_is_client_initiated(stream_id) != self._is_client:
            return stream_id <= self._newest_peer_stream
        return True

    def received(self, stream_id: int, data: bytes) -> tuple[RequestStream, list[ControlMessage]]:
        """The messages `data` completes on a request's stream (a new one is the peer's),
        each with the request id its stream names. What waits for the rest of a message is
        one message at most (its length is 16 bits)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            stream = self._streams[stream_id] = RequestStream(stream_id, ours=False)
            self._newest_peer_stream = max(self._newest_peer_stream, stream_id)
        stream.buffer += data
        request_type = None if stream.request is None else type(stream.request)
        read_as = READ_AS.get(request_type) if stream.ours else None  # type: ignore[arg-type]
        messages = decode_buffered(stream.buffer, self._draft, read_as)
        return stream, [self._named(stream, message) for message in messages]

    def _named(self, stream: RequestStream, message: ControlMessage) -> ControlMessage:
        """`message` with the ids its stream gives it, checked against what may come there."""
        if stream.request is None:  # the peer's first: its request
            if stream.ours or not self.opens(message):
                raise ProtocolError(f"a request stream opened by {type(message).__name__}")
            stream.request = message
            self._by_request[message.request_id] = stream  # type: ignore[attr-defined]
            return message
        own_id: int = stream.request.request_id  # type: ignore[attr-defined]
        if isinstance(message, SubscribeUpdate):
            if message.subscription_request_id == ON_STREAM:
                message = dataclasses.replace(message, subscription_request_id=own_id)
            stream.peer_updates.append(message.request_id)
            self._by_request[message.request_id] = stream
            return message
        if isinstance(message, (*OPENERS, Goaway)):
            raise ProtocolError(f"{type(message).__name__} on another request's stream")
        if isinstance(message, Namespace | NamespaceDone):
            if not (stream.ours and stream.answered):
                raise ProtocolError(f"{type(message).__name__} before the subscription's reply")
            return message
        request_id = getattr(message, "request_id", None)
        if request_id is None or request_id != ON_STREAM:
            if request_id is not None and not stream.answered and request_id != own_id:
                raise ProtocolError("a reply on a request's stream names another request")
            if request_id == own_id:
                stream.answered = True
            return message
        if isinstance(message, RequestOk | RequestError) and stream.answered and stream.updates:
            return dataclasses.replace(message, request_id=stream.updates.popleft())
        if not isinstance(message, PublishDone):
            stream.answered = True
        return dataclasses.replace(message, request_id=own_id)

    def ended(self, stream_id: int) -> RequestStream | None:
        """The peer ended its side (FIN); the stream, if it was a request's."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.received_end = True
            if stream.sent_end:
                self._forget(stream)
        return stream

    def withdrawn(self, stream_id: int) -> RequestStream | None:
        """The peer reset its side or asked us to stop sending: the request is over on
        both sides (we reset ours). The stream, if it was a request's."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return None
        if not stream.sent_end:
            self._quic.reset_stream(stream.stream_id, StreamResetCode.CANCELLED)
        stream.sent_end = stream.received_end = True
        self._forget(stream)
        return stream

    def announcing(self, namespace: tuple[bytes, ...]) -> list[tuple[RequestStream, Namespace]]:
        """The peer's accepted namespace subscriptions that hear of `namespace`, each with
        the NAMESPACE (the suffix past its prefix) it gets."""
        found = []
        for stream in self._streams.values():
            request = stream.request
            if (
                not stream.ours
                and stream.answered
                and isinstance(request, SubscribeNamespace)
                and request.options != NamespaceOptions.PUBLISH
                and has_prefix(namespace, request.namespace)
            ):
                found.append((stream, Namespace(namespace[len(request.namespace) :])))
        return found

    def tell(self, stream: RequestStream, message: ControlMessage) -> None:
        """NAMESPACE or NAMESPACE_DONE on a namespace subscription's stream."""
        self._quic.send_stream_data(stream.stream_id, message.encode(self._draft), False)


def withdrawal(stream: RequestStream) -> ControlMessage | None:
    """What the peer's reset (or STOP_SENDING) of a request's stream says, as the message
    draft 14 would have sent: None where the session has nothing to do (a namespace
    subscription's stream, which the session handles as closed; a track status)."""
    request = stream.request
    if request is None:
        return None
    request_id: int = request.request_id  # type: ignore[attr-defined]
    reason = "request stream reset"
    if stream.ours:
        if isinstance(request, Subscribe):
            return PublishDone(request_id, PublishDoneStatus.INTERNAL_ERROR, reason=reason)
        if isinstance(request, Publish):
            return Unsubscribe(request_id)
        if isinstance(request, PublishNamespace):
            return PublishNamespaceCancel(request.namespace, 0, reason, request_id)
        if isinstance(request, Fetch) and not stream.answered:
            return FetchError(request_id, 0, reason)
        return None
    if isinstance(request, Subscribe):
        return Unsubscribe(request_id)
    if isinstance(request, Fetch):
        return FetchCancel(request_id)
    if isinstance(request, PublishNamespace):
        return PublishNamespaceDone(request.namespace, request_id)
    if isinstance(request, Publish):
        return PublishDone(request_id, PublishDoneStatus.INTERNAL_ERROR, reason=reason)
    return None
