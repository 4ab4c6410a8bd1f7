"""SUBSCRIBE family: SUBSCRIBE, SUBSCRIBE_OK/ERROR/UPDATE, UNSUBSCRIBE, PUBLISH_DONE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from ..model import Location
from ..wire import (
    Reader,
    encode_location,
    encode_reason,
    encode_varint,
)
from .base import (
    UNKNOWN_STREAM_COUNT,
    ControlMessage,
    _register,
    _RequestError,
    _RequestIdOnly,
    _SubscribeLayout,
    _SubscribeOkLayout,
)
from .parameters import NO_PARAMETERS, Parameters


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


@_register
@dataclass(frozen=True, slots=True)
class SubscribeUpdate(ControlMessage):
    """Narrows an existing subscription. ``end_group`` None means open-ended.

    On the wire the end group is sent +1 with 0 meaning open-ended (unlike SUBSCRIBE).
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

    def encode_payload(self) -> bytes:
        end = 0 if self.end_group is None else self.end_group + 1
        return b"".join(
            (
                encode_varint(self.request_id),
                encode_varint(self.subscription_request_id),
                encode_location(self.start),
                encode_varint(end),
                bytes((self.subscriber_priority, self.forward)),
                self.parameters.encode(),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        request_id = reader.varint()
        subscription_request_id = reader.varint()
        start = reader.location()
        end = reader.varint()
        return cls(
            request_id=request_id,
            subscription_request_id=subscription_request_id,
            start=start,
            end_group=None if end == 0 else end - 1,
            subscriber_priority=reader.u8(),
            forward=reader.flag("forward"),
            parameters=Parameters.decode(reader),
        )


@_register
@dataclass(frozen=True, slots=True)
class Unsubscribe(_RequestIdOnly):
    TYPE: ClassVar[int] = 0x0A


@_register
@dataclass(frozen=True, slots=True)
class PublishDone(ControlMessage):
    """The publisher ends a subscription (SUBSCRIBE_DONE before -13)."""

    TYPE: ClassVar[int] = 0x0B

    request_id: int
    status_code: int
    stream_count: int = UNKNOWN_STREAM_COUNT
    reason: str = ""

    def encode_payload(self) -> bytes:
        return b"".join(
            (
                encode_varint(self.request_id),
                encode_varint(self.status_code),
                encode_varint(self.stream_count),
                encode_reason(self.reason),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.varint(), reader.varint(), reader.varint(), reader.reason())
