"""The namespace half of a MoQT session: announcing namespaces (PUBLISH_NAMESPACE and its
withdrawal), following them (SUBSCRIBE_NAMESPACE), and telling followers, in each draft's way.

`MoqtSession` is a `NamespaceRequests`: these methods are its own, kept apart because the
drafts differ most here. Draft 14 carries everything on the control stream; from draft 16 a
namespace subscription has a stream of its own (`request_streams.RequestStreams`), where its
reply, then NAMESPACE and NAMESPACE_DONE come, and closing it unsubscribes; withdrawal and
cancellation name the request instead of the namespace (draft 18: they reset its stream).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from . import events as ev
from .errors import ProtocolError, UsageError
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
    SubscribeNamespace,
    SubscribeNamespaceOk,
    SubscribeTracks,
    UnsubscribeNamespace,
)
from .model import has_prefix
from .session_requests import SessionPart

if TYPE_CHECKING:
    from .request_ids import RequestIds
    from .request_streams import RequestStream, RequestStreams


def pop_if(table: dict[tuple[bytes, ...], int], key: tuple[bytes, ...], request_id: int) -> None:
    """Forget ``key`` only if it still belongs to ``request_id`` (not to a later request)."""
    if table.get(key) == request_id:
        del table[key]


class NamespaceRequests(SessionPart):
    """See the module docstring; the attributes below are the session's."""

    setup_complete: bool
    _ids: RequestIds
    _inbound: dict[int, ControlMessage]
    _outbound: dict[int, ControlMessage]
    _events: list[ev.MoqtEvent]
    _announced: dict[tuple[bytes, ...], int]
    _namespace_subscriptions: dict[tuple[bytes, ...], int]
    _track_subscriptions: dict[int, int]
    _request_streams: RequestStreams

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
        request_id = self._request(SubscribeNamespace(self._next_id(), prefix, parameters))
        self._namespace_subscriptions[prefix] = request_id
        if self.draft.request_streams:  # the tracks, draft 18 asks for apart; quietly
            tracks = SubscribeTracks(self._next_id(), prefix, parameters, NamespaceOptions.PUBLISH)
            self._track_subscriptions[request_id] = self._request(tracks)
        return request_id

    def unsubscribe_namespace(self, prefix: tuple[bytes, ...]) -> None:
        request_id = self._namespace_subscriptions.pop(prefix, None)
        if request_id is None:
            raise UsageError(f"no namespace subscription {prefix!r}")
        if not self.draft.namespace_streams:
            self._send(UnsubscribeNamespace(prefix))
            return
        tracks = self._track_subscriptions.pop(request_id, None)
        for each in (request_id,) if tracks is None else (request_id, tracks):
            stream = self._request_streams.of(each)
            if stream is not None:  # closing its stream ends a subscription
                self._request_streams.close(stream)

    def tell_namespace(self, namespace: tuple[bytes, ...]) -> None:
        """Tell the peer of a namespace published here: on each of its namespace
        subscriptions that hear of it (draft 16's NAMESPACE), else as PUBLISH_NAMESPACE."""
        streams = self._request_streams.announcing(namespace)
        if not streams and not self._namespace_subscribed(namespace):
            self.publish_namespace(namespace)
        for stream, message in streams:
            self._request_streams.tell(stream, message)

    def tell_namespace_done(self, namespace: tuple[bytes, ...]) -> None:
        """Undo `tell_namespace` (NAMESPACE_DONE, or PUBLISH_NAMESPACE_DONE)."""
        streams = self._request_streams.announcing(namespace)
        if not streams and not self._namespace_subscribed(namespace):
            self.publish_namespace_done(namespace)
        for stream, message in streams:
            self._request_streams.tell(stream, NamespaceDone(message.namespace))

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
        if self.draft.namespace_streams and self._request_streams.of(message.request_id) is None:
            raise ProtocolError(f"SUBSCRIBE_NAMESPACE on the control stream in {self.draft}")
        self._inbound[message.request_id] = message
        self._events.append(ev.NamespaceSubscribeRequested(message))

    def _on_unsubscribe_namespace(self, message: UnsubscribeNamespace) -> None:
        request_id = self._find_inbound(SubscribeNamespace, message.namespace)
        if request_id is not None:
            self._finish_peer_request(request_id)
            self._events.append(ev.NamespaceUnsubscribed(message.namespace))

    def _on_namespace_told(self, stream: RequestStream, message: Namespace | NamespaceDone) -> None:
        """NAMESPACE or NAMESPACE_DONE on our namespace subscription's stream."""
        full = stream.request.namespace + message.namespace  # type: ignore[union-attr]
        self._events.append(
            ev.NamespaceAnnounced(full)
            if isinstance(message, Namespace)
            else ev.NamespacePublishDone(full)
        )

    def _namespace_stream_over(self, stream: RequestStream) -> None:
        """The peer closed a namespace subscription's stream: its subscription is over, or
        (ours) the peer ended it."""
        request = stream.request
        assert isinstance(request, SubscribeNamespace)
        self._request_streams.close(stream)
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
            and self._request_streams.of(request_id) is not None
            and has_prefix(namespace, request.namespace)
            for request_id, request in self._inbound.items()
        )

    def _find_inbound(self, request_type: type[Any], namespace: tuple[bytes, ...]) -> int | None:
        for request_id, request in self._inbound.items():
            if isinstance(request, request_type) and request.namespace == namespace:
                return request_id
        return None
