"""SUBSCRIBE family: SUBSCRIBE, SUBSCRIBE_OK/ERROR/UPDATE, UNSUBSCRIBE, PUBLISH_DONE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from ..drafts import Draft
from ..errors import SUBSCRIBE_RENUMBERED, draft_14_code
from ..model import Location
from ..wire import (
    Reader,
)
from .base import (
    UNKNOWN_STREAM_COUNT,
    ControlMessage,
    FilterType,
    SubscriptionFilter,
    _register,
    _RequestError,
    _RequestIdOnly,
    _SubscribeLayout,
    _SubscribeOkLayout,
    decode_fields,
    field_pairs,
    read_reply_id,
    reply_id,
)
from .parameters import NO_PARAMETERS, Parameters, encode_message_parameters


@_register
@dataclass(frozen=True, slots=True)
class Subscribe(_SubscribeLayout):
    TYPE: ClassVar[int] = 0x03


@_register
@dataclass(frozen=True, slots=True)
class SubscribeOk(_SubscribeOkLayout):
    TYPE: ClassVar[int] = 0x04


@_register
@dataclass(frozen=True, slots=True)
class SubscribeError(_RequestError):
    TYPE: ClassVar[int] = 0x05
    RENUMBERED: ClassVar[dict[int, int]] = SUBSCRIBE_RENUMBERED


@_register
@dataclass(frozen=True, slots=True)
class SubscribeUpdate(ControlMessage):
    """Narrows an existing subscription. ``end_group`` None means open-ended.

    On the wire the end group is sent +1 with 0 meaning open-ended (unlike SUBSCRIBE). From
    draft 16 it is REQUEST_UPDATE: the range is a SUBSCRIPTION_FILTER parameter (absolute
    start, or range), and one without it leaves the range as it was (`start` 0/0, which
    narrows nothing).
    """

    TYPE: ClassVar[int] = 0x02
    NEW_REQUEST: ClassVar[bool] = True

    request_id: int
    subscription_request_id: int
    start: Location
    end_group: int | None = None
    subscriber_priority: int = 128
    forward: bool = True
    parameters: Parameters = NO_PARAMETERS

    def encode_payload(self, draft: Draft) -> bytes:
        ids = draft.wire.varint(self.request_id) + reply_id(self.subscription_request_id, draft)
        if draft.request_parameters:
            if self.end_group is None:
                range_ = SubscriptionFilter(FilterType.ABSOLUTE_START, self.start)
            elif self.end_group < self.start.group:
                raise ValueError(f"{draft} cannot send a range that ends before it starts")
            else:
                range_ = SubscriptionFilter(FilterType.ABSOLUTE_RANGE, self.start, self.end_group)
            fields = field_pairs(
                forward=self.forward,
                subscriber_priority=self.subscriber_priority,
                filter=range_,
                draft=draft,
            )
            return ids + encode_message_parameters(fields, self.parameters, draft)
        end = 0 if self.end_group is None else self.end_group + 1
        return b"".join(
            (
                ids,
                draft.wire.location(self.start),
                draft.wire.varint(end),
                bytes((self.subscriber_priority, self.forward)),
                self.parameters.encode(draft),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id = reader.varint()
        subscription_request_id = read_reply_id(reader, draft)  # draft 18: its stream's
        if draft.request_parameters:
            fields, parameters = decode_fields(reader, draft)
            range_ = fields.filter
            if range_.start is None:  # no range, or one relative to the largest object
                range_ = SubscriptionFilter(FilterType.ABSOLUTE_START, Location(0, 0))
            return cls(
                request_id,
                subscription_request_id,
                range_.start,  # type: ignore[arg-type]
                range_.end_group,
                fields.subscriber_priority,
                fields.forward,
                parameters,
            )
        start = reader.location()
        end = reader.varint()
        return cls(
            request_id=request_id,
            subscription_request_id=subscription_request_id,
            start=start,
            end_group=None if end == 0 else end - 1,
            subscriber_priority=reader.u8(),
            forward=reader.flag("forward"),
            parameters=Parameters.decode(reader, draft),
        )


@_register
@dataclass(frozen=True, slots=True)
class Unsubscribe(_RequestIdOnly):
    TYPE: ClassVar[int] = 0x0A
    UNTIL: ClassVar[int | None] = 16  # draft 18 resets the request's stream


@_register
@dataclass(frozen=True, slots=True)
class PublishDone(ControlMessage):
    """The publisher ends a subscription (SUBSCRIBE_DONE before -13)."""

    TYPE: ClassVar[int] = 0x0B

    request_id: int
    status_code: int
    stream_count: int = UNKNOWN_STREAM_COUNT
    reason: str = ""

    def encode_payload(self, draft: Draft) -> bytes:
        status = draft.publish_done_renumbered.get(self.status_code, self.status_code)
        return b"".join(
            (
                reply_id(self.request_id, draft),
                draft.wire.varint(status),
                draft.wire.varint(self.stream_count),
                draft.wire.reason(self.reason),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id, status = read_reply_id(reader, draft), reader.varint()
        status = draft_14_code(draft.publish_done_renumbered, status)
        return cls(request_id, status, reader.varint(), reader.reason())
