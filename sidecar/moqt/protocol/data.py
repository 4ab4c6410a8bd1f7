"""The MoQT data plane: subgroup and fetch streams, objects, datagrams, as each draft
writes them (`drafts.Draft`: draft 16 codes extension types as deltas, may leave out a
publisher priority, serializes FETCH objects with flags, and has no DOES_NOT_EXIST status).

Objects of a subgroup stream only make sense after the stream's header (their ids are
delta-encoded and whether they carry extensions is in the header type), so a stream is parsed
by ``DataStreamParser``, which is fed bytes as QUIC delivers them and returns the header and
then each object as soon as it is complete. It holds at most one incomplete object, whose
payload is capped (``max_payload``), and once it knows how long an object is it does not try
again until that many bytes are there, so a large object costs one copy in and one copy out.

Extension headers are kept as the raw bytes of their key-value pairs as draft 14 codes them
(absolute types, QUIC varints): within draft 14 relays forward them untouched (re-encoding
could change a non-minimal varint); a later draft (types as deltas, draft 18's integers)
gets them converted on the way out and in. They are checked on arrival.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import IntEnum

from .drafts import DRAFT_14, Draft
from .errors import DecodeError, NeedMoreData, ObjectTooLarge, SessionErrorCode
from .model import ObjectStatus
from .wire import Buffer, Reader, decode_kvps, encode_kvps

DEFAULT_MAX_OBJECT_PAYLOAD = 64 * 1024 * 1024
MAX_EXTENSIONS_LENGTH = 65535

FETCH_HEADER_TYPE = 0x05
_SUBGROUP_BASE = 0x10
_SUBGROUP_EXTENSIONS = 0x01
_SUBGROUP_END_OF_GROUP = 0x08
_SUBGROUP_DEFAULT_PRIORITY = 0x20
_SUBGROUP_FIRST_OBJECT = 0x40
_DATAGRAM_EXTENSIONS = 0x01
_DATAGRAM_END_OF_GROUP = 0x02
_DATAGRAM_NO_OBJECT_ID = 0x04
_DATAGRAM_DEFAULT_PRIORITY = 0x08
_STATUS_DATAGRAM = 0x20
DEFAULT_PUBLISHER_PRIORITY = 128
"""A track's publisher priority where its objects leave theirs out (draft 16 lets a track
name another; kvmoq's tracks do not, and it reads none)."""


class SubgroupIdMode(IntEnum):
    """Bits 0x06 of the subgroup header type: where the subgroup id comes from."""

    ZERO = 0
    FIRST_OBJECT = 1
    EXPLICIT = 2


def is_subgroup_type(stream_type: int, draft: Draft = DRAFT_14) -> bool:
    """0x10-0x15 and 0x18-0x1D (and, where the priority may be left out, 0x30-0x35 and
    0x38-0x3D; where a stream may say it starts the subgroup, those | 0x40); mode 0b11
    (0x16/0x17/0x1E/0x1F ...) is invalid. kvmoq reads the first-object bit and sets none:
    what a relay may always do."""
    optional = _SUBGROUP_DEFAULT_PRIORITY if draft.omitted_priority else 0
    if draft.first_object_flag:
        optional |= _SUBGROUP_FIRST_OBJECT
    return stream_type & ~(0x0F | optional) == _SUBGROUP_BASE and (stream_type >> 1) & 0x03 != 0x03


