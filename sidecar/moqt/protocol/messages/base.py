"""What every control message shares: framing, the type registry per draft, field helpers,
draft 16's parameters for draft 14's fixed fields and its track extensions, and the layouts
several families reuse (one body per layout, the wire type being the only difference).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Self, TypeVar

from ..drafts import CODED, DRAFT_14, Draft
from ..errors import DecodeError, NeedMoreData, RequestErrorCode, draft_14_code
from ..model import FullTrackName, GroupOrder, Location
from ..wire import (
    MAX_FULL_TRACK_NAME,
    Buffer,
    KeyValuePair,
    Reader,
    decode_kvps,
)
from .parameters import (
    EXPIRES,
    FORWARD,
    GROUP_ORDER,
    LARGEST_OBJECT,
    MAX_CACHE_DURATION,
    NO_PARAMETERS,
    SUBSCRIBER_PRIORITY,
    SUBSCRIPTION_FILTER,
    Parameters,
    decode_message_parameters,
    encode_message_parameters,
)

MAX_MESSAGE_LENGTH = 0xFFFF
DEFAULT_PUBLISHER_GROUP_ORDER = 0x22
"""The track extension (draft 16 on) that says a track's group order; ascending if absent."""
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

ON_STREAM = -1
"""The request id of a reply (or update, or PUBLISH_DONE) that a draft with request streams
sends without one: the stream it came on names the request, and the session fills it in."""


def reply_id(request_id: int, draft: Draft) -> bytes:
    """A reply's request id, where the draft sends it."""
    return b"" if draft.request_streams else draft.wire.varint(request_id)


def read_reply_id(reader: Reader, draft: Draft) -> int:
    return ON_STREAM if draft.request_streams else reader.varint()


def _encode_track(track: FullTrackName, draft: Draft) -> bytes:
    if sum(map(len, track.namespace)) + len(track.name) > MAX_FULL_TRACK_NAME:
        raise ValueError(f"full track name longer than {MAX_FULL_TRACK_NAME} bytes")
    return draft.wire.tuple(track.namespace) + draft.wire.bytes_vi(track.name)


def _read_track(reader: Reader, allow_empty: bool = False) -> FullTrackName:
    namespace = reader.tuple(allow_empty)
    name = reader.bytes_vi(MAX_FULL_TRACK_NAME, "track name")
    if sum(map(len, namespace)) + len(name) > MAX_FULL_TRACK_NAME:
        raise DecodeError(f"full track name longer than {MAX_FULL_TRACK_NAME} bytes")
    return FullTrackName(namespace, name)


def _read_group_order(reader: Reader, allow_default: bool) -> GroupOrder:
    value = reader.u8()
    if value > GroupOrder.DESCENDING or (value == 0 and not allow_default):
        raise DecodeError(f"invalid group order {value}")
    return GroupOrder(value)


def _encode_optional_location(location: Location | None, draft: Draft) -> bytes:
    """``content_exists u8`` then the location if it is there."""
    if location is None:
        return b"\x00"
    return b"\x01" + draft.wire.location(location)


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

    def encode(self, draft: Draft) -> bytes:
        out = draft.wire.varint(self.filter_type)
        if self.start is not None:
            out += draft.wire.location(self.start)
        if self.end_group is not None:
            first = self.start.group if draft.end_group_delta else 0  # type: ignore[union-attr]
            out += draft.wire.varint(self.end_group - first)
        return out

    @classmethod
    def decode(cls, reader: Reader, draft: Draft) -> SubscriptionFilter:
        value = reader.varint()
        try:
            filter_type = FilterType(value)
        except ValueError:
            raise DecodeError(f"unknown filter type {value}") from None
        start = end_group = None
        if filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE):
            start = reader.location()
        if filter_type == FilterType.ABSOLUTE_RANGE:
            end_group = reader.varint() + (start.group if draft.end_group_delta else 0)  # type: ignore[union-attr]
            if end_group < start.group:  # type: ignore[union-attr]
                raise DecodeError("subscription ends before it starts")
        return cls(filter_type, start, end_group)


# Latest Object: the filter of a plain live subscription (frozen, so one instance serves all).
DEFAULT_FILTER = SubscriptionFilter()


# ---------------------------------------------------------------------------------------------
# Draft 16's parameters for what draft 14 sends as fixed fields, and track extensions.


