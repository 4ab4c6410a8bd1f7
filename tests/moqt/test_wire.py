"""Primitive encodings: varints, tuples, key-value pairs, reason phrases, the Reader's errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.moqt.protocol.errors import DecodeError, NeedMoreData, SessionErrorCode
from sidecar.moqt.protocol.model import Location
from sidecar.moqt.protocol.wire import (
    MAX_VARINT,
    MAX_VI64,
    VI64,
    Reader,
    decode_kvps,
    encode_bytes,
    encode_kvps,
    encode_location,
    encode_parameters,
    encode_reason,
    encode_tuple,
    encode_varint,
)
from tests.support.strategies import kvp_lists, locations, namespaces, varints


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (63, "3f"),
        (64, "4040"),
        (16383, "7fff"),
        (16384, "80004000"),
        (2**30 - 1, "bfffffff"),
        (2**30, "c000000040000000"),
        (0xFF00000E, "c0000000ff00000e"),  # the draft-14 version: always 8 bytes
        (MAX_VARINT, "ffffffffffffffff"),
    ],
)
def test_varint_boundaries(value: int, encoded: str) -> None:
    assert encode_varint(value).hex() == encoded
    assert Reader(bytes.fromhex(encoded)).varint() == value


def test_varint_rfc9000_examples_including_non_minimal_forms() -> None:
    # RFC 9000 §A.1: decoders accept any length, not only the shortest.
    for encoded, value in [
        ("c2197c5eff14e88c", 151288809941952652),
        ("9d7f3e7d", 494878333),
        ("7bbd", 15293),
        ("25", 37),
        ("4025", 37),
    ]:
        assert Reader(bytes.fromhex(encoded)).varint() == value


@pytest.mark.parametrize("value", [-1, MAX_VARINT + 1])
def test_varint_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(ValueError):
        encode_varint(value)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (37, "25"),
        (64, "40"),  # one byte in vi64, two as a QUIC varint
        (127, "7f"),
        (128, "8080"),
        (0x2F00, "af00"),  # draft 18's SETUP type
        (15293, "bbbd"),
        (16383, "bfff"),
        (16384, "c04000"),
        (226442877, "ed7f3e7d"),
        (2**56 - 1, "feffffffffffffff"),
        (2**56, "ff0100000000000000"),
        (MAX_VI64, "ffffffffffffffffff"),
    ],
)
def test_vi64_boundaries_and_draft_18s_examples(value: int, encoded: str) -> None:
    assert VI64.varint(value).hex() == encoded
    reader = VI64.reader(bytes.fromhex(encoded))
    assert reader.varint() == value and reader.at_end()


def test_vi64_reads_non_minimal_forms() -> None:
    assert VI64.reader(bytes.fromhex("8025")).varint() == 37  # draft 18 allows them


@given(st.integers(0, MAX_VI64))
def test_vi64_round_trips_and_a_cut_one_needs_more(value: int) -> None:
    encoded = VI64.varint(value)
    reader = VI64.reader(encoded + b"\x00")
    assert reader.varint() == value and reader.pos == len(encoded)
    for cut in range(len(encoded)):
        with pytest.raises(NeedMoreData):
            VI64.reader(encoded[:cut]).varint()


@pytest.mark.parametrize("value", [-1, MAX_VI64 + 1])
def test_vi64_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(ValueError):
        VI64.varint(value)


def test_composite_encodings_take_the_encoders_integers() -> None:
    assert VI64.bytes_vi(b"x" * 100) == b"\x64" + b"x" * 100
    assert encode_bytes(b"x" * 100)[:2] == b"\x40\x64"
    pairs = ((0x40, 200), (0x41, b"ab"))
    assert VI64.kvps(pairs).hex() == "40" + "80c8" + "41" + "02" + "6162"
    assert VI64.reader(VI64.kvps(pairs, delta=True)).kvps(delta=True) == pairs


@given(varints)
def test_varint_round_trip_and_truncation(value: int) -> None:
    encoded = encode_varint(value)
    reader = Reader(encoded)
    assert reader.varint() == value and reader.at_end()
    for cut in range(len(encoded)):
        with pytest.raises(NeedMoreData):
            Reader(encoded[:cut]).varint()


@given(namespaces)
def test_tuple_round_trip(fields: tuple[bytes, ...]) -> None:
    assert Reader(encode_tuple(fields)).tuple() == fields


def test_tuple_field_counts() -> None:
    with pytest.raises(DecodeError):
        Reader(b"\x00").tuple()
    assert Reader(b"\x00").tuple(allow_empty=True) == ()
    with pytest.raises(DecodeError):
        Reader(encode_varint(33) + b"\x00" * 33).tuple()
    with pytest.raises(ValueError):
        encode_tuple((b"",) * 33)


def test_tuple_total_length_is_capped() -> None:
    fields = (b"a" * 2048, b"b" * 2049)
    with pytest.raises(ValueError):
        encode_tuple(fields)
    raw = b"\x02" + encode_bytes(fields[0]) + encode_bytes(fields[1])
    with pytest.raises(DecodeError):
        Reader(raw).tuple()


def test_bytes_cap_is_checked_before_reading() -> None:
    # A declared length over the cap is malformed even though the bytes are not there.
    with pytest.raises(DecodeError):
        Reader(encode_varint(2000)).bytes_vi(1024)
    with pytest.raises(NeedMoreData):
        Reader(encode_varint(20) + b"abc").bytes_vi(1024)
    assert Reader(encode_bytes(b"abc")).bytes_vi(3) == b"abc"


@given(locations)
def test_location_round_trip(location: Location) -> None:
    assert Reader(encode_location(location)).location() == location


def test_locations_order_lexicographically() -> None:
    assert Location(1, 9) < Location(2, 0) < Location(2, 1)


@given(st.text(max_size=200))
def test_reason_round_trip(reason: str) -> None:
    if len(reason.encode()) <= 1024:
        assert Reader(encode_reason(reason)).reason() == reason


def test_reason_limits_and_utf8() -> None:
    with pytest.raises(ValueError):
        encode_reason("x" * 1025)
    with pytest.raises(DecodeError):
        Reader(encode_bytes(b"x" * 1025)).reason()
    with pytest.raises(DecodeError):
        Reader(encode_bytes(b"\xff\xfe")).reason()


@given(kvp_lists)
def test_kvps_round_trip(pairs: tuple[tuple[int, int | bytes], ...]) -> None:
    assert decode_kvps(encode_kvps(pairs)) == pairs
    assert Reader(encode_parameters(pairs)).parameters() == pairs


def test_kvp_value_types_follow_key_parity() -> None:
    with pytest.raises(ValueError):
        encode_kvps([(2, b"x")])
    with pytest.raises(ValueError):
        encode_kvps([(3, 1)])


def test_kvp_over_long_value_is_a_formatting_error() -> None:
    with pytest.raises(DecodeError) as info:
        Reader(b"\x01" + encode_varint(65536)).kvp()
    assert info.value.code == SessionErrorCode.KEY_VALUE_FORMATTING_ERROR


def test_truncated_extension_block_is_a_formatting_error() -> None:
    with pytest.raises(DecodeError) as info:
        decode_kvps(b"\x01\x05ab")
    assert info.value.code == SessionErrorCode.KEY_VALUE_FORMATTING_ERROR


def test_huge_parameter_count_fails_without_looping() -> None:
    with pytest.raises(NeedMoreData):
        Reader(encode_varint(MAX_VARINT) + b"\x02\x01").parameters()