@dataclass(frozen=True, slots=True)
class SubgroupHeader:
    """``subgroup_id`` is None exactly in FIRST_OBJECT mode, where the first object sets it."""

    track_alias: int
    group_id: int
    subgroup_id: int | None = 0
    publisher_priority: int = 128
    extensions: bool = False
    end_of_group: bool = False
    subgroup_id_mode: SubgroupIdMode = SubgroupIdMode.ZERO

    def __post_init__(self) -> None:
        mode = self.subgroup_id_mode
        if (mode == SubgroupIdMode.FIRST_OBJECT) != (self.subgroup_id is None) or (
            mode == SubgroupIdMode.ZERO and self.subgroup_id != 0
        ):
            raise ValueError(f"subgroup id {self.subgroup_id} does not fit mode {mode!r}")

    @classmethod
    def for_subgroup(
        cls,
        track_alias: int,
        group_id: int,
        subgroup_id: int,
        publisher_priority: int = 128,
        extensions: bool = False,
        end_of_group: bool = False,
    ) -> SubgroupHeader:
        """The shortest header for a known subgroup id."""
        mode = SubgroupIdMode.ZERO if subgroup_id == 0 else SubgroupIdMode.EXPLICIT
        return cls(
            track_alias, group_id, subgroup_id, publisher_priority, extensions, end_of_group, mode
        )

    @property
    def stream_type(self) -> int:
        return (
            _SUBGROUP_BASE
            | (_SUBGROUP_EXTENSIONS if self.extensions else 0)
            | self.subgroup_id_mode << 1
            | (_SUBGROUP_END_OF_GROUP if self.end_of_group else 0)
        )

    def encode(self, draft: Draft = DRAFT_14) -> bytes:
        out = draft.wire.varint(self.stream_type)
        out += draft.wire.varint(self.track_alias) + draft.wire.varint(self.group_id)
        if self.subgroup_id_mode == SubgroupIdMode.EXPLICIT:
            out += draft.wire.varint(self.subgroup_id)  # type: ignore[arg-type]
        return out + bytes((self.publisher_priority,))

    @classmethod
    def decode_after_type(cls, stream_type: int, reader: Reader) -> SubgroupHeader:
        """The header after its type (`is_subgroup_type` checked it for the draft)."""
        mode = SubgroupIdMode((stream_type >> 1) & 0x03)
        track_alias = reader.varint()
        group_id = reader.varint()
        subgroup_id: int | None = None  # FIRST_OBJECT: known once the first object is
        if mode == SubgroupIdMode.EXPLICIT:
            subgroup_id = reader.varint()
        elif mode == SubgroupIdMode.ZERO:
            subgroup_id = 0
        omitted = stream_type & _SUBGROUP_DEFAULT_PRIORITY
        return cls(
            track_alias,
            group_id,
            subgroup_id,
            DEFAULT_PUBLISHER_PRIORITY if omitted else reader.u8(),
            bool(stream_type & _SUBGROUP_EXTENSIONS),
            bool(stream_type & _SUBGROUP_END_OF_GROUP),
            mode,
        )


@dataclass(frozen=True, slots=True)
class FetchHeader:
    request_id: int

    def encode(self, draft: Draft = DRAFT_14) -> bytes:
        return draft.wire.varint(FETCH_HEADER_TYPE) + draft.wire.varint(self.request_id)


@dataclass(frozen=True, slots=True)
class ObjectBody:
    """What every object form shares: payload, status and raw extension bytes.

    A non-normal status has no payload; a DOES_NOT_EXIST object has no extensions.
    """

    payload: bytes = b""
    status: ObjectStatus = ObjectStatus.NORMAL
    extensions: bytes = b""

    def __post_init__(self) -> None:
        if self.status != ObjectStatus.NORMAL and self.payload:
            raise ValueError(f"a {self.status.name} object has no payload")
        if self.status == ObjectStatus.DOES_NOT_EXIST and self.extensions:
            raise ValueError("a DOES_NOT_EXIST object has no extensions")
        if len(self.extensions) > MAX_EXTENSIONS_LENGTH:
            raise ValueError(f"extensions longer than {MAX_EXTENSIONS_LENGTH} bytes")

    def encode_stream_tail(
        self, with_extensions: bool, draft: Draft = DRAFT_14, with_status: bool = True
    ) -> bytes:
        """``[ext_len ext] payload_len [status] payload`` as on subgroup and fetch streams
        (draft 16's FETCH objects carry no status: `with_status` False)."""
        if self.extensions and not with_extensions:
            raise ValueError("extensions need a stream type that carries them")
        if self.status not in draft.object_statuses:
            raise ValueError(f"{draft} has no object status {self.status.name}")
        out = (
            draft.wire.bytes_vi(_extensions_out(self.extensions, draft)) if with_extensions else b""
        )
        out += draft.wire.varint(len(self.payload))
        if not self.payload and with_status:
            out += draft.wire.varint(self.status)
        return out + self.payload

    @classmethod
    def decode_stream_tail(
        cls,
        reader: Reader,
        with_extensions: bool,
        max_payload: int,
        draft: Draft = DRAFT_14,
        with_status: bool = True,
    ) -> ObjectBody:
        extensions = _read_extensions(reader, draft) if with_extensions else b""
        length = reader.varint()
        if length > max_payload:
            raise ObjectTooLarge(f"object payload of {length} bytes exceeds {max_payload}")
        if length or not with_status:
            return cls(bytes(reader.raw(length)), ObjectStatus.NORMAL, extensions)
        return _body(b"", _read_status(reader, draft), extensions)