def field_pairs(
    *,
    expires: int = 0,
    largest: Location | None = None,
    forward: bool | None = None,
    subscriber_priority: int | None = None,
    filter: SubscriptionFilter | None = None,
    group_order: GroupOrder | None = None,
    draft: Draft,
) -> list[KeyValuePair]:
    """The parameters a draft-16 message sends for the fields given (None: the message has
    no such field). An expiry of 0 and the publisher's group order are their defaults, left
    out."""
    pairs: list[KeyValuePair] = []
    if expires:
        pairs.append((EXPIRES, expires))
    if largest is not None:
        pairs.append((LARGEST_OBJECT, draft.wire.location(largest)))
    if forward is not None:
        pairs.append((FORWARD, int(forward)))
    if subscriber_priority is not None:
        pairs.append((SUBSCRIBER_PRIORITY, subscriber_priority))
    if filter is not None:
        pairs.append((SUBSCRIPTION_FILTER, filter.encode(draft)))
    if group_order not in (None, GroupOrder.PUBLISHER_DEFAULT):
        pairs.append((GROUP_ORDER, int(group_order)))  # type: ignore[arg-type]
    return pairs


@dataclass(frozen=True, slots=True)
class Fields:
    """Draft 16's field parameters of one message, read with draft 14's defaults."""

    pairs: dict[int, int | bytes]
    draft: Draft

    def _int(self, key: int, default: int, largest: int, what: str) -> int:
        value = self.pairs.get(key, default)
        assert isinstance(value, int)  # even keys carry integers
        if value > largest:
            raise DecodeError(f"{what} {value} is out of range")
        return value

    def _struct(self, key: int) -> Reader | None:
        value = self.pairs.get(key)
        return None if value is None else self.draft.wire.reader(value)  # type: ignore[arg-type]

    @property
    def expires(self) -> int:
        value = self.pairs.get(EXPIRES, 0)
        assert isinstance(value, int)
        return value

    @property
    def largest(self) -> Location | None:
        reader = self._struct(LARGEST_OBJECT)
        return None if reader is None else _whole(reader, reader.location)

    @property
    def forward(self) -> bool:
        return self._int(FORWARD, 1, 1, "forward") == 1

    @property
    def subscriber_priority(self) -> int:
        return self._int(SUBSCRIBER_PRIORITY, 128, 255, "subscriber priority")

    def group_order(self, default: GroupOrder) -> GroupOrder:
        if GROUP_ORDER not in self.pairs:
            return default
        value = self._int(GROUP_ORDER, 0, GroupOrder.DESCENDING, "group order")
        if value == GroupOrder.PUBLISHER_DEFAULT:
            raise DecodeError("group order 0")
        return GroupOrder(value)

    @property
    def filter(self) -> SubscriptionFilter:
        reader = self._struct(SUBSCRIPTION_FILTER)
        if reader is None:
            return DEFAULT_FILTER
        return _whole(reader, lambda: SubscriptionFilter.decode(reader, self.draft))


_T = TypeVar("_T")


def _whole(reader: Reader, read: Callable[[], _T]) -> _T:
    """What `read` takes from `reader`, which must be all of it (a parameter's value)."""
    try:
        value = read()
    except NeedMoreData:
        raise DecodeError("a parameter's value ends early") from None
    if not reader.at_end():
        raise DecodeError("a parameter's value is longer than its fields")
    return value


def decode_fields(reader: Reader, draft: Draft) -> tuple[Fields, Parameters]:
    fields, parameters = decode_message_parameters(reader, draft)
    return Fields(fields, draft), parameters


def track_report(
    expires: int, largest: Location | None, parameters: Parameters, draft: Draft
) -> bytes:
    """The parameter block of a draft-16 reply that reports on a track (SUBSCRIBE_OK,
    REQUEST_OK)."""
    return encode_message_parameters(
        field_pairs(expires=expires, largest=largest, draft=draft), parameters, draft
    )


def encode_track_extensions(group_order: GroupOrder, parameters: Parameters, draft: Draft) -> bytes:
    """Draft 16's trailing track extensions (no count: they run to the message's end)."""
    pairs: list[KeyValuePair] = []
    if parameters.max_cache_duration is not None:
        pairs.append((MAX_CACHE_DURATION, parameters.max_cache_duration))
    if group_order == GroupOrder.DESCENDING:
        pairs.append((DEFAULT_PUBLISHER_GROUP_ORDER, int(group_order)))
    return draft.wire.kvps(pairs, delta=True)


