"""PUBLISH family: PUBLISH, PUBLISH_OK, PUBLISH_ERROR."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from ..drafts import Draft
from ..errors import PUBLISH_RENUMBERED, DecodeError
from ..model import FullTrackName, GroupOrder, Location
from ..wire import Reader
from .base import (
    DEFAULT_FILTER,
    ControlMessage,
    RequestOk,
    SubscriptionFilter,
    _encode_optional_location,
    _encode_track,
    _read_group_order,
    _read_optional_location,
    _read_track,
    _register,
    _RequestError,
    decode_fields,
    decode_track_extensions,
    delivery_pairs,
    encode_track_extensions,
    field_pairs,
    read_reply_id,
    reply_id,
)
from .parameters import NO_PARAMETERS, Parameters, encode_message_parameters


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

    def encode_payload(self, draft: Draft) -> bytes:
        head = (
            draft.wire.varint(self.request_id)
            + _encode_track(self.track, draft)
            + draft.wire.varint(self.track_alias)
        )
        if draft.request_parameters:
            fields = field_pairs(largest=self.largest, forward=self.forward, draft=draft)
            return b"".join(
                (
                    head,
                    encode_message_parameters(fields, self.parameters, draft),
                    encode_track_extensions(self.group_order, self.parameters, draft),
                )
            )
        return b"".join(
            (
                head,
                bytes((self.group_order,)),
                _encode_optional_location(self.largest, draft),
                bytes((self.forward,)),
                self.parameters.encode(draft),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id, track, alias = reader.varint(), _read_track(reader), reader.varint()
        if draft.request_parameters:
            fields, parameters = decode_fields(reader, draft)
            order, parameters = decode_track_extensions(reader, parameters, draft)
            return cls(request_id, track, alias, order, fields.largest, fields.forward, parameters)
        return cls(
            request_id=request_id,
            track=track,
            track_alias=alias,
            group_order=_read_group_order(reader, allow_default=False),
            largest=_read_optional_location(reader),
            forward=reader.flag("forward"),
            parameters=Parameters.decode(reader, draft),
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

    def wire_type(self, draft: Draft) -> int:
        # Draft 18 answers a PUBLISH with REQUEST_OK, these fields its parameters; it still
        # reads 0x1E as PUBLISH_OK. Its request stream says which request it answers.
        return RequestOk.TYPE if draft.request_streams else self.TYPE

    def encode_payload(self, draft: Draft) -> bytes:
        if draft.request_parameters:
            fields = delivery_pairs(
                self.forward, self.subscriber_priority, self.filter, self.group_order, draft
            )
            return reply_id(self.request_id, draft) + encode_message_parameters(
                fields, self.parameters, draft
            )
        return b"".join(
            (
                draft.wire.varint(self.request_id),
                bytes((self.forward, self.subscriber_priority, self.group_order)),
                self.filter.encode(draft),
                self.parameters.encode(draft),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id = read_reply_id(reader, draft)
        if draft.request_parameters:
            fields, parameters = decode_fields(reader, draft)
            if draft.request_streams and not reader.at_end():
                raise DecodeError("PUBLISH_OK states no track properties")
            return cls(
                request_id,
                fields.forward,
                fields.subscriber_priority,
                fields.group_order(GroupOrder.PUBLISHER_DEFAULT),
                fields.filter,
                parameters,
            )
        return cls(
            request_id=request_id,
            forward=reader.flag("forward"),
            subscriber_priority=reader.u8(),
            group_order=_read_group_order(reader, allow_default=True),
            filter=SubscriptionFilter.decode(reader, draft),
            parameters=Parameters.decode(reader, draft),
        )


@_register
@dataclass(frozen=True, slots=True)
class PublishError(_RequestError):
    TYPE: ClassVar[int] = 0x1F
    RENUMBERED: ClassVar[dict[int, int]] = PUBLISH_RENUMBERED