@dataclass(frozen=True, slots=True)
class SubgroupObject:
    object_id: int
    body: ObjectBody = ObjectBody()

    def encode(
        self, header: SubgroupHeader, previous_id: int | None, draft: Draft = DRAFT_14
    ) -> bytes:
        """The object as it follows ``previous_id`` (None for the first) on the stream."""
        delta = self.object_id if previous_id is None else self.object_id - previous_id - 1
        if delta < 0:
            raise ValueError(f"object id {self.object_id} does not follow {previous_id}")
        return draft.wire.varint(delta) + self.body.encode_stream_tail(header.extensions, draft)


@dataclass(frozen=True, slots=True)
class FetchObject:
    group_id: int
    subgroup_id: int
    object_id: int
    publisher_priority: int = 128
    body: ObjectBody = ObjectBody()

    def encode(self, previous: FetchObject | None = None, draft: Draft = DRAFT_14) -> bytes:
        """The object as it follows `previous` (None for the first) on its FETCH stream;
        draft 14 writes every field, draft 16 what `previous` does not imply, draft 18 that
        as steps from `previous` (groups counted down where the fetch is descending)."""
        if not draft.fetch_flags:
            return (
                draft.wire.varint(self.group_id)
                + draft.wire.varint(self.subgroup_id)
                + draft.wire.varint(self.object_id)
                + bytes((self.publisher_priority,))
                + self.body.encode_stream_tail(with_extensions=True)
            )
        if self.body.status != ObjectStatus.NORMAL:
            raise ValueError(f"{draft}'s FETCH objects carry no status")
        flags, fields = 0, b""
        same_group = previous is not None and previous.group_id == self.group_id
        stepped = draft.fetch_deltas and previous is not None
        if not same_group:
            flags |= _FETCH_GROUP
            if stepped:
                fields += draft.wire.varint(abs(self.group_id - previous.group_id) - 1)  # type: ignore[union-attr]
            else:
                fields += draft.wire.varint(self.group_id)
        prior_subgroup = None if previous is None else previous.subgroup_id
        if self.subgroup_id == 0:
            mode = _FETCH_SUBGROUP_ZERO
        elif prior_subgroup is not None and self.subgroup_id == prior_subgroup:
            mode = _FETCH_SUBGROUP_PRIOR
        elif prior_subgroup is not None and self.subgroup_id == prior_subgroup + 1:
            mode = _FETCH_SUBGROUP_NEXT
        else:
            mode = _FETCH_SUBGROUP_FIELD
        flags |= mode
        if mode == _FETCH_SUBGROUP_FIELD:
            fields += draft.wire.varint(self.subgroup_id)
        if not same_group or self.object_id != previous.object_id + 1:  # type: ignore[union-attr]
            flags |= _FETCH_OBJECT
            if stepped and same_group:
                step = self.object_id - previous.object_id  # type: ignore[union-attr]
                if step < 0:
                    raise ValueError(f"object {self.object_id} after {previous.object_id}")  # type: ignore[union-attr]
                fields += draft.wire.varint(step)
            else:
                fields += draft.wire.varint(self.object_id)
        if previous is None or previous.publisher_priority != self.publisher_priority:
            flags |= _FETCH_PRIORITY
            fields += bytes((self.publisher_priority,))
        if self.body.extensions:
            flags |= _FETCH_EXTENSIONS
        tail = self.body.encode_stream_tail(bool(self.body.extensions), draft, with_status=False)
        return draft.wire.varint(flags) + fields + tail

    @classmethod
    def decode(
        cls,
        reader: Reader,
        max_payload: int,
        previous: FetchObject | None = None,
        draft: Draft = DRAFT_14,
        descending: bool = False,
    ) -> FetchObject | FetchRangeEnd:
        """The next object (or, from draft 16, end-of-range marker) of a FETCH stream;
        `descending`: the fetch's groups come newest first (draft 18 steps down to them)."""
        if not draft.fetch_flags:
            return cls(
                reader.varint(),
                reader.varint(),
                reader.varint(),
                reader.u8(),
                ObjectBody.decode_stream_tail(reader, True, max_payload),
            )
        flags = reader.varint()
        if flags in _FETCH_RANGE_ENDS:
            return FetchRangeEnd(reader.varint(), reader.varint(), flags == _FETCH_UNKNOWN_RANGE)
        if flags >= 0x80:
            raise DecodeError(f"unknown FETCH serialization flags {flags:#x}")
        if previous is None and not (
            flags & _FETCH_GROUP and flags & _FETCH_OBJECT and flags & _FETCH_PRIORITY
        ):
            raise DecodeError("the first FETCH object leaves out what no object before it says")
        stepped = draft.fetch_deltas and previous is not None
        if not flags & _FETCH_GROUP:
            group = previous.group_id  # type: ignore[union-attr]
        elif stepped:
            step = reader.varint() + 1
            group = previous.group_id - step if descending else previous.group_id + step  # type: ignore[union-attr]
            if group < 0 or group > draft.wire.MAX_INT:
                raise DecodeError(f"FETCH group step of {step} leaves the group ids")
        else:
            group = reader.varint()
        mode = flags & 0x03
        if flags & _FETCH_DATAGRAM or mode == _FETCH_SUBGROUP_ZERO:
            subgroup = 0
        elif mode == _FETCH_SUBGROUP_FIELD:
            subgroup = reader.varint()
        elif previous is None:
            raise DecodeError("the first FETCH object names its subgroup by the one before")
        else:
            subgroup = previous.subgroup_id + (mode == _FETCH_SUBGROUP_NEXT)
        if not flags & _FETCH_OBJECT:
            object_id = previous.object_id + 1  # type: ignore[union-attr]
        elif stepped and not flags & _FETCH_GROUP:
            object_id = previous.object_id + reader.varint()  # type: ignore[union-attr]
            if object_id > draft.wire.MAX_INT:
                raise DecodeError("FETCH object step past the largest object id")
        else:
            object_id = reader.varint()
        priority = reader.u8() if flags & _FETCH_PRIORITY else previous.publisher_priority  # type: ignore[union-attr]
        body = ObjectBody.decode_stream_tail(
            reader, bool(flags & _FETCH_EXTENSIONS), max_payload, draft, with_status=False
        )
        return cls(group, subgroup, object_id, priority, body)