def decode_track_extensions(
    reader: Reader, parameters: Parameters, draft: Draft
) -> tuple[GroupOrder, Parameters]:
    """The group order and cache duration of the trailing track extensions; the others are
    the track's properties, which nothing here reads."""
    extensions = dict(decode_kvps(reader.raw(reader.remaining), True, draft.wire))
    order = extensions.get(DEFAULT_PUBLISHER_GROUP_ORDER, GroupOrder.ASCENDING)
    if order not in (GroupOrder.ASCENDING, GroupOrder.DESCENDING):
        raise DecodeError(f"track group order {order!r}")
    duration = extensions.get(MAX_CACHE_DURATION)
    if isinstance(duration, int):
        parameters = dataclasses.replace(parameters, max_cache_duration=duration)
    return GroupOrder(order), parameters


# ---------------------------------------------------------------------------------------------
# The message base and registry.

_REGISTRY: dict[int, dict[int, type[ControlMessage]]] = {number: {} for number in CODED}
"""Per draft number, the message class each wire type decodes to."""


@dataclass(frozen=True, slots=True)
class ControlMessage:
    """Base of all control messages. ``TYPE`` is the wire code.

    ``NEW_REQUEST`` marks the messages that consume the sender's next Request ID. A message
    is decoded under the drafts from ``SINCE`` to ``UNTIL``; one that a later draft replaced
    (draft 14's per-family replies) still encodes there, as its replacement (`wire_type`).
    """

    TYPE: ClassVar[int]
    TYPE_FROM: ClassVar[tuple[tuple[int, int], ...]] = ()
    """(draft, type) where a later draft numbers this message otherwise, oldest first."""
    NEW_REQUEST: ClassVar[bool] = False
    SINCE: ClassVar[int] = 14
    UNTIL: ClassVar[int | None] = None
    REPLACED: ClassVar[bool] = False
    """After ``UNTIL`` this message still goes out, as the message that replaced it."""

    @classmethod
    def decoded_in(cls, number: int) -> bool:
        """Whether draft `number` reads this message's type as this message."""
        return number >= cls.SINCE and (cls.UNTIL is None or number <= cls.UNTIL)

    @classmethod
    def spoken_in(cls, draft: Draft) -> bool:
        """Whether this message can be sent in a session of `draft`."""
        return cls.decoded_in(draft.number) or (cls.REPLACED and draft.number >= cls.SINCE)

    @classmethod
    def type_in(cls, number: int) -> int:
        """This message's type in draft `number`."""
        return next((t for since, t in reversed(cls.TYPE_FROM) if number >= since), cls.TYPE)

    def wire_type(self, draft: Draft) -> int:
        return self.type_in(draft.number)

    def encode(self, draft: Draft = DRAFT_14) -> bytes:
        if not self.spoken_in(draft):
            raise ValueError(f"{draft} has no {type(self).__name__}")
        payload = self.encode_payload(draft)
        if len(payload) > MAX_MESSAGE_LENGTH:
            raise ValueError(f"{type(self).__name__} payload of {len(payload)} bytes is too long")
        return draft.wire.varint(self.wire_type(draft)) + len(payload).to_bytes(2, "big") + payload

    def encode_payload(self, draft: Draft) -> bytes:
        raise NotImplementedError

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        raise NotImplementedError


_M = TypeVar("_M", bound=type["ControlMessage"])


def _register(cls: _M) -> _M:
    for number, table in _REGISTRY.items():
        if cls.decoded_in(number):
            wire_type = cls.type_in(number)
            assert wire_type not in table, (number, hex(wire_type))
            table[wire_type] = cls
    return cls


def decode_control(
    data: Buffer,
    draft: Draft = DRAFT_14,
    read_as: Mapping[int, type[ControlMessage]] | None = None,
) -> tuple[ControlMessage, int]:
    """Decode the framed message at the front of ``data`` as `draft` has it; return it and
    the bytes it used. `read_as` names the class of types whose meaning depends on the
    request stream they come on (`replies.READ_AS`).

    Raises ``NeedMoreData`` while the frame is incomplete and ``DecodeError`` for an unknown
    type or a payload whose fields do not fill its length exactly.
    """
    reader = draft.wire.reader(data)
    message_type = reader.varint()
    cls = (read_as or {}).get(message_type) or _REGISTRY[draft.number].get(message_type)
    if cls is None:
        raise DecodeError(f"unknown control message type {message_type:#x} in {draft}")
    length = reader.u16()
    end = reader.pos + length
    if end > reader.end:
        raise NeedMoreData("control message payload")
    payload = draft.wire.reader(reader.data, reader.pos, end)
    try:
        message = cls.decode_payload(payload, draft)
    except NeedMoreData:
        raise DecodeError(f"{cls.__name__}: fields run past the length {length}") from None
    if not payload.at_end():
        raise DecodeError(f"{cls.__name__}: {payload.remaining} bytes left after the fields")
    return message, end


