"""Primitive MoQT encodings: integers, tuples, key-value pairs, reason phrases.

An `Encoder` (one per integer form: QUIC varints, draft 18's vi64) returns ``bytes``.
Decoding goes through its ``Reader``, a cursor over a buffer that never copies more than the
item it returns, and that tells *truncated* input (``NeedMoreData``: wait for more bytes)
from *malformed* input (``DecodeError``: close).
Every length read from the wire is checked against a cap before anything is sliced, so a
peer can never make us allocate more than the caps below.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import DecodeError, NeedMoreData, SessionErrorCode
from .model import Location

Buffer = bytes | bytearray | memoryview

MAX_VARINT = (1 << 62) - 1
MAX_VI64 = (1 << 64) - 1
MAX_TUPLE_FIELDS = 32
MAX_FULL_TRACK_NAME = 4096
MAX_KVP_BYTES = 65535
MAX_REASON_PHRASE = 1024

# A key-value pair: even keys carry a varint, odd keys carry bytes (draft-14 §Parameters).
KeyValuePair = tuple[int, int | bytes]


class Encoder:
    """The composite encodings (strings, tuples, locations, key-value pairs), each built on
    one integer form: the QUIC varint (RFC 9000 §16) here, draft 18's vi64 in `Vi64Encoder`.
    A draft names its encoder (`Draft.wire`); `reader` gives the matching `Reader`."""

    MAX_INT = MAX_VARINT

    def varint(self, value: int) -> bytes:
        """A QUIC variable-length integer, always in its shortest form."""
        if value < 0x40:
            if value < 0:
                raise ValueError(f"varint must not be negative: {value}")
            return bytes((value,))
        if value < 0x4000:
            return (value | 0x4000).to_bytes(2, "big")
        if value < 0x40000000:
            return (value | 0x80000000).to_bytes(4, "big")
        if value <= MAX_VARINT:
            return (value | 0xC000000000000000).to_bytes(8, "big")
        raise ValueError(f"varint too large: {value}")

    def reader(self, data: Buffer, pos: int = 0, end: int | None = None) -> Reader:
        return Reader(data, pos, end)

    def bytes_vi(self, value: bytes) -> bytes:
        """``bytes(vi)``: a length, then the bytes."""
        return self.varint(len(value)) + value

    def tuple(self, fields: tuple[bytes, ...]) -> bytes:
        """A Track Namespace tuple: field count, then each field as ``bytes(vi)``."""
        if len(fields) > MAX_TUPLE_FIELDS:
            raise ValueError(f"namespace has {len(fields)} fields, at most {MAX_TUPLE_FIELDS}")
        if sum(map(len, fields)) > MAX_FULL_TRACK_NAME:
            raise ValueError(f"namespace longer than {MAX_FULL_TRACK_NAME} bytes")
        return self.varint(len(fields)) + b"".join(self.bytes_vi(f) for f in fields)

    def location(self, location: Location) -> bytes:
        return self.varint(location.group) + self.varint(location.object)

    def reason(self, reason: str) -> bytes:
        raw = reason.encode()
        if len(raw) > MAX_REASON_PHRASE:
            raise ValueError(f"reason phrase is {len(raw)} bytes, at most {MAX_REASON_PHRASE}")
        return self.bytes_vi(raw)

    def kvps(self, pairs: Iterable[KeyValuePair], delta: bool = False) -> bytes:
        """Key-value pairs without a count (the form used inside extension headers). `delta`
        (draft 16 on): each type is sent as the difference from the one before, so the
        pairs go out sorted by type (pairs of one type keep their order)."""
        out = bytearray()
        previous = 0
        for key, value in sorted(pairs, key=lambda pair: pair[0]) if delta else pairs:
            out += self.varint(key - previous if delta else key)
            previous = key
            if key % 2 == 0:
                if not isinstance(value, int):
                    raise ValueError(f"even key {key:#x} needs an int value")
                out += self.varint(value)
            else:
                if not isinstance(value, bytes):
                    raise ValueError(f"odd key {key:#x} needs a bytes value")
                if len(value) > MAX_KVP_BYTES:
                    raise ValueError(f"value of key {key:#x} is longer than {MAX_KVP_BYTES}")
                out += self.bytes_vi(value)
        return bytes(out)

    def parameters(self, pairs: tuple[KeyValuePair, ...], delta: bool = False) -> bytes:
        """Parameters as in control messages: a count, then the pairs."""
        return self.varint(len(pairs)) + self.kvps(pairs, delta)


class Vi64Encoder(Encoder):
    """Draft 18's integers ("vi64"): the count of leading 1 bits in the first byte says how
    many bytes follow it (0 to 8), so any 64-bit value fits, in 1 to 9 bytes."""

    MAX_INT = MAX_VI64

    def varint(self, value: int) -> bytes:
        if value < 0x80:
            if value < 0:
                raise ValueError(f"vi64 must not be negative: {value}")
            return bytes((value,))
        for length in range(2, 9):
            if value < 1 << (7 * length):
                prefix = (0xFF << (9 - length)) & 0xFF
                return ((prefix << (8 * (length - 1))) | value).to_bytes(length, "big")
        if value <= MAX_VI64:
            return b"\xff" + value.to_bytes(8, "big")
        raise ValueError(f"vi64 too large: {value}")

    def reader(self, data: Buffer, pos: int = 0, end: int | None = None) -> Reader:
        return Vi64Reader(data, pos, end)


QUIC_VARINTS = Encoder()
"""Drafts 14 and 16: QUIC varints. Its methods also serve code that has no draft (the
catalog, tests) under the names below."""
VI64 = Vi64Encoder()

encode_varint = QUIC_VARINTS.varint
encode_bytes = QUIC_VARINTS.bytes_vi
encode_tuple = QUIC_VARINTS.tuple
encode_location = QUIC_VARINTS.location
encode_reason = QUIC_VARINTS.reason
encode_kvps = QUIC_VARINTS.kvps
encode_parameters = QUIC_VARINTS.parameters


def decode_kvps(
    data: Buffer, delta: bool = False, encoder: Encoder = QUIC_VARINTS
) -> tuple[KeyValuePair, ...]:
    """Parse a whole buffer of count-less key-value pairs (an extension block)."""
    try:
        return encoder.reader(data).kvps(delta)
    except NeedMoreData as exc:
        raise DecodeError(
            "truncated key-value pair", SessionErrorCode.KEY_VALUE_FORMATTING_ERROR
        ) from exc


class Reader:
    """A cursor over ``data[pos:end]``; raises ``NeedMoreData`` when it would read past ``end``.
    Its integers are QUIC varints; `Vi64Reader` reads draft 18's."""

    MAX_INT = MAX_VARINT

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: Buffer, pos: int = 0, end: int | None = None) -> None:
        self.data = memoryview(data) if not isinstance(data, memoryview) else data
        self.pos = pos
        self.end = len(data) if end is None else end

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def at_end(self) -> bool:
        return self.pos >= self.end

    def varint(self) -> int:
        pos = self.pos
        if pos >= self.end:
            raise NeedMoreData("varint")
        first = self.data[pos]
        prefix = first >> 6
        if prefix == 0:
            self.pos = pos + 1
            return first
        length = 1 << prefix
        if pos + length > self.end:
            raise NeedMoreData("varint")
        value = int.from_bytes(self.data[pos : pos + length], "big")
        self.pos = pos + length
        return value & ((1 << (8 * length - 2)) - 1)

    def u8(self) -> int:
        if self.pos >= self.end:
            raise NeedMoreData("u8")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u16(self) -> int:
        return int.from_bytes(self.raw(2), "big")

    def flag(self, what: str) -> bool:
        """A u8 that must be 0 or 1."""
        value = self.u8()
        if value > 1:
            raise DecodeError(f"{what} must be 0 or 1, got {value}")
        return value == 1

    def raw(self, length: int) -> memoryview:
        """The next ``length`` bytes, as a view (no copy)."""
        end = self.pos + length
        if end > self.end:
            raise NeedMoreData(f"{length} bytes", needed=end)
        view = self.data[self.pos : end]
        self.pos = end
        return view

    def bytes_vi(self, max_length: int, what: str = "field") -> bytes:
        """``bytes(vi)`` whose length must not exceed ``max_length``."""
        length = self.varint()
        if length > max_length:
            raise DecodeError(f"{what} is {length} bytes, at most {max_length}")
        return bytes(self.raw(length))

    def count(self, max_count: int, what: str) -> int:
        value = self.varint()
        if value > max_count:
            raise DecodeError(f"{what} count {value} exceeds {max_count}")
        return value

    def tuple(self, allow_empty: bool = False) -> tuple[bytes, ...]:
        """A Track Namespace tuple of 1..32 fields (0 fields only where ``allow_empty``),
        at most 4096 bytes in all (the limit of a full track name, which includes it)."""
        count = self.count(MAX_TUPLE_FIELDS, "namespace field")
        if count == 0 and not allow_empty:
            raise DecodeError("empty namespace tuple")
        fields = tuple(self.bytes_vi(MAX_FULL_TRACK_NAME, "namespace field") for _ in range(count))
        if sum(map(len, fields)) > MAX_FULL_TRACK_NAME:
            raise DecodeError(f"namespace longer than {MAX_FULL_TRACK_NAME} bytes")
        return fields

    def location(self) -> Location:
        return Location(self.varint(), self.varint())

    def reason(self) -> str:
        raw = self.bytes_vi(MAX_REASON_PHRASE, "reason phrase")
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise DecodeError("reason phrase is not UTF-8") from exc

    def kvp(self, previous: int | None = None) -> KeyValuePair:
        """One pair; its type is absolute, or (draft 16 on) `previous` plus the number read."""
        key = self.varint()
        if previous is not None:
            key += previous
            if key > self.MAX_INT:
                raise DecodeError(
                    f"key-value type {key:#x} past the largest",
                    SessionErrorCode.KEY_VALUE_FORMATTING_ERROR,
                )
        if key % 2 == 0:
            return key, self.varint()
        length = self.varint()
        if length > MAX_KVP_BYTES:
            raise DecodeError(
                f"value of key {key:#x} is {length} bytes, at most {MAX_KVP_BYTES}",
                SessionErrorCode.KEY_VALUE_FORMATTING_ERROR,
            )
        return key, bytes(self.raw(length))

    def parameters(self, delta: bool = False) -> tuple[KeyValuePair, ...]:
        """``count (vi)`` then that many key-value pairs (types as deltas where `delta`).

        A pair takes at least two bytes, so a count larger than half the remaining input is
        malformed; checking that first keeps a huge count from driving a long loop.
        """
        count = self.varint()
        if count * 2 > self.remaining:
            raise NeedMoreData("parameters")
        return self.kvps(delta, count)

    def kvps(self, delta: bool, count: int | None = None) -> tuple[KeyValuePair, ...]:
        """`count` key-value pairs (None: up to the end), types as deltas where `delta`."""
        pairs: list[KeyValuePair] = []
        previous = 0
        while (len(pairs) < count) if count is not None else not self.at_end():
            pair = self.kvp(previous if delta else None)
            pairs.append(pair)
            previous = pair[0]
        return tuple(pairs)


class Vi64Reader(Reader):
    """A `Reader` of draft 18's vi64 integers (see `Vi64Encoder`)."""

    __slots__ = ()
    MAX_INT = MAX_VI64

    def varint(self) -> int:
        pos = self.pos
        if pos >= self.end:
            raise NeedMoreData("vi64")
        first = self.data[pos]
        if first < 0x80:
            self.pos = pos + 1
            return first
        ones = 8 - (~first & 0xFF).bit_length()
        length = ones + 1
        if pos + length > self.end:
            raise NeedMoreData("vi64")
        value = int.from_bytes(self.data[pos : pos + length], "big")
        self.pos = pos + length
        if ones == 8:
            return value & MAX_VI64
        return value & ((1 << (7 * length)) - 1)
