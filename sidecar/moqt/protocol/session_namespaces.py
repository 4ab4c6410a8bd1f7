"""The namespace half of a MoQT session: announcing namespaces (PUBLISH_NAMESPACE and its
withdrawal), following them (SUBSCRIBE_NAMESPACE), and telling followers, in each draft's way.

`MoqtSession` is a `NamespaceRequests`: these methods are its own, kept apart because the
drafts differ most here. Draft 14 carries everything on the control stream; from draft 16 a
namespace subscription has a stream of its own (`NamespaceStreams`, below), where its reply,
then NAMESPACE and NAMESPACE_DONE come, and closing it unsubscribes; withdrawal and
cancellation name the request instead of the namespace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import events as ev
from .connection import QuicConnectionLike
from .drafts import Draft
from .errors import ProtocolError, UsageError
from .incoming import stream_is_client_initiated
from .messages import (
    NO_PARAMETERS,
    ControlMessage,
    Namespace,
    NamespaceDone,
    NamespaceOptions,
    Parameters,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceOk,
    RequestError,
    RequestOk,
    SubscribeNamespace,
    SubscribeNamespaceOk,
    UnsubscribeNamespace,
    decode_buffered,
)
from .model import has_prefix
from .outgoing import caller_errors

if TYPE_CHECKING:
    from .request_ids import RequestIds


def pop_if(table: dict[tuple[bytes, ...], int], key: tuple[bytes, ...], request_id: int) -> None:
    """Forget ``key`` only if it still belongs to ``request_id`` (not to a later request)."""
    if table.get(key) == request_id:
        del table[key]


def stream_is_unidirectional(stream_id: int) -> bool:
    return bool(stream_id & 0x2)


class NamespaceRequests:
    """See the module docstring; the attributes below are the session's."""

    draft: Draft
    is_client: bool
    setup_complete: bool
    _ids: RequestIds
    _inbound: dict[int, ControlMessage]
    _outbound: dict[int, ControlMessage]
    _events: list[ev.MoqtEvent]
    _control_stream_id: int | None
    _announced: dict[tuple[bytes, ...], int]
    _namespace_subscriptions: dict[tuple[bytes, ...], int]
    _namespace_streams: NamespaceStreams

    def _next_id(self) -> int: ...
    def _request(
        self,
        message: Any,
        expects_reply: bool = True,
        send: Callable[[ControlMessage], None] | None = None,
    ) -> int: ...
    def _send(self, message: ControlMessage) -> None: ...
    def _reply(self, message: Any) -> None: ...
    def _answerable(self, request_id: int, request_type: type[ControlMessage]) -> Any: ...
    def _finish_peer_request(self, request_id: int) -> None: ...
    def _on_request_reply(self, message: RequestOk | RequestError) -> None: ...

    def publish_namespace(
        self, namespace: tuple[bytes, ...], parameters: Parameters = NO_PARAMETERS
    ) -> int:
        if namespace in self._announced:
            raise UsageError(f"namespace {namespace!r} already published")
        request_id = self._request(PublishNamespace(self._next_id(), namespace, parameters))
        self._announced[namespace] = request_id
        return request_id

    def publish_namespace_done(self, namespace: tuple[bytes, ...]) -> None:
        request_id = self._announced.pop(namespace, None)
        if request_id is None:
            raise UsageError(f"namespace {namespace!r} is not published")
        self._send(PublishNamespaceDone(namespace, request_id))

    def subscribe_namespace(
        self, prefix: tuple[bytes, ...], parameters: Parameters = NO_PARAMETERS
    ) -> int:
        if prefix in self._namespace_subscriptions:
            raise UsageError(f"already subscribed to namespace prefix {prefix!r}")
        request = SubscribeNamespace(self._next_id(), prefix, parameters)
        own_stream = self._namespace_streams.open if self.draft.namespace_streams else None
        request_id = self._request(request, send=own_stream)
        self._namespace_subscriptions[prefix] = request_id
        return request_id

    def unsubscribe_namespace(self, prefix: tuple[bytes, ...]) -> None:
        request_id = self._namespace_subscriptions.pop(prefix, None)
        if request_id is None:
            raise UsageError(f"no namespace subscription {prefix!r}")
        stream = self._namespace_streams.of(request_id)
        if stream is not None:
            self._namespace_streams.close(stream)
        elif not self.draft.namespace_streams:
            self._send(UnsubscribeNamespace(prefix))

    def tell_namespace(self, namespace: tuple[bytes, ...]) -> None:
        """Tell the peer of a namespace published here: on each of its namespace
        subscriptions that hear of it (draft 16's NAMESPACE), else as PUBLISH_NAMESPACE."""
        streams = self._namespace_streams.announcing(namespace)
        if not streams and not self._namespace_subscribed(namespace):
            self.publish_namespace(namespace)
        for stream, message in streams:
            self._namespace_streams.send(stream, message)

    def tell_namespace_done(self, namespace: tuple[bytes, ...]) -> None:
        """Undo `tell_namespace` (NAMESPACE_DONE, or PUBLISH_NAMESPACE_DONE)."""
        streams = self._namespace_streams.announcing(namespace)
        if not streams and not self._namespace_subscribed(namespace):
            self.publish_namespace_done(namespace)
        for stream, message in streams:
            self._namespace_streams.send(stream, NamespaceDone(message.namespace))

    def publish_namespace_ok(self, request_id: int) -> None:
        self._answerable(request_id, PublishNamespace)
        self._reply(PublishNamespaceOk(request_id))

    def subscribe_namespace_ok(self, request_id: int) -> None:
        self._answerable(request_id, SubscribeNamespace)
        self._reply(SubscribeNamespaceOk(request_id))

    def publish_namespace_cancel(
        self, namespace: tuple[bytes, ...], error_code: int, reason: str = ""
    ) -> None:
        """Stop accepting a namespace the peer published."""
        request_id = self._find_inbound(PublishNamespace, namespace)
        if request_id is None:
            raise UsageError(f"the peer has not published {namespace!r}")
        self._send(PublishNamespaceCancel(namespace, error_code, reason, request_id))
        self._finish_peer_request(request_id)

    def _on_publish_namespace(self, message: PublishNamespace) -> None:
        self._inbound[message.request_id] = message
        self._events.append(ev.NamespacePublished(message))

    def _on_publish_namespace_done(self, message: PublishNamespaceDone) -> None:
        if message.request_id is None:  # draft 14 names the namespace
            request_id = self._find_inbound(PublishNamespace, message.namespace)
        else:
            request = self._inbound.get(message.request_id)
            request_id = message.request_id if isinstance(request, PublishNamespace) else None
        if request_id is not None:
            namespace = self._inbound[request_id].namespace  # type: ignore[attr-defined]
            self._finish_peer_request(request_id)
            self._events.append(ev.NamespacePublishDone(namespace))

    def _on_publish_namespace_cancel(self, message: PublishNamespaceCancel) -> None:
        namespace = message.namespace
        if message.request_id is not None:  # draft 16 names the request
            namespace = next(
                (ns for ns, rid in self._announced.items() if rid == message.request_id), ()
            )
        if self._announced.pop(namespace, None) is not None:
            message = dataclasses.replace(message, namespace=namespace)
            self._events.append(ev.NamespacePublishCancelled(message))

    def _on_subscribe_namespace(self, message: SubscribeNamespace) -> None:
        if self.draft.namespace_streams and self._namespace_streams.of(message.request_id) is None:
            raise ProtocolError(f"SUBSCRIBE_NAMESPACE on the control stream in {self.draft}")
        self._inbound[message.request_id] = message
        self._events.append(ev.NamespaceSubscribeRequested(message))

    def _on_unsubscribe_namespace(self, message: UnsubscribeNamespace) -> None:
        request_id = self._find_inbound(SubscribeNamespace, message.namespace)
        if request_id is not None:
            self._finish_peer_request(request_id)
            self._events.append(ev.NamespaceUnsubscribed(message.namespace))

    def _namespace_stream(self, stream_id: int) -> bool:
        """Whether `stream_id` is a namespace subscription's: one we opened, or a
        bidirectional one the peer opened after the control stream."""
        if self._namespace_streams.has(stream_id):
            return True
        return (
            not stream_is_unidirectional(stream_id)
            and self._control_stream_id is not None
            and stream_id != self._control_stream_id
            and stream_is_client_initiated(stream_id) != self.is_client
        )

    def _on_namespace_stream(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        if not self.setup_complete:
            raise ProtocolError("a request stream before SETUP")
        stream, messages = self._namespace_streams.received(stream_id, data)
        for message in messages:
            if not stream.ours:
                request = self._namespace_streams.peers_first(stream, message)
                self._ids.accept_peer(request.request_id)
                self._on_subscribe_namespace(request)
            elif isinstance(message, RequestOk | RequestError) and not stream.answered:
                if message.request_id != stream.request.request_id:  # type: ignore[union-attr]
                    raise ProtocolError("a namespace subscription's reply names another request")
                stream.answered = True
                self._on_request_reply(message)
            elif isinstance(message, Namespace | NamespaceDone) and stream.answered:
                full = stream.request.namespace + message.namespace  # type: ignore[union-attr]
                self._events.append(
                    ev.NamespaceAnnounced(full)
                    if isinstance(message, Namespace)
                    else ev.NamespacePublishDone(full)
                )
            else:
                raise ProtocolError(f"{type(message).__name__} on a namespace subscription")
        if end_stream:
            self._namespace_stream_over(stream_id)

    def _namespace_stream_over(self, stream_id: int) -> None:
        """The peer closed a namespace subscription's stream: its subscription is over, or
        (ours) the peer ended it."""
        stream = self._namespace_streams.forget(stream_id)
        if stream is None or stream.request is None:
            return
        request = stream.request
        if stream.ours:
            pop_if(self._namespace_subscriptions, request.namespace, request.request_id)
            self._outbound.pop(request.request_id, None)
        elif request.request_id in self._inbound:
            self._finish_peer_request(request.request_id)
            self._events.append(ev.NamespaceUnsubscribed(request.namespace))

    def _namespace_subscribed(self, namespace: tuple[bytes, ...]) -> bool:
        """Whether a namespace subscription of the peer's (draft 16) covers `namespace`,
        whatever it asked to hear: such a peer is told of it there or not at all."""
        return any(
            isinstance(request, SubscribeNamespace)
            and self._namespace_streams.of(request_id) is not None
            and has_prefix(namespace, request.namespace)
            for request_id, request in self._inbound.items()
        )

    def _find_inbound(self, request_type: type[Any], namespace: tuple[bytes, ...]) -> int | None:
        for request_id, request in self._inbound.items():
            if isinstance(request, request_type) and request.namespace == namespace:
                return request_id
        return None


@dataclass(slots=True)
class NamespaceStream:
    """One namespace subscription's stream (draft 16). `request` is None on a peer's stream
    until its SUBSCRIBE_NAMESPACE arrived."""

    stream_id: int
    ours: bool
    request: SubscribeNamespace | None = None
    answered: bool = False
    buffer: bytearray = field(default_factory=bytearray)


class NamespaceStreams:
    """The namespace subscriptions' streams, ours and the peer's, and their messages."""

    def __init__(self, quic: QuicConnectionLike, draft: Draft) -> None:
        self._quic = quic
        self._draft = draft
        self._streams: dict[int, NamespaceStream] = {}

    def has(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def of(self, request_id: int) -> NamespaceStream | None:
        return next(
            (s for s in self._streams.values() if s.request and s.request.request_id == request_id),
            None,
        )

    def open(self, request: ControlMessage) -> None:
        """Our subscription: a new stream, the request its first message."""
        assert isinstance(request, SubscribeNamespace)
        with caller_errors():
            data = request.encode(self._draft)
        stream_id = self._quic.get_next_available_stream_id(False)
        self._streams[stream_id] = NamespaceStream(stream_id, ours=True, request=request)
        self._quic.send_stream_data(stream_id, data, False)

    def send(self, stream: NamespaceStream, message: ControlMessage, end: bool = False) -> None:
        self._quic.send_stream_data(stream.stream_id, message.encode(self._draft), end)
        if end:
            del self._streams[stream.stream_id]

    def close(self, stream: NamespaceStream) -> None:
        """End the subscription from our side (FIN); it is forgotten."""
        self._quic.send_stream_data(stream.stream_id, b"", True)
        self._streams.pop(stream.stream_id, None)

    def forget(self, stream_id: int) -> NamespaceStream | None:
        return self._streams.pop(stream_id, None)

    def received(self, stream_id: int, data: bytes) -> tuple[NamespaceStream, list[ControlMessage]]:
        """The messages `data` completes on a namespace stream (a new one is the peer's).
        What waits for the rest of a message is one message at most (its length is 16 bits)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            stream = self._streams[stream_id] = NamespaceStream(stream_id, ours=False)
        stream.buffer += data
        return stream, decode_buffered(stream.buffer, self._draft)

    def announcing(self, namespace: tuple[bytes, ...]) -> list[tuple[NamespaceStream, Namespace]]:
        """The peer's accepted subscriptions that hear of `namespace`, each with the
        NAMESPACE (the suffix past its prefix) it gets."""
        found = []
        for stream in self._streams.values():
            request = stream.request
            if (
                not stream.ours
                and stream.answered
                and request is not None
                and request.options != NamespaceOptions.PUBLISH
                and has_prefix(namespace, request.namespace)
            ):
                found.append((stream, Namespace(namespace[len(request.namespace) :])))
        return found

    def peers_first(self, stream: NamespaceStream, message: ControlMessage) -> SubscribeNamespace:
        """The first message on the peer's stream, which must be its SUBSCRIBE_NAMESPACE."""
        if stream.request is not None or not isinstance(message, SubscribeNamespace):
            raise ProtocolError(f"{type(message).__name__} on a namespace subscription's stream")
        stream.request = message
        return message
