"""TRACK_STATUS family: SUBSCRIBE's layouts under other codes; from draft 16 the request
carries no delivery fields and REQUEST_OK / REQUEST_ERROR answer it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..drafts import Draft
from ..errors import SUBSCRIBE_RENUMBERED
from .base import RequestOk, _register, _RequestError, _SubscribeLayout, _SubscribeOkLayout


@_register
@dataclass(frozen=True, slots=True)
class TrackStatus(_SubscribeLayout):
    TYPE: ClassVar[int] = 0x0D
    DELIVERY: ClassVar[bool] = False


@_register
@dataclass(frozen=True, slots=True)
class TrackStatusOk(_SubscribeOkLayout):
    """Same layout as SUBSCRIBE_OK; ``track_alias`` is always 0. From draft 16 a REQUEST_OK
    that says the largest location and expiry (the group order it cannot say: ascending)."""

    TYPE: ClassVar[int] = 0x0E
    UNTIL: ClassVar[int | None] = 14
    REPLACED: ClassVar[bool] = True
    ALLOW_DEFAULT_ORDER: ClassVar[bool] = True

    def wire_type(self, draft: Draft) -> int:
        return RequestOk.TYPE if draft.request_replies else self.TYPE

    def encode_payload(self, draft: Draft) -> bytes:
        if draft.request_replies:
            reply = RequestOk(self.request_id, self.expires, self.largest, self.parameters)
            return reply.encode_payload(draft)
        return _SubscribeOkLayout.encode_payload(self, draft)


@_register
@dataclass(frozen=True, slots=True)
class TrackStatusError(_RequestError):
    TYPE: ClassVar[int] = 0x0F
    RENUMBERED: ClassVar[dict[int, int]] = SUBSCRIBE_RENUMBERED
