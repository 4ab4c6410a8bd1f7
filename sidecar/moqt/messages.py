"""Every MoQT draft-14 control message, as a frozen dataclass with ``encode()``.

Framing is ``type (vi) | length (u16) | payload`` for every message (draft-14's ``Length (i)`` in
the PUBLISH diagrams is an editorial slip; peers use u16). ``decode_control`` parses one framed
message from the front of a buffer. Messages that share a layout share one class body
(``_SubscribeLayout`` for SUBSCRIBE and TRACK_STATUS, ``_RequestError`` for every *_ERROR ...),
so a layout is written once and the wire type is the only difference.

Decoded integers that name codes (error codes, statuses) stay plain ``int``: a peer may use codes
newer than our tables; the enums in ``errors`` name the ones we know.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Self, TypeVar

from .errors import DecodeError, NeedMoreData
from .model import FullTrackName, GroupOrder, Location
from .wire import (
    MAX_FULL_TRACK_NAME,
    Buffer,
    KeyValuePair,
    Reader,
    encode_bytes,
    encode_location,
    encode_parameters,
    encode_reason,
    encode_tuple,
    encode_varint,
)

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
# Parameters: typed views of key-value lists that keep the pairs they do not know.


@dataclass(frozen=True, slots=True)
class _ParameterSet:
    """Known parameters as typed fields, unknown ones kept in ``unknown`` in wire order.

    Subclasses list their keys in ``_KEYS`` (key -> field name); keys in ``_REPEATABLE`` map to
    a tuple field and may appear many times, any other known key twice is a violation.
    """

    _KEYS: ClassVar[dict[int, str]] = {}
    _REPEATABLE: ClassVar[frozenset[int]] = frozenset()

    unknown: tuple[KeyValuePair, ...] = ()

    def pairs(self) -> tuple[KeyValuePair, ...]:
        out: list[KeyValuePair] = []
        for key, name in sorted(self._KEYS.items()):
            value = getattr(self, name)
            if key in self._REPEATABLE:
                out.extend((key, v) for v in value)
            elif value is not None:
                out.append((key, value))
        return (*out, *self.unknown)

    def encode(self) -> bytes:
        return encode_parameters(self.pairs())

    @classmethod
    def decode(cls, reader: Reader) -> Self:
        fields: dict[str, object] = {}
        repeated: dict[str, list[int | bytes]] = {}
        unknown: list[KeyValuePair] = []
        for key, value in reader.parameters():
            name = cls._KEYS.get(key)
            if name is None:
                unknown.append((key, value))
            elif key in cls._REPEATABLE:
                repeated.setdefault(name, []).append(value)
            elif name in fields:
                raise DecodeError(f"parameter {key:#x} repeated")
            else:
                fields[name] = value
        fields.update((name, tuple(values)) for name, values in repeated.items())
        return cls(unknown=tuple(unknown), **fields)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class SetupParameters(_ParameterSet):
    """CLIENT_SETUP / SERVER_SETUP parameters (their own registry, shared by all versions)."""

    _KEYS: ClassVar[dict[int, str]] = {
        0x01: "path",
        0x02: "max_request_id",
        0x03: "authorization_tokens",
        0x04: "max_auth_token_cache_size",
        0x05: "authority",
        0x07: "implementation",
    }
    _REPEATABLE: ClassVar[frozenset[int]] = frozenset({0x03})

    path: bytes | None = None
    max_request_id: int | None = None
    authorization_tokens: tuple[bytes, ...] = ()
    max_auth_token_cache_size: int | None = None
    authority: bytes | None = None
    implementation: bytes | None = None


@dataclass(frozen=True, slots=True)
class Parameters(_ParameterSet):
    """Version-specific parameters of request messages."""

    _KEYS: ClassVar[dict[int, str]] = {
        0x02: "delivery_timeout",
        0x03: "authorization_tokens",
        0x04: "max_cache_duration",
    }
    _REPEATABLE: ClassVar[frozenset[int]] = frozenset({0x03})

    delivery_timeout: int | None = None
    authorization_tokens: tuple[bytes, ...] = ()
    max_cache_duration: int | None = None


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


# ---------------------------------------------------------------------------------------------
# Session setup and flow control.


@_register
@dataclass(frozen=True, slots=True)
class ClientSetup(ControlMessage):
    TYPE: ClassVar[int] = 0x20

    versions: tuple[int, ...]
    parameters: SetupParameters = SetupParameters()

    def encode_payload(self) -> bytes:
        versions = b"".join(encode_varint(v) for v in self.versions)
        return encode_varint(len(self.versions)) + versions + self.parameters.encode()

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        count = reader.count(reader.remaining, "version")
        versions = tuple(reader.varint() for _ in range(count))
        return cls(versions, SetupParameters.decode(reader))


@_register
@dataclass(frozen=True, slots=True)
class ServerSetup(ControlMessage):
    TYPE: ClassVar[int] = 0x21

    version: int
    parameters: SetupParameters = SetupParameters()

    def encode_payload(self) -> bytes:
        return encode_varint(self.version) + self.parameters.encode()

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.varint(), SetupParameters.decode(reader))


@_register
@dataclass(frozen=True, slots=True)
class Goaway(ControlMessage):
    TYPE: ClassVar[int] = 0x10

    new_session_uri: bytes = b""

    def encode_payload(self) -> bytes:
        return encode_bytes(self.new_session_uri)

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.bytes_vi(MAX_GOAWAY_URI, "new session URI"))


@dataclass(frozen=True, slots=True)
class _RequestIdOnly(ControlMessage):
    """Layout of the messages whose whole payload is one request id."""

    request_id: int

    def encode_payload(self) -> bytes:
        return encode_varint(self.request_id)

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.varint())


@_register
@dataclass(frozen=True, slots=True)
class MaxRequestId(_RequestIdOnly):
    """``request_id`` is the new limit: the peer may use ids strictly below it."""

    TYPE: ClassVar[int] = 0x15


@_register
@dataclass(frozen=True, slots=True)
class RequestsBlocked(_RequestIdOnly):
    """``request_id`` is the limit the sender is blocked on."""

    TYPE: ClassVar[int] = 0x1A


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
    filter: SubscriptionFilter = SubscriptionFilter()
    parameters: Parameters = Parameters()

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
    parameters: Parameters = Parameters()

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


# ---------------------------------------------------------------------------------------------
# SUBSCRIBE family.


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
    parameters: Parameters = Parameters()

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


# ---------------------------------------------------------------------------------------------
# PUBLISH family.


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
    parameters: Parameters = Parameters()

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
    filter: SubscriptionFilter = SubscriptionFilter()
    parameters: Parameters = Parameters()

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


# ---------------------------------------------------------------------------------------------
# FETCH family.


@dataclass(frozen=True, slots=True)
class StandaloneFetch:
    """Objects from ``start`` to (``end_group``, ``end_object``) inclusive.

    ``end_object`` None means the whole end group; on the wire the end object is sent +1 with
    0 meaning "whole group".
    """

    track: FullTrackName
    start: Location
    end_group: int
    end_object: int | None = None


@dataclass(frozen=True, slots=True)
class JoiningFetch:
    """A fetch joined to a Largest-Object subscription (relative: groups back; absolute: group)."""

    joining_request_id: int
    joining_start: int
    absolute: bool = False


class FetchType(IntEnum):
    STANDALONE = 0x1
    RELATIVE_JOINING = 0x2
    ABSOLUTE_JOINING = 0x3


@_register
@dataclass(frozen=True, slots=True)
class Fetch(ControlMessage):
    TYPE: ClassVar[int] = 0x16
    NEW_REQUEST: ClassVar[bool] = True

    request_id: int
    target: StandaloneFetch | JoiningFetch
    subscriber_priority: int = 128
    group_order: GroupOrder = GroupOrder.ASCENDING
    parameters: Parameters = Parameters()

    @property
    def fetch_type(self) -> FetchType:
        if isinstance(self.target, StandaloneFetch):
            return FetchType.STANDALONE
        return FetchType.ABSOLUTE_JOINING if self.target.absolute else FetchType.RELATIVE_JOINING

    def encode_payload(self) -> bytes:
        target = self.target
        if isinstance(target, StandaloneFetch):
            end_object = 0 if target.end_object is None else target.end_object + 1
            body = (
                _encode_track(target.track)
                + encode_location(target.start)
                + encode_location(Location(target.end_group, end_object))
            )
        else:
            body = encode_varint(target.joining_request_id) + encode_varint(target.joining_start)
        return b"".join(
            (
                encode_varint(self.request_id),
                bytes((self.subscriber_priority, self.group_order)),
                encode_varint(self.fetch_type),
                body,
                self.parameters.encode(),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        request_id = reader.varint()
        priority = reader.u8()
        group_order = _read_group_order(reader, allow_default=True)
        fetch_type = reader.varint()
        target: StandaloneFetch | JoiningFetch
        if fetch_type == FetchType.STANDALONE:
            track = _read_track(reader)
            start = reader.location()
            end = reader.location()
            end_object = None if end.object == 0 else end.object - 1
            if Location(end.group, end_object if end_object is not None else start.object) < start:
                raise DecodeError("fetch range ends before it starts")
            target = StandaloneFetch(track, start, end.group, end_object)
        elif fetch_type in (FetchType.RELATIVE_JOINING, FetchType.ABSOLUTE_JOINING):
            target = JoiningFetch(
                reader.varint(), reader.varint(), fetch_type == FetchType.ABSOLUTE_JOINING
            )
        else:
            raise DecodeError(f"unknown fetch type {fetch_type}")
        return cls(request_id, target, priority, group_order, Parameters.decode(reader))


@_register
@dataclass(frozen=True, slots=True)
class FetchOk(ControlMessage):
    TYPE: ClassVar[int] = 0x18

    request_id: int
    end: Location
    end_of_track: bool = False
    group_order: GroupOrder = GroupOrder.ASCENDING
    parameters: Parameters = Parameters()

    def encode_payload(self) -> bytes:
        return b"".join(
            (
                encode_varint(self.request_id),
                bytes((self.group_order, self.end_of_track)),
                encode_location(self.end),
                self.parameters.encode(),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        request_id = reader.varint()
        group_order = _read_group_order(reader, allow_default=False)
        end_of_track = reader.flag("end of track")
        end = reader.location()
        return cls(request_id, end, end_of_track, group_order, Parameters.decode(reader))


@_register
@dataclass(frozen=True, slots=True)
class FetchError(_RequestError):
    TYPE: ClassVar[int] = 0x19


@_register
@dataclass(frozen=True, slots=True)
class FetchCancel(_RequestIdOnly):
    TYPE: ClassVar[int] = 0x17


# ---------------------------------------------------------------------------------------------
# TRACK_STATUS family: SUBSCRIBE's layouts under other codes.


@_register
@dataclass(frozen=True, slots=True)
class TrackStatus(_SubscribeLayout):
    TYPE: ClassVar[int] = 0x0D


@_register
@dataclass(frozen=True, slots=True)
class TrackStatusOk(_SubscribeOkLayout):
    """Same layout as SUBSCRIBE_OK; ``track_alias`` is always 0."""

    TYPE: ClassVar[int] = 0x0E
    ALLOW_DEFAULT_ORDER: ClassVar[bool] = True


@_register
@dataclass(frozen=True, slots=True)
class TrackStatusError(_RequestError):
    TYPE: ClassVar[int] = 0x0F


# ---------------------------------------------------------------------------------------------
# PUBLISH_NAMESPACE family (ANNOUNCE before -13).


@dataclass(frozen=True, slots=True)
class _NamespaceRequest(ControlMessage):
    """A request naming a namespace. SUBSCRIBE_NAMESPACE tolerates an empty prefix: moq-rs
    sends one right after setup, and closing on it would break interop."""

    NEW_REQUEST: ClassVar[bool] = True
    ALLOW_EMPTY: ClassVar[bool] = False

    request_id: int
    namespace: tuple[bytes, ...]
    parameters: Parameters = Parameters()

    def encode_payload(self) -> bytes:
        return (
            encode_varint(self.request_id) + encode_tuple(self.namespace) + self.parameters.encode()
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.varint(), reader.tuple(cls.ALLOW_EMPTY), Parameters.decode(reader))


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespace(_NamespaceRequest):
    TYPE: ClassVar[int] = 0x06


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceOk(_RequestIdOnly):
    TYPE: ClassVar[int] = 0x07


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceError(_RequestError):
    TYPE: ClassVar[int] = 0x08


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


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceDone(_NamespaceOnly):
    """Withdraws a namespace. Draft-14 carries no request id, only the namespace."""

    TYPE: ClassVar[int] = 0x09


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceCancel(ControlMessage):
    TYPE: ClassVar[int] = 0x0C

    namespace: tuple[bytes, ...]
    error_code: int
    reason: str = ""

    def encode_payload(self) -> bytes:
        return (
            encode_tuple(self.namespace)
            + encode_varint(self.error_code)
            + encode_reason(self.reason)
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.tuple(), reader.varint(), reader.reason())


# ---------------------------------------------------------------------------------------------
# SUBSCRIBE_NAMESPACE family.


@_register
@dataclass(frozen=True, slots=True)
class SubscribeNamespace(_NamespaceRequest):
    TYPE: ClassVar[int] = 0x11
    ALLOW_EMPTY: ClassVar[bool] = True


@_register
@dataclass(frozen=True, slots=True)
class SubscribeNamespaceOk(_RequestIdOnly):
    TYPE: ClassVar[int] = 0x12


@_register
@dataclass(frozen=True, slots=True)
class SubscribeNamespaceError(_RequestError):
    TYPE: ClassVar[int] = 0x13


@_register
@dataclass(frozen=True, slots=True)
class UnsubscribeNamespace(_NamespaceOnly):
    """The prefix may be empty, like the SUBSCRIBE_NAMESPACE it ends."""

    TYPE: ClassVar[int] = 0x14
    ALLOW_EMPTY: ClassVar[bool] = True


ALL_MESSAGE_TYPES: tuple[type[ControlMessage], ...] = tuple(_REGISTRY.values())
