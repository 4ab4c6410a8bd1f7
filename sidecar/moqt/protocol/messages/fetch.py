"""FETCH family: FETCH (standalone and joining), FETCH_OK, FETCH_ERROR, FETCH_CANCEL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Self

from ..drafts import Draft
from ..errors import FETCH_RENUMBERED, DecodeError
from ..model import FullTrackName, GroupOrder, Location, ObjectStatus, TrackObject
from ..wire import (
    Reader,
)
from .base import (
    ControlMessage,
    _encode_track,
    _read_group_order,
    _read_track,
    _register,
    _RequestError,
    _RequestIdOnly,
    decode_fields,
    decode_track_extensions,
    encode_track_extensions,
    field_pairs,
    read_reply_id,
    reply_id,
)
from .parameters import NO_PARAMETERS, Parameters, encode_message_parameters


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
    parameters: Parameters = NO_PARAMETERS

    @property
    def fetch_type(self) -> FetchType:
        if isinstance(self.target, StandaloneFetch):
            return FetchType.STANDALONE
        return FetchType.ABSOLUTE_JOINING if self.target.absolute else FetchType.RELATIVE_JOINING

    def encode_payload(self, draft: Draft) -> bytes:
        target = self.target
        if isinstance(target, StandaloneFetch):
            end_object = 0 if target.end_object is None else target.end_object + 1
            body = (
                _encode_track(target.track, draft)
                + draft.wire.location(target.start)
                + draft.wire.location(Location(target.end_group, end_object))
            )
        else:
            body = draft.wire.varint(target.joining_request_id) + draft.wire.varint(
                target.joining_start
            )
        if draft.request_parameters:
            fields = field_pairs(
                subscriber_priority=self.subscriber_priority,
                group_order=self.group_order,
                draft=draft,
            )
            return b"".join(
                (
                    draft.wire.varint(self.request_id),
                    draft.wire.varint(self.fetch_type),
                    body,
                    encode_message_parameters(fields, self.parameters, draft),
                )
            )
        return b"".join(
            (
                draft.wire.varint(self.request_id),
                bytes((self.subscriber_priority, self.group_order)),
                draft.wire.varint(self.fetch_type),
                body,
                self.parameters.encode(draft),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id = reader.varint()
        if not draft.request_parameters:
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
        if draft.request_parameters:
            fields, parameters = decode_fields(reader, draft)
            priority = fields.subscriber_priority
            group_order = fields.group_order(GroupOrder.PUBLISHER_DEFAULT)
            return cls(request_id, target, priority, group_order, parameters)
        return cls(request_id, target, priority, group_order, Parameters.decode(reader, draft))


_MARKERS = (ObjectStatus.END_OF_GROUP, ObjectStatus.END_OF_TRACK)


def fetch_end(objects: Sequence[tuple[int, TrackObject]]) -> Location:
    """FETCH_OK's End Location for a response of `objects` (group id, object), in order.

    Counted from the last object that is not an end marker: moq-rs drops END_OF_GROUP and
    END_OF_TRACK status objects before it checks a fetch against its End, so an End that
    counts aiomoqt's trailing END_OF_GROUP object fails there as "ended early".
    """
    content = [(group, obj) for group, obj in objects if obj.status not in _MARKERS]
    group, last = (content or objects)[-1]
    return Location(group, last.object_id + 1)


@_register
@dataclass(frozen=True, slots=True)
class FetchOk(ControlMessage):
    """`end` is in FETCH's own End Location encoding: the last object covered + 1, object 0
    for a whole group (draft-14 says "the largest object covered", draft-19 spells out the
    encoding; moq-rs and aiomoqt both read and write it so). `fetch_end` makes it."""

    TYPE: ClassVar[int] = 0x18

    request_id: int
    end: Location
    end_of_track: bool = False
    group_order: GroupOrder = GroupOrder.ASCENDING
    parameters: Parameters = NO_PARAMETERS

    def encode_payload(self, draft: Draft) -> bytes:
        if draft.request_parameters:
            return b"".join(
                (
                    reply_id(self.request_id, draft),
                    bytes((self.end_of_track,)),
                    draft.wire.location(self.end),
                    encode_message_parameters((), self.parameters, draft),
                    encode_track_extensions(self.group_order, self.parameters, draft),
                )
            )
        return b"".join(
            (
                draft.wire.varint(self.request_id),
                bytes((self.group_order, self.end_of_track)),
                draft.wire.location(self.end),
                self.parameters.encode(draft),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id = read_reply_id(reader, draft)
        if draft.request_parameters:
            end_of_track = reader.flag("end of track")
            end = reader.location()
            _, parameters = decode_fields(reader, draft)  # aiomoqt sends a group order here
            order, parameters = decode_track_extensions(reader, parameters, draft)
            return cls(request_id, end, end_of_track, order, parameters)
        group_order = _read_group_order(reader, allow_default=False)
        end_of_track = reader.flag("end of track")
        end = reader.location()
        return cls(request_id, end, end_of_track, group_order, Parameters.decode(reader, draft))


@_register
@dataclass(frozen=True, slots=True)
class FetchError(_RequestError):
    TYPE: ClassVar[int] = 0x19
    RENUMBERED: ClassVar[dict[int, int]] = FETCH_RENUMBERED


@_register
@dataclass(frozen=True, slots=True)
class FetchCancel(_RequestIdOnly):
    TYPE: ClassVar[int] = 0x17
    UNTIL: ClassVar[int | None] = 16  # draft 18 resets the request's stream