_FETCH_SUBGROUP_ZERO = 0x00
_FETCH_SUBGROUP_PRIOR = 0x01
_FETCH_SUBGROUP_NEXT = 0x02
_FETCH_SUBGROUP_FIELD = 0x03
_FETCH_OBJECT = 0x04
_FETCH_GROUP = 0x08
_FETCH_PRIORITY = 0x10
_FETCH_EXTENSIONS = 0x20
_FETCH_DATAGRAM = 0x40
_FETCH_NONEXISTENT_RANGE = 0x8C
_FETCH_UNKNOWN_RANGE = 0x10C
_FETCH_RANGE_ENDS = (_FETCH_NONEXISTENT_RANGE, _FETCH_UNKNOWN_RANGE)
"""Draft 16's FETCH serialization flags (below 0x80, bits) and end-of-range markers."""


@dataclass(frozen=True, slots=True)
class FetchRangeEnd:
    """Draft 16: no object after the previous one up to (group, object) exists (or, where
    `unknown`, whether any does is not known). Nothing is delivered for it."""

    group_id: int
    object_id: int
    unknown: bool = False


@dataclass(frozen=True, slots=True)
class ObjectDatagram:
    """An object in one QUIC datagram; a non-normal status uses the status types 0x20/0x21."""

    track_alias: int
    group_id: int
    object_id: int
    publisher_priority: int = 128
    body: ObjectBody = ObjectBody()
    end_of_group: bool = False

    def __post_init__(self) -> None:
        if self.end_of_group and self.body.status != ObjectStatus.NORMAL:
            raise ValueError("status datagrams have no end-of-group flag")

    def encode(self, draft: Draft = DRAFT_14) -> bytes:
        body = self.body
        if body.status not in draft.object_statuses:
            raise ValueError(f"{draft} has no object status {body.status.name}")
        is_status = body.status != ObjectStatus.NORMAL
        datagram_type = (_DATAGRAM_EXTENSIONS if body.extensions else 0) | (
            _STATUS_DATAGRAM
            if is_status
            else (_DATAGRAM_END_OF_GROUP if self.end_of_group else 0)
            | (_DATAGRAM_NO_OBJECT_ID if self.object_id == 0 else 0)
        )
        out = draft.wire.varint(datagram_type)
        out += draft.wire.varint(self.track_alias) + draft.wire.varint(self.group_id)
        if is_status or self.object_id != 0:
            out += draft.wire.varint(self.object_id)
        out += bytes((self.publisher_priority,))
        if body.extensions:
            out += draft.wire.bytes_vi(_extensions_out(body.extensions, draft))
        return out + (draft.wire.varint(body.status) if is_status else body.payload)


