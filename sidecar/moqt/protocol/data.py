"""The MoQT draft-14 data plane: subgroup and fetch streams, objects, datagrams.

Objects of a subgroup stream only make sense after the stream's header (their ids are
delta-encoded and whether they carry extensions is in the header type), so a stream is parsed
by ``DataStreamParser``, which is fed bytes as QUIC delivers them and returns the header and
then each object as soon as it is complete. It holds at most one incomplete object, whose
payload is capped (``max_payload``), and once it knows how long an object is it does not try
again until that many bytes are there, so a large object costs one copy in and one copy out.

Extension headers are kept as the raw bytes of their key-value pairs: relays must forward them
untouched, and re-encoding could change a non-minimal varint. They are checked on arrival.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from .errors import DecodeError, NeedMoreData, ObjectTooLarge
from .model import ObjectStatus
from .wire import Buffer, Reader, decode_kvps, encode_bytes, encode_varint

DEFAULT_MAX_OBJECT_PAYLOAD = 64 * 1024 * 1024
MAX_EXTENSIONS_LENGTH = 65535

FETCH_HEADER_TYPE = 0x05
_SUBGROUP_BASE = 0x10
_SUBGROUP_EXTENSIONS = 0x01
_SUBGROUP_END_OF_GROUP = 0x08
_DATAGRAM_EXTENSIONS = 0x01
_DATAGRAM_END_OF_GROUP = 0x02
_DATAGRAM_NO_OBJECT_ID = 0x04
_STATUS_DATAGRAM = 0x20


class SubgroupIdMode(IntEnum):
    """Bits 0x06 of the subgroup header type: where the subgroup id comes from."""

    ZERO = 0
    FIRST_OBJECT = 1
    EXPLICIT = 2


def is_subgroup_type(stream_type: int) -> bool:
    """0x10-0x15 and 0x18-0x1D; mode 0b11 (0x16/0x17/0x1E/0x1F) is invalid."""
    return stream_type & ~0x0F == _SUBGROUP_BASE and (stream_type >> 1) & 0x03 != 0x03


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

    def encode(self) -> bytes:
        out = encode_varint(self.stream_type)
        out += encode_varint(self.track_alias) + encode_varint(self.group_id)
        if self.subgroup_id_mode == SubgroupIdMode.EXPLICIT:
            out += encode_varint(self.subgroup_id)  # type: ignore[arg-type]
        return out + bytes((self.publisher_priority,))

    @classmethod
    def decode_after_type(cls, stream_type: int, reader: Reader) -> SubgroupHeader:
        mode = SubgroupIdMode((stream_type >> 1) & 0x03)
        track_alias = reader.varint()
        group_id = reader.varint()
        subgroup_id: int | None = None  # FIRST_OBJECT: known once the first object is
        if mode == SubgroupIdMode.EXPLICIT:
            subgroup_id = reader.varint()
        elif mode == SubgroupIdMode.ZERO:
            subgroup_id = 0
        return cls(
            track_alias,
            group_id,
            subgroup_id,
            reader.u8(),
            bool(stream_type & _SUBGROUP_EXTENSIONS),
            bool(stream_type & _SUBGROUP_END_OF_GROUP),
            mode,
        )


@dataclass(frozen=True, slots=True)
class FetchHeader:
    request_id: int

    def encode(self) -> bytes:
        return encode_varint(FETCH_HEADER_TYPE) + encode_varint(self.request_id)


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

    def encode_stream_tail(self, with_extensions: bool) -> bytes:
        """``[ext_len ext] payload_len [status] payload`` as on subgroup and fetch streams."""
        if self.extensions and not with_extensions:
            raise ValueError("extensions need a stream type that carries them")
        out = encode_bytes(self.extensions) if with_extensions else b""
        out += encode_varint(len(self.payload))
        if not self.payload:
            out += encode_varint(self.status)
        return out + self.payload

    @classmethod
    def decode_stream_tail(
        cls, reader: Reader, with_extensions: bool, max_payload: int
    ) -> ObjectBody:
        extensions = _read_extensions(reader) if with_extensions else b""
        length = reader.varint()
        if length > max_payload:
            raise ObjectTooLarge(f"object payload of {length} bytes exceeds {max_payload}")
        if length:
            return cls(bytes(reader.raw(length)), ObjectStatus.NORMAL, extensions)
        return _body(b"", _read_status(reader), extensions)


@dataclass(frozen=True, slots=True)
class SubgroupObject:
    object_id: int
    body: ObjectBody = ObjectBody()

    def encode(self, header: SubgroupHeader, previous_id: int | None) -> bytes:
        """The object as it follows ``previous_id`` (None for the first) on the stream."""
        delta = self.object_id if previous_id is None else self.object_id - previous_id - 1
        if delta < 0:
            raise ValueError(f"object id {self.object_id} does not follow {previous_id}")
        return encode_varint(delta) + self.body.encode_stream_tail(header.extensions)


@dataclass(frozen=True, slots=True)
class FetchObject:
    group_id: int
    subgroup_id: int
    object_id: int
    publisher_priority: int = 128
    body: ObjectBody = ObjectBody()

    def encode(self) -> bytes:
        return (
            encode_varint(self.group_id)
            + encode_varint(self.subgroup_id)
            + encode_varint(self.object_id)
            + bytes((self.publisher_priority,))
            + self.body.encode_stream_tail(with_extensions=True)
        )

    @classmethod
    def decode(cls, reader: Reader, max_payload: int) -> FetchObject:
        return cls(
            reader.varint(),
            reader.varint(),
            reader.varint(),
            reader.u8(),
            ObjectBody.decode_stream_tail(reader, True, max_payload),
        )


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

    def encode(self) -> bytes:
        body = self.body
        is_status = body.status != ObjectStatus.NORMAL
        datagram_type = (_DATAGRAM_EXTENSIONS if body.extensions else 0) | (
            _STATUS_DATAGRAM
            if is_status
            else (_DATAGRAM_END_OF_GROUP if self.end_of_group else 0)
            | (_DATAGRAM_NO_OBJECT_ID if self.object_id == 0 else 0)
        )
        out = encode_varint(datagram_type)
        out += encode_varint(self.track_alias) + encode_varint(self.group_id)
        if is_status or self.object_id != 0:
            out += encode_varint(self.object_id)
        out += bytes((self.publisher_priority,))
        if body.extensions:
            out += encode_bytes(body.extensions)
        return out + (encode_varint(body.status) if is_status else body.payload)


def decode_datagram(data: Buffer) -> ObjectDatagram:
    """Parse a whole OBJECT_DATAGRAM; any shortfall is malformed (a datagram is complete)."""
    reader = Reader(data)
    try:
        datagram_type = reader.varint()
        is_status = datagram_type & ~_DATAGRAM_EXTENSIONS == _STATUS_DATAGRAM
        if datagram_type > 0x07 and not is_status:
            raise DecodeError(f"unknown datagram type {datagram_type:#x}")
        track_alias = reader.varint()
        group_id = reader.varint()
        has_id = is_status or not datagram_type & _DATAGRAM_NO_OBJECT_ID
        object_id = reader.varint() if has_id else 0
        priority = reader.u8()
        extensions = b""
        if datagram_type & _DATAGRAM_EXTENSIONS:
            extensions = _read_extensions(reader)
            if not extensions:
                raise DecodeError("datagram flags extensions but carries none")
        if is_status:
            body = _body(b"", _read_status(reader), extensions)
            if not reader.at_end():
                raise DecodeError("bytes after a status datagram")
        else:
            body = _body(bytes(reader.raw(reader.remaining)), ObjectStatus.NORMAL, extensions)
    except NeedMoreData:
        raise DecodeError("truncated datagram") from None
    end_of_group = not is_status and bool(datagram_type & _DATAGRAM_END_OF_GROUP)
    return ObjectDatagram(track_alias, group_id, object_id, priority, body, end_of_group)


def _read_extensions(reader: Reader) -> bytes:
    length = reader.varint()
    if length > MAX_EXTENSIONS_LENGTH:
        raise DecodeError(f"extensions of {length} bytes exceed {MAX_EXTENSIONS_LENGTH}")
    raw = bytes(reader.raw(length))
    decode_kvps(raw)
    return raw


def _read_status(reader: Reader) -> ObjectStatus:
    value = reader.varint()
    try:
        return ObjectStatus(value)
    except ValueError:
        raise DecodeError(f"unknown object status {value:#x}") from None


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

    def __init__(self, max_payload: int = DEFAULT_MAX_OBJECT_PAYLOAD) -> None:
        self.max_payload = max_payload
        self.header: StreamHeader | None = None
        # Resolved subgroup id (FIRST_OBJECT mode learns it from the first object).
        self.subgroup_id: int | None = None
        self.finished = False
        self._previous_id: int | None = None
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
            reader = Reader(view, pos, end)
            try:
                item = self._parse_item(reader)
            except NeedMoreData as exc:
                self._need = (exc.needed if exc.needed is not None else end + 1) - pos
                return pos
            items.append(item)
            pos = reader.pos
        self._need = 0
        return pos

    def _parse_item(self, reader: Reader) -> StreamItem:
        header = self.header
        if isinstance(header, SubgroupHeader):
            delta = reader.varint()
            object_id = delta if self._previous_id is None else self._previous_id + delta + 1
            body = ObjectBody.decode_stream_tail(reader, header.extensions, self.max_payload)
            if self.subgroup_id is None:
                self.subgroup_id = object_id
            self._previous_id = object_id
            return SubgroupObject(object_id, body)
        if isinstance(header, FetchHeader):
            return FetchObject.decode(reader, self.max_payload)
        stream_type = reader.varint()
        if stream_type == FETCH_HEADER_TYPE:
            self.header = FetchHeader(reader.varint())
        elif is_subgroup_type(stream_type):
            self.header = SubgroupHeader.decode_after_type(stream_type, reader)
            self.subgroup_id = self.header.subgroup_id
        else:
            raise DecodeError(f"unknown data stream type {stream_type:#x}")
        return self.header