def decode_buffered(
    buffer: bytearray,
    draft: Draft,
    read_as: Mapping[int, type[ControlMessage]] | None = None,
) -> list[ControlMessage]:
    """The whole messages at the front of a stream's `buffer`, which keeps what follows
    them (part of the next). A malformed one raises, and the buffer is left as it was: a
    propagating error's traceback still holds views of it, so it cannot be resized then,
    and the stream is over anyway."""
    messages: list[ControlMessage] = []
    consumed = 0
    try:
        while consumed < len(buffer):
            message, length = decode_control(memoryview(buffer)[consumed:], draft, read_as)
            consumed += length
            messages.append(message)
    except NeedMoreData:
        pass
    del buffer[:consumed]
    return messages


def delivery_pairs(
    forward: bool,
    subscriber_priority: int,
    filter: SubscriptionFilter,
    group_order: GroupOrder,
    draft: Draft,
) -> list[KeyValuePair]:
    """Draft 16's parameters for a subscription's delivery (SUBSCRIBE, PUBLISH_OK)."""
    return field_pairs(
        forward=forward,
        subscriber_priority=subscriber_priority,
        filter=filter,
        group_order=group_order,
        draft=draft,
    )


@dataclass(frozen=True, slots=True)
class _RequestIdOnly(ControlMessage):
    """Layout of the messages whose whole payload is one request id."""

    request_id: int

    def encode_payload(self, draft: Draft) -> bytes:
        return draft.wire.varint(self.request_id)

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        return cls(reader.varint())


# ---------------------------------------------------------------------------------------------
# Replies shared by every request family: draft 16's REQUEST_OK and REQUEST_ERROR, and draft
# 14's layouts of the replies they replaced, which go out as them from draft 16 on
# (`messages.replies.family_reply` turns them back).


