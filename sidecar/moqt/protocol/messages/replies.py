"""Which request each reply answers, and which family reply draft 16's REQUEST_OK and
REQUEST_ERROR (`base`) are.

Sessions send and hear draft-14's replies (SUBSCRIBE_ERROR, TRACK_STATUS_OK, ...) whatever
the draft: under a draft with `request_replies` those go on the wire as REQUEST_OK or
REQUEST_ERROR (their own `encode` says how), and one that arrives decodes as `RequestOk` or
`RequestError`, which `family_reply` turns into the reply of the request it answers (the
session knows the request; the bytes do not say).
"""

from __future__ import annotations

from .base import ControlMessage, RequestError, RequestOk, _RequestError
from .fetch import Fetch, FetchError, FetchOk
from .namespace import (
    PublishNamespace,
    PublishNamespaceError,
    PublishNamespaceOk,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeTracks,
)
from .publish import Publish, PublishError, PublishOk
from .subscribe import Subscribe, SubscribeError, SubscribeOk
from .track_status import TrackStatus, TrackStatusError, TrackStatusOk

_ERRORS: dict[type[ControlMessage], type[_RequestError]] = {
    Subscribe: SubscribeError,
    Publish: PublishError,
    Fetch: FetchError,
    TrackStatus: TrackStatusError,
    PublishNamespace: PublishNamespaceError,
    SubscribeNamespace: SubscribeNamespaceError,
}
REQUEST_OF_ERROR = {error: request for request, error in _ERRORS.items()}
"""The request each *_ERROR refuses (any of its kind)."""
ERROR_OF_REQUEST = {**_ERRORS, SubscribeTracks: SubscribeNamespaceError}
"""The *_ERROR that refuses each request."""
REQUEST_OF_OK: dict[type[ControlMessage], type[ControlMessage]] = {
    SubscribeOk: Subscribe,
    PublishOk: Publish,
    FetchOk: Fetch,
    TrackStatusOk: TrackStatus,
    PublishNamespaceOk: PublishNamespace,
    SubscribeNamespaceOk: SubscribeNamespace,
}
"""The request each *_OK answers."""

READ_AS: dict[type[ControlMessage], dict[int, type[ControlMessage]]] = {
    Publish: {RequestOk.TYPE: PublishOk},
}
"""Per request, the types that mean its own reply on its stream (draft 18: a REQUEST_OK on a
PUBLISH's stream is PUBLISH_OK, its fields as parameters)."""


def family_reply(reply: RequestOk | RequestError, request: ControlMessage) -> ControlMessage:
    """The draft-14 reply that `reply` is, given the `request` it answers. A REQUEST_OK to
    a request that has a reply of its own (SUBSCRIBE, PUBLISH, FETCH) or to an update stays
    as it is: the session judges it."""
    if isinstance(reply, RequestError):
        error = ERROR_OF_REQUEST.get(type(request))
        if error is None:
            return reply
        return error.from_request_error(reply)
    if isinstance(request, TrackStatus):
        return TrackStatusOk(
            reply.request_id, 0, reply.expires, largest=reply.largest, parameters=reply.parameters
        )
    if isinstance(request, PublishNamespace):
        return PublishNamespaceOk(reply.request_id)
    if isinstance(request, SubscribeNamespace):
        return SubscribeNamespaceOk(reply.request_id)
    return reply
