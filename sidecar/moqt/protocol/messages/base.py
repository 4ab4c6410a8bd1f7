"""What every control message shares: framing, the type registry, field helpers, and the
layouts several families reuse (one body per layout, the wire type being the only difference).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Self, TypeVar

from ..errors import DecodeError, NeedMoreData
from ..model import FullTrackName, GroupOrder, Location
from ..wire import (
    MAX_FULL_TRACK_NAME,
    Buffer,
    Reader,
    encode_bytes,
    encode_location,
    encode_reason,
    encode_tuple,
    encode_varint,
)
from .parameters import NO_PARAMETERS, Parameters

DRAFT_14 = 0xFF00000E
MAX_MESSAGE_LENGTH = 0xFFFF
MAX_GOAWAY_URI = 8192
# A delivery status of "unknown number of streams" in PUBLISH_DONE.
UNKNOWN_STREAM_COUNT = (1 << 62) - 1


class FilterType(IntEnum):
    NEXT_GROUP_START = 0x1
    LARGEST_OBJECT = 0x2
    ABSOLUTE_START = 0x3
    ABSOLUTE_RANGE = 0x4


# ---------------------------------------------------------------------------------------------
# Shared field helpers.


def _encode_track(track: FullTrackName) -> bytes:
    if sum(map(len, track.namespace)) + len(track.name) > MAX_FULL_TRACK_NAME:
        raise ValueError(f"full track name longer than {MAX_FULL_TRACK_NAME} bytes")
    return encode_tuple(track.namespace) + encode_bytes(track.name)


def _read_track(reader: Reader) -> FullTrackName:
    namespace = reader.tuple()
    name = reader.bytes_vi(MAX_FULL_TRACK_NAME, "track name")
    if sum(map(len, namespace)) + len(name) > MAX_FULL_TRACK_NAME:
        raise DecodeError(f"full track name longer than {MAX_FULL_TRACK_NAME} bytes")
    return FullTrackName(namespace, name)


def _read_group_order(reader: Reader, allow_default: bool) -> GroupOrder:
    value = reader.u8()
    if value > GroupOrder.DESCENDING or (value == 0 and not allow_default):
        raise DecodeError(f"invalid group order {value}")
    return GroupOrder(value)


def _encode_optional_location(location: Location | None) -> bytes:
    """``content_exists u8`` then the location if it is there."""
    if location is None:
        return b"\x00"
    return b"\x01" + encode_location(location)


def _read_optional_location(reader: Reader) -> Location | None:
    return reader.location() if reader.flag("content exists") else None


@dataclass(frozen=True, slots=True)
class SubscriptionFilter:
    """Which objects a subscription covers (SUBSCRIBE, TRACK_STATUS, PUBLISH_OK)."""

    filter_type: FilterType = FilterType.LARGEST_OBJECT
    start: Location | None = None
    end_group: int | None = None

    def __post_init__(self) -> None:
        wants_start = self.filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE)
        wants_end = self.filter_type == FilterType.ABSOLUTE_RANGE
        if (self.start is not None) != wants_start or (self.end_group is not None) != wants_end:
            raise ValueError(f"fields do not match filter type {self.filter_type!r}")

    def encode(self) -> bytes:
        out = encode_varint(self.filter_type)
        if self.start is not None:
            out += encode_location(self.start)
        if self.end_group is not None:
            out += encode_varint(self.end_group)
        return out

    @classmethod
    def decode(cls, reader: Reader) -> SubscriptionFilter:
        value = reader.varint()
        try:
            filter_type = FilterType(value)
        except ValueError:
            raise DecodeError(f"unknown filter type {value}") from None
        start = end_group = None
        if filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE):
            start = reader.location()
        if filter_type == FilterType.ABSOLUTE_RANGE:
            end_group = reader.varint()
            if end_group < start.group:  # type: ignore[union-attr]
                raise DecodeError("subscription ends before it starts")
        return cls(filter_type, start, end_group)


# Latest Object: the filter of a plain live subscription (frozen, so one instance serves all).
DEFAULT_FILTER = SubscriptionFilter()


# ---------------------------------------------------------------------------------------------
# The message base and registry.

_REGISTRY: dict[int, type[ControlMessage]] = {}


@dataclass(frozen=True, slots=True)
class ControlMessage:
    """Base of all control messages. ``TYPE`` is the wire code.

    ``NEW_REQUEST`` marks the messages that consume the sender's next Request ID.
    """

    TYPE: ClassVar[int]
    NEW_REQUEST: ClassVar[bool] = False

    def encode(self) -> bytes:
        payload = self.encode_payload()
        if len(payload) > MAX_MESSAGE_LENGTH:
            raise ValueError(f"{type(self).__name__} payload of {len(payload)} bytes is too long")
        return encode_varint(self.TYPE) + len(payload).to_bytes(2, "big") + payload

    def encode_payload(self) -> bytes:
        raise NotImplementedError

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        raise NotImplementedError


_M = TypeVar("_M", bound=type["ControlMessage"])


def _register(cls: _M) -> _M:
    assert cls.TYPE not in _REGISTRY, hex(cls.TYPE)
    _REGISTRY[cls.TYPE] = cls
    return cls


def decode_control(data: Buffer) -> tuple[ControlMessage, int]:
    """Decode the framed message at the front of ``data``; return it and the bytes it used.

    Raises ``NeedMoreData`` while the frame is incomplete and ``DecodeError`` for an unknown
    type or a payload whose fields do not fill its length exactly.
    """
    reader = Reader(data)
    message_type = reader.varint()
    cls = _REGISTRY.get(message_type)
    if cls is None:
        raise DecodeError(f"unknown control message type {message_type:#x}")
    length = reader.u16()
    end = reader.pos + length
    if end > reader.end:
        raise NeedMoreData("control message payload")
    payload = Reader(reader.data, reader.pos, end)
    try:
        message = cls.decode_payload(payload)
    except NeedMoreData:
        raise DecodeError(f"{cls.__name__}: fields run past the length {length}") from None
    if not payload.at_end():
        raise DecodeError(f"{cls.__name__}: {payload.remaining} bytes left after the fields")
    return message, end


@dataclass(frozen=True, slots=True)
class _RequestIdOnly(ControlMessage):
    """Layout of the messages whose whole payload is one request id."""

    request_id: int

    def encode_payload(self) -> bytes:
        return encode_varint(self.request_id)

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.varint())


# ---------------------------------------------------------------------------------------------
# Replies shared by every request family.


@dataclass(frozen=True, slots=True)
class _RequestError(ControlMessage):
    request_id: int
    error_code: int
    reason: str = ""

    def encode_payload(self) -> bytes:
        return (
            encode_varint(self.request_id)
            + encode_varint(self.error_code)
            + encode_reason(self.reason)
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.varint(), reader.varint(), reader.reason())


@dataclass(frozen=True, slots=True)
class _SubscribeLayout(ControlMessage):
    NEW_REQUEST: ClassVar[bool] = True

    request_id: int
    track: FullTrackName
    subscriber_priority: int = 128
    group_order: GroupOrder = GroupOrder.ASCENDING
    forward: bool = True
    filter: SubscriptionFilter = DEFAULT_FILTER
    parameters: Parameters = NO_PARAMETERS

    def encode_payload(self) -> bytes:
        return b"".join(
            (
                encode_varint(self.request_id),
                _encode_track(self.track),
                bytes((self.subscriber_priority, self.group_order, self.forward)),
                self.filter.encode(),
                self.parameters.encode(),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(
            request_id=reader.varint(),
            track=_read_track(reader),
            subscriber_priority=reader.u8(),
            group_order=_read_group_order(reader, allow_default=True),
            forward=reader.flag("forward"),
            filter=SubscriptionFilter.decode(reader),
            parameters=Parameters.decode(reader),
        )


@dataclass(frozen=True, slots=True)
class _SubscribeOkLayout(ControlMessage):
    # A publisher states the order it uses (1 or 2); only TRACK_STATUS_OK, which may answer
    # for a track with no content, can leave it at 0.
    ALLOW_DEFAULT_ORDER: ClassVar[bool] = False

    request_id: int
    track_alias: int
    expires: int = 0
    group_order: GroupOrder = GroupOrder.ASCENDING
    largest: Location | None = None
    parameters: Parameters = NO_PARAMETERS

    def encode_payload(self) -> bytes:
        return b"".join(
            (
                encode_varint(self.request_id),
                encode_varint(self.track_alias),
                encode_varint(self.expires),
                bytes((self.group_order,)),
                _encode_optional_location(self.largest),
                self.parameters.encode(),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(
            request_id=reader.varint(),
            track_alias=reader.varint(),
            expires=reader.varint(),
            group_order=_read_group_order(reader, allow_default=cls.ALLOW_DEFAULT_ORDER),
            largest=_read_optional_location(reader),
            parameters=Parameters.decode(reader),
        )


@dataclass(frozen=True, slots=True)
class _NamespaceRequest(ControlMessage):
    """A request naming a namespace. SUBSCRIBE_NAMESPACE tolerates an empty prefix: moq-rs
    sends one right after setup, and closing on it would break interop."""

    NEW_REQUEST: ClassVar[bool] = True
    ALLOW_EMPTY: ClassVar[bool] = False

    request_id: int
    namespace: tuple[bytes, ...]
    parameters: Parameters = NO_PARAMETERS

    def encode_payload(self) -> bytes:
        return (
            encode_varint(self.request_id) + encode_tuple(self.namespace) + self.parameters.encode()
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.varint(), reader.tuple(cls.ALLOW_EMPTY), Parameters.decode(reader))


@dataclass(frozen=True, slots=True)
class _NamespaceOnly(ControlMessage):
    """Layout of the messages whose whole payload is a namespace tuple."""

    ALLOW_EMPTY: ClassVar[bool] = False

    namespace: tuple[bytes, ...]

    def encode_payload(self) -> bytes:
        return encode_tuple(self.namespace)

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.tuple(cls.ALLOW_EMPTY))