def _datagram_type_known(datagram_type: int, draft: Draft) -> bool:
    """Draft 14: 0x00-0x07 with a payload, 0x20-0x21 with a status. Draft 16: any of the bits
    0x2F, save a status with the end-of-group bit."""
    if not draft.omitted_priority:
        return datagram_type <= 0x07 or datagram_type in (0x20, 0x21)
    status = datagram_type & _STATUS_DATAGRAM
    return datagram_type & ~0x2F == 0 and not (status and datagram_type & _DATAGRAM_END_OF_GROUP)


def decode_datagram(data: Buffer, draft: Draft = DRAFT_14) -> ObjectDatagram:
    """Parse a whole OBJECT_DATAGRAM; any shortfall is malformed (a datagram is complete)."""
    reader = draft.wire.reader(data)
    try:
        datagram_type = reader.varint()
        if not _datagram_type_known(datagram_type, draft):
            raise DecodeError(f"unknown datagram type {datagram_type:#x} in {draft}")
        is_status = bool(datagram_type & _STATUS_DATAGRAM)
        track_alias = reader.varint()
        group_id = reader.varint()
        object_id = 0 if datagram_type & _DATAGRAM_NO_OBJECT_ID else reader.varint()
        omitted = datagram_type & _DATAGRAM_DEFAULT_PRIORITY
        priority = DEFAULT_PUBLISHER_PRIORITY if omitted else reader.u8()
        extensions = b""
        if datagram_type & _DATAGRAM_EXTENSIONS:
            extensions = _read_extensions(reader, draft)
            if not extensions:
                raise DecodeError("datagram flags extensions but carries none")
        if is_status:
            body = _body(b"", _read_status(reader, draft), extensions)
            if not reader.at_end():
                raise DecodeError("bytes after a status datagram")
        else:
            body = _body(bytes(reader.raw(reader.remaining)), ObjectStatus.NORMAL, extensions)
    except NeedMoreData:
        raise DecodeError("truncated datagram") from None
    end_of_group = not is_status and bool(datagram_type & _DATAGRAM_END_OF_GROUP)
    return ObjectDatagram(track_alias, group_id, object_id, priority, body, end_of_group)


def _read_extensions(reader: Reader, draft: Draft) -> bytes:
    """Extension bytes, checked, as draft 14 codes them (see the module docstring)."""
    length = reader.varint()
    if length > MAX_EXTENSIONS_LENGTH:
        raise DecodeError(f"extensions of {length} bytes exceed {MAX_EXTENSIONS_LENGTH}")
    raw = bytes(reader.raw(length))
    pairs = decode_kvps(raw, draft.delta_types, draft.wire)
    if draft.kvps_as_kept:
        return raw
    try:
        absolute = encode_kvps(pairs)
    except ValueError:  # draft 18's integers reach 2**64 - 1, draft 14's 2**62 - 1
        raise DecodeError(
            "an extension past what draft 14 can hold", SessionErrorCode.KEY_VALUE_FORMATTING_ERROR
        ) from None
    if len(absolute) > MAX_EXTENSIONS_LENGTH:
        raise DecodeError(f"extensions longer than {MAX_EXTENSIONS_LENGTH} bytes as draft 14's")
    return absolute


def _extensions_out(raw: bytes, draft: Draft) -> bytes:
    if not raw or draft.kvps_as_kept:
        return raw
    return draft.wire.kvps(decode_kvps(raw), delta=True)


def _read_status(reader: Reader, draft: Draft) -> ObjectStatus:
    value = reader.varint()
    if value not in draft.object_statuses:
        raise DecodeError(f"unknown object status {value:#x} in {draft}")
    return ObjectStatus(value)


