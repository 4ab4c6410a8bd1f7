"""PUBLISH family: PUBLISH, PUBLISH_OK, PUBLISH_ERROR."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from ..model import FullTrackName, GroupOrder, Location
from ..wire import (
    Reader,
    encode_varint,
)
from .base import (
    DEFAULT_FILTER,
    ControlMessage,
    SubscriptionFilter,
    _encode_optional_location,
    _encode_track,
    _read_group_order,
    _read_optional_location,
    _read_track,
    _register,
    _RequestError,
)
from .parameters import NO_PARAMETERS, Parameters


@_register
@dataclass(frozen=True, slots=True)
class Publish(ControlMessage):
    TYPE: ClassVar[int] = 0x1D
    NEW_REQUEST: ClassVar[bool] = True

    request_id: int
    track: FullTrackName
    track_alias: int
    group_order: GroupOrder = GroupOrder.ASCENDING
    largest: Location | None = None
    forward: bool = True
    parameters: Parameters = NO_PARAMETERS

    def encode_payload(self) -> bytes:
        return b"".join(
            (
                encode_varint(self.request_id),
                _encode_track(self.track),
                encode_varint(self.track_alias),
                bytes((self.group_order,)),
                _encode_optional_location(self.largest),
                bytes((self.forward,)),
                self.parameters.encode(),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(
            request_id=reader.varint(),
            track=_read_track(reader),
            track_alias=reader.varint(),
            group_order=_read_group_order(reader, allow_default=False),
            largest=_read_optional_location(reader),
            forward=reader.flag("forward"),
            parameters=Parameters.decode(reader),
        )


@_register
@dataclass(frozen=True, slots=True)
class PublishOk(ControlMessage):
    TYPE: ClassVar[int] = 0x1E

    request_id: int
    forward: bool = True
    subscriber_priority: int = 128
    group_order: GroupOrder = GroupOrder.ASCENDING
    filter: SubscriptionFilter = DEFAULT_FILTER
    parameters: Parameters = NO_PARAMETERS

    def encode_payload(self) -> bytes:
        return b"".join(
            (
                encode_varint(self.request_id),
                bytes((self.forward, self.subscriber_priority, self.group_order)),
                self.filter.encode(),
                self.parameters.encode(),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(
            request_id=reader.varint(),
            forward=reader.flag("forward"),
            subscriber_priority=reader.u8(),
            group_order=_read_group_order(reader, allow_default=True),
            filter=SubscriptionFilter.decode(reader),
            parameters=Parameters.decode(reader),
        )


@_register
@dataclass(frozen=True, slots=True)
class PublishError(_RequestError):
    TYPE: ClassVar[int] = 0x1F
