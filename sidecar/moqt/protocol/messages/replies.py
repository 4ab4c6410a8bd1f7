"""REQUEST_OK and REQUEST_ERROR (draft 16 on), and which family reply each one is.

Sessions send and hear draft-14's replies (SUBSCRIBE_ERROR, TRACK_STATUS_OK, ...) whatever
the draft: under a draft with `request_replies` those go on the wire as REQUEST_OK or
REQUEST_ERROR (their own `encode` says how), and one that arrives decodes as `RequestOk` or
`RequestError`, which `family_reply` turns into the reply of the request it answers (the
session knows the request; the bytes do not say).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from ..drafts import Draft
from ..model import Location
from ..wire import Reader, encode_reason, encode_varint
from .base import (
    REQUEST_ERROR_TYPE,
    REQUEST_OK_TYPE,
    ControlMessage,
    _register,
    decode_fields,
    reply_fields,
)
from .fetch import Fetch, FetchError, FetchOk
from .namespace import (
    PublishNamespace,
    PublishNamespaceError,
    PublishNamespaceOk,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
)
from .parameters import NO_PARAMETERS, Parameters
from .publish import Publish, PublishError, PublishOk
from .subscribe import Subscribe, SubscribeError, SubscribeOk
from .track_status import TrackStatus, TrackStatusError, TrackStatusOk


@_register
@dataclass(frozen=True, slots=True)
class RequestOk(ControlMessage):
    """Accepts a request that has no reply of its own: what it reports of the track
    (TRACK_STATUS: the largest location, expiry) is all it carries."""

    TYPE: ClassVar[int] = REQUEST_OK_TYPE
    SINCE: ClassVar[int] = 16

    request_id: int
    expires: int = 0
    largest: Location | None = None
    parameters: Parameters = NO_PARAMETERS

    def encode_payload(self, draft: Draft) -> bytes:
        return encode_varint(self.request_id) + reply_fields(
            self.expires, self.largest, self.parameters, draft
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id = reader.varint()
        fields, parameters = decode_fields(reader, draft)
        return cls(request_id, fields.expires, fields.largest, parameters)


@_register
@dataclass(frozen=True, slots=True)
class RequestError(ControlMessage):
    """Refuses any request; `error_code` in draft 16's one table (`RequestErrorCode`)."""

    TYPE: ClassVar[int] = REQUEST_ERROR_TYPE
    SINCE: ClassVar[int] = 16

    request_id: int
    error_code: int
    retry_interval: int = 0
    """Milliseconds to wait before trying again, plus one; 0: do not try again."""
    reason: str = ""

    def encode_payload(self, draft: Draft) -> bytes:
        return b"".join(
            (
                encode_varint(self.request_id),
                encode_varint(self.error_code),
                encode_varint(self.retry_interval),
                encode_reason(self.reason),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        return cls(reader.varint(), reader.varint(), reader.varint(), reader.reason())


ERROR_OF_REQUEST: dict[type[ControlMessage], type[ControlMessage]] = {
    Subscribe: SubscribeError,
    Publish: PublishError,
    Fetch: FetchError,
    TrackStatus: TrackStatusError,
    PublishNamespace: PublishNamespaceError,
    SubscribeNamespace: SubscribeNamespaceError,
}
"""The *_ERROR that refuses each request."""
REQUEST_OF_ERROR = {error: request for request, error in ERROR_OF_REQUEST.items()}
"""The request each *_ERROR refuses."""
REQUEST_OF_OK: dict[type[ControlMessage], type[ControlMessage]] = {
    SubscribeOk: Subscribe,
    PublishOk: Publish,
    FetchOk: Fetch,
    TrackStatusOk: TrackStatus,
    PublishNamespaceOk: PublishNamespace,
    SubscribeNamespaceOk: SubscribeNamespace,
}
"""The request each *_OK answers."""


def family_reply(reply: RequestOk | RequestError, request: ControlMessage) -> ControlMessage:
    """The draft-14 reply that `reply` is, given the `request` it answers. A REQUEST_OK to
    a request that has a reply of its own (SUBSCRIBE, PUBLISH, FETCH) or to an update stays
    as it is: the session judges it."""
    if isinstance(reply, RequestError):
        error = ERROR_OF_REQUEST.get(type(request))
        if error is None:
            return reply
        return error.from_request_error(reply)  # type: ignore[attr-defined]
    if isinstance(request, TrackStatus):
        return TrackStatusOk(
            reply.request_id, 0, reply.expires, largest=reply.largest, parameters=reply.parameters
        )
    if isinstance(request, PublishNamespace):
        return PublishNamespaceOk(reply.request_id)
    if isinstance(request, SubscribeNamespace):
        return SubscribeNamespaceOk(reply.request_id)
    return reply