def _body(payload: bytes, status: ObjectStatus, extensions: bytes) -> ObjectBody:
    """An ``ObjectBody`` whose invariants, broken by a peer, become a ``DecodeError``."""
    try:
        return ObjectBody(payload, status, extensions)
    except ValueError as exc:
        raise DecodeError(str(exc)) from None


StreamHeader = SubgroupHeader | FetchHeader
StreamItem = SubgroupHeader | FetchHeader | SubgroupObject | FetchObject


class DataStreamParser:
    """Incremental parser of one unidirectional data stream.

    ``feed`` returns the items completed by the new bytes: first the header, then objects.
    A FIN inside an item, or before any header, raises ``DecodeError``; an object longer than
    ``max_payload`` raises ``ObjectTooLarge``. After an exception the parser is unusable.
    """

    def __init__(
        self,
        max_payload: int = DEFAULT_MAX_OBJECT_PAYLOAD,
        draft: Draft = DRAFT_14,
        descending: Callable[[int], bool] | None = None,
    ) -> None:
        """`descending`: whether the FETCH of a request id is served newest group first
        (draft 18 counts its groups down then); None: every fetch ascends."""
        self.max_payload = max_payload
        self.draft = draft
        self._descending_of = descending
        self._descending = False
        self.header: StreamHeader | None = None
        # Resolved subgroup id (FIRST_OBJECT mode learns it from the first object).
        self.subgroup_id: int | None = None
        self.finished = False
        self._previous_id: int | None = None
        self._previous_fetched: FetchObject | None = None
        self._buffer = bytearray()
        self._need = 0

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete item."""
        return len(self._buffer)

    def feed(self, data: Buffer, end_stream: bool = False) -> list[StreamItem]:
        if self.finished:
            raise DecodeError("data after the end of the stream")
        items: list[StreamItem] = []
        if self._buffer:
            self._buffer += data
            if len(self._buffer) >= self._need:
                with memoryview(self._buffer) as view:
                    consumed = self._parse(view, items)
                del self._buffer[:consumed]
        else:
            with memoryview(data) as view:
                consumed = self._parse(view, items)
                self._buffer += view[consumed:]
        if end_stream:
            self.finished = True
            if self._buffer or self.header is None:
                raise DecodeError("stream ended inside an object")
        return items

    def _parse(self, view: memoryview, items: list[StreamItem]) -> int:
        pos = 0
        end = len(view)
        while pos < end:
            reader = self.draft.wire.reader(view, pos, end)
            try:
                item = self._parse_item(reader)
            except NeedMoreData as exc:
                self._need = (exc.needed if exc.needed is not None else end + 1) - pos
                return pos
            if item is not None:
                items.append(item)
            pos = reader.pos
        self._need = 0
        return pos

    def _parse_item(self, reader: Reader) -> StreamItem | None:
        """The next item; None for what only moves the stream's state (a range's end)."""
        header = self.header
        if isinstance(header, SubgroupHeader):
            delta = reader.varint()
            object_id = delta if self._previous_id is None else self._previous_id + delta + 1
            body = ObjectBody.decode_stream_tail(
                reader, header.extensions, self.max_payload, self.draft
            )
            if self.subgroup_id is None:
                self.subgroup_id = object_id
            self._previous_id = object_id
            return SubgroupObject(object_id, body)
        if isinstance(header, FetchHeader):
            previous = self._previous_fetched
            item = FetchObject.decode(
                reader, self.max_payload, previous, self.draft, self._descending
            )
            if isinstance(item, FetchRangeEnd):
                # The next object's ids count from the marker's; its subgroup and priority
                # from the last object's.
                last = previous or FetchObject(item.group_id, 0, item.object_id)
                self._previous_fetched = replace(
                    last, group_id=item.group_id, object_id=item.object_id
                )
                return None
            self._previous_fetched = item
            return item
        stream_type = reader.varint()
        if stream_type == FETCH_HEADER_TYPE:
            self.header = FetchHeader(reader.varint())
            if self._descending_of is not None:
                self._descending = self._descending_of(self.header.request_id)
        elif is_subgroup_type(stream_type, self.draft):
            self.header = SubgroupHeader.decode_after_type(stream_type, reader)
            self.subgroup_id = self.header.subgroup_id
        else:
            raise DecodeError(f"unknown data stream type {stream_type:#x}")
        return self.header