@_register
@dataclass(frozen=True, slots=True)
class RequestOk(ControlMessage):
    """Accepts a request that has no reply of its own: what it reports of the track
    (TRACK_STATUS: the largest location, expiry) is all it carries."""

    TYPE: ClassVar[int] = 0x07
    SINCE: ClassVar[int] = 16

    request_id: int
    expires: int = 0
    largest: Location | None = None
    parameters: Parameters = NO_PARAMETERS

    def encode_payload(self, draft: Draft) -> bytes:
        # Draft 18 ends it with track properties: kvmoq states none here.
        return reply_id(self.request_id, draft) + track_report(
            self.expires, self.largest, self.parameters, draft
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id = read_reply_id(reader, draft)
        fields, parameters = decode_fields(reader, draft)
        if draft.request_streams:
            _, parameters = decode_track_extensions(reader, parameters, draft)
        return cls(request_id, fields.expires, fields.largest, parameters)


@_register
@dataclass(frozen=True, slots=True)
class RequestError(ControlMessage):
    """Refuses any request; `error_code` in draft 16's one table (`RequestErrorCode`)."""

    TYPE: ClassVar[int] = 0x05
    SINCE: ClassVar[int] = 16

    request_id: int
    error_code: int
    retry_interval: int = 0
    """Milliseconds to wait before trying again, plus one; 0: do not try again."""
    reason: str = ""

    def encode_payload(self, draft: Draft) -> bytes:
        redirect = b""
        if draft.request_streams and self.error_code == RequestErrorCode.REDIRECT:
            redirect = b"\x00\x00\x00"  # kvmoq names no target: this session, same names
        return b"".join(
            (
                reply_id(self.request_id, draft),
                draft.wire.varint(self.error_code),
                draft.wire.varint(self.retry_interval),
                draft.wire.reason(self.reason),
                redirect,
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        error = cls(read_reply_id(reader, draft), reader.varint(), reader.varint(), reader.reason())
        if draft.request_streams and error.error_code == RequestErrorCode.REDIRECT:
            # Where to ask instead: kvmoq does not follow redirects, but reads them whole.
            reader.bytes_vi(MAX_GOAWAY_URI, "redirect URI")
            _read_track(reader, allow_empty=True)
        return error


@dataclass(frozen=True, slots=True)
class _OkOfRequest(_RequestIdOnly):
    """Layout of draft 14's replies that only accept a request; REQUEST_OK from draft 16."""

    UNTIL: ClassVar[int | None] = 14
    REPLACED: ClassVar[bool] = True

    def wire_type(self, draft: Draft) -> int:
        return RequestOk.TYPE if draft.request_replies else self.TYPE

    def encode_payload(self, draft: Draft) -> bytes:
        if draft.request_replies:
            return RequestOk(self.request_id).encode_payload(draft)
        return draft.wire.varint(self.request_id)


@dataclass(frozen=True, slots=True)
class _RequestError(ControlMessage):
    """Draft 14's *_ERROR layout; REQUEST_ERROR from draft 16, its code renumbered into
    that draft's one table (`RENUMBERED`: this family's codes that moved)."""

    UNTIL: ClassVar[int | None] = 14
    REPLACED: ClassVar[bool] = True
    RENUMBERED: ClassVar[dict[int, int]] = {}

    request_id: int
    error_code: int
    reason: str = ""

    def wire_type(self, draft: Draft) -> int:
        return RequestError.TYPE if draft.request_replies else self.TYPE

    def encode_payload(self, draft: Draft) -> bytes:
        if draft.request_replies:
            # Retry interval 0, do not retry: nothing kvmoq refuses gets better by waiting.
            code = self.RENUMBERED.get(self.error_code, self.error_code)
            return RequestError(self.request_id, code, 0, self.reason).encode_payload(draft)
        return (
            draft.wire.varint(self.request_id)
            + draft.wire.varint(self.error_code)
            + draft.wire.reason(self.reason)
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        return cls(reader.varint(), reader.varint(), reader.reason())

    @classmethod
    def from_request_error(cls, error: RequestError) -> Self:
        """This family's error for a REQUEST_ERROR (its code in this family's numbers)."""
        return cls(error.request_id, draft_14_code(cls.RENUMBERED, error.error_code), error.reason)


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

    DELIVERY: ClassVar[bool] = True
    """Whether draft 16 sends the delivery fields (TRACK_STATUS does not)."""

    def encode_payload(self, draft: Draft) -> bytes:
        head = draft.wire.varint(self.request_id) + _encode_track(self.track, draft)
        if draft.request_parameters:
            fields = delivery_pairs(
                self.forward, self.subscriber_priority, self.filter, self.group_order, draft
            )
            return head + encode_message_parameters(
                fields if self.DELIVERY else (), self.parameters, draft
            )
        return b"".join(
            (
                head,
                bytes((self.subscriber_priority, self.group_order, self.forward)),
                self.filter.encode(draft),
                self.parameters.encode(draft),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id, track = reader.varint(), _read_track(reader)
        if draft.request_parameters:
            fields, parameters = decode_fields(reader, draft)
            return cls(
                request_id,
                track,
                fields.subscriber_priority,
                fields.group_order(GroupOrder.PUBLISHER_DEFAULT),
                fields.forward,
                fields.filter,
                parameters,
            )
        return cls(
            request_id=request_id,
            track=track,
            subscriber_priority=reader.u8(),
            group_order=_read_group_order(reader, allow_default=True),
            forward=reader.flag("forward"),
            filter=SubscriptionFilter.decode(reader, draft),
            parameters=Parameters.decode(reader, draft),
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

    def encode_payload(self, draft: Draft) -> bytes:
        if draft.request_parameters:
            return b"".join(
                (
                    reply_id(self.request_id, draft),
                    draft.wire.varint(self.track_alias),
                    track_report(self.expires, self.largest, self.parameters, draft),
                    encode_track_extensions(self.group_order, self.parameters, draft),
                )
            )
        return b"".join(
            (
                draft.wire.varint(self.request_id),
                draft.wire.varint(self.track_alias),
                draft.wire.varint(self.expires),
                bytes((self.group_order,)),
                _encode_optional_location(self.largest, draft),
                self.parameters.encode(draft),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id, alias = read_reply_id(reader, draft), reader.varint()
        if draft.request_parameters:
            fields, parameters = decode_fields(reader, draft)
            order, parameters = decode_track_extensions(reader, parameters, draft)
            return cls(request_id, alias, fields.expires, order, fields.largest, parameters)
        return cls(
            request_id=request_id,
            track_alias=alias,
            expires=reader.varint(),
            group_order=_read_group_order(reader, allow_default=cls.ALLOW_DEFAULT_ORDER),
            largest=_read_optional_location(reader),
            parameters=Parameters.decode(reader, draft),
        )


@dataclass(frozen=True, slots=True)
class _NamespaceOnly(ControlMessage):
    """Layout of the messages whose whole payload is a namespace tuple."""

    ALLOW_EMPTY: ClassVar[bool] = False

    namespace: tuple[bytes, ...]

    def encode_payload(self, draft: Draft) -> bytes:
        return draft.wire.tuple(self.namespace)

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        return cls(reader.tuple(cls.ALLOW_EMPTY))
