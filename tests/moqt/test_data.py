"""Data plane: subgroup and fetch streams, datagrams, the incremental stream parser."""

from __future__ import annotations

import contextlib
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.moqt.protocol.data import (
    DataStreamParser,
    FetchHeader,
    FetchObject,
    ObjectBody,
    ObjectDatagram,
    SubgroupHeader,
    SubgroupIdMode,
    SubgroupObject,
    decode_datagram,
    is_subgroup_type,
)
from sidecar.moqt.protocol.errors import DecodeError, MoqtError, ObjectTooLarge, SessionErrorCode
from sidecar.moqt.protocol.model import ObjectStatus
from sidecar.moqt.protocol.wire import decode_kvps, encode_varint
from tests.support.strategies import datagrams, fetch_objects, subgroup_streams, varints


def _encode_subgroup(header: SubgroupHeader, objects: list[SubgroupObject]) -> bytes:
    out = header.encode()
    previous = None
    for obj in objects:
        out += obj.encode(header, previous)
        previous = obj.object_id
    return out


def _parse(data: bytes, cuts: list[int], max_payload: int = 1 << 20) -> list[object]:
    """Feed ``data`` split at ``cuts`` with FIN on the last piece."""
    parser = DataStreamParser(max_payload)
    bounds = [0, *sorted(set(cuts)), len(data)]
    items: list[object] = []
    for start, end in itertools.pairwise(bounds):
        items += parser.feed(data[start:end], end_stream=end == len(data))
    return items


def test_valid_subgroup_types() -> None:
    valid = [t for t in range(0x100) if is_subgroup_type(t)]
    assert valid == [*range(0x10, 0x16), *range(0x18, 0x1E)]


@settings(max_examples=300)
@given(subgroup_streams(), st.lists(st.integers(0, 3000), max_size=8))
def test_subgroup_stream_round_trip_at_any_split(
    stream: tuple[SubgroupHeader, list[SubgroupObject]], cuts: list[int]
) -> None:
    header, objects = stream
    data = _encode_subgroup(header, objects)
    items = _parse(data, [c for c in cuts if c < len(data)])
    assert items == [header, *objects]


def test_first_object_mode_takes_the_subgroup_id_from_the_first_object() -> None:
    header = SubgroupHeader(1, 2, None, subgroup_id_mode=SubgroupIdMode.FIRST_OBJECT)
    parser = DataStreamParser()
    data = _encode_subgroup(header, [SubgroupObject(7, ObjectBody(b"a"))])
    assert parser.feed(data[:4]) == [header]
    assert parser.subgroup_id is None
    parser.feed(data[4:], end_stream=True)
    assert parser.subgroup_id == 7


def test_reference_subgroup_stream_from_moq_rs() -> None:
    raw = bytes.fromhex("19000780") + bytes.fromhex("0003105b5804") + b"g7o0"
    raw += bytes.fromhex("0003105b5904") + b"g7o1"
    header, first, second = _parse(raw, [])
    assert header == SubgroupHeader(0, 7, 0, 128, extensions=True, end_of_group=True)
    assert (first.object_id, first.body.payload) == (0, b"g7o0")
    assert (second.object_id, second.body.payload) == (1, b"g7o1")
    assert decode_kvps(first.body.extensions) == ((0x10, 7000),)
    assert first.body.extensions == bytes.fromhex("105b58")  # kept as sent


def test_delta_encoding_of_object_ids() -> None:
    header = SubgroupHeader(0, 0)
    objects = [SubgroupObject(i, ObjectBody(b"x")) for i in (0, 1, 2, 5)]
    data = _encode_subgroup(header, objects)
    assert data[len(header.encode()) :] == b"\x00\x01x" + b"\x00\x01x" * 2 + b"\x02\x01x"
    with pytest.raises(ValueError):
        SubgroupObject(3, ObjectBody(b"x")).encode(header, 3)


def test_zero_length_normal_object_carries_an_explicit_status() -> None:
    header = SubgroupHeader(0, 0)
    assert SubgroupObject(0).encode(header, None) == b"\x00\x00\x00"
    assert _parse(header.encode() + b"\x00\x00\x00", []) == [header, SubgroupObject(0)]


@pytest.mark.parametrize("stream_type", [0x16, 0x17, 0x1E, 0x1F, 0x00, 0x04, 0x20, 0x3F])
def test_invalid_stream_types_are_refused(stream_type: int) -> None:
    with pytest.raises(DecodeError):
        DataStreamParser().feed(encode_varint(stream_type) + b"\x00\x00\x00\x80")


def test_fin_inside_an_object_is_a_violation() -> None:
    header = SubgroupHeader(0, 0)
    data = _encode_subgroup(header, [SubgroupObject(0, ObjectBody(b"abcdef"))])
    boundaries = (len(header.encode()), len(data))  # FIN after the header or an object is fine
    for cut in range(len(data) + 1):
        if cut in boundaries:
            DataStreamParser().feed(data[:cut], end_stream=True)
            continue
        with pytest.raises(DecodeError) as info:
            DataStreamParser().feed(data[:cut], end_stream=True)
        assert info.value.code == SessionErrorCode.PROTOCOL_VIOLATION


def test_data_after_fin_is_refused() -> None:
    parser = DataStreamParser()
    parser.feed(SubgroupHeader(0, 0).encode(), end_stream=True)
    with pytest.raises(DecodeError):
        parser.feed(b"\x00")


def test_unknown_status_and_payload_status_rules() -> None:
    header = SubgroupHeader(0, 0).encode()
    with pytest.raises(DecodeError):
        DataStreamParser().feed(header + b"\x00\x00\x02")  # status 2 is unused in -14
    ext_header = SubgroupHeader(0, 0, extensions=True).encode()
    with pytest.raises(DecodeError):  # does-not-exist with extensions
        DataStreamParser().feed(ext_header + b"\x00\x02\x10\x01\x00\x01")
    with pytest.raises(ValueError):
        ObjectBody(b"x", ObjectStatus.END_OF_GROUP)


def test_extensions_need_the_extension_stream_type() -> None:
    with pytest.raises(ValueError):
        SubgroupObject(0, ObjectBody(b"x", extensions=b"\x10\x01")).encode(
            SubgroupHeader(0, 0), None
        )


def test_object_over_the_cap_is_refused_before_buffering() -> None:
    header = SubgroupHeader(0, 0).encode()
    parser = DataStreamParser(max_payload=1000)
    with pytest.raises(ObjectTooLarge):
        parser.feed(header + b"\x00" + encode_varint(1001))
    assert parser.buffered == 0
    assert (
        len(DataStreamParser(1000).feed(header + b"\x00" + encode_varint(1000) + b"x" * 1000)) == 2
    )


def test_large_object_arriving_in_packets_is_buffered_once() -> None:
    header = SubgroupHeader(0, 0)
    payload = bytes(range(256)) * 1024
    data = _encode_subgroup(header, [SubgroupObject(0, ObjectBody(payload))])
    parser = DataStreamParser()
    items = []
    for start in range(0, len(data), 1200):
        items += parser.feed(data[start : start + 1200])
        assert parser.buffered <= len(payload) + 16
    assert items[1].body.payload == payload
    assert parser.buffered == 0


@given(varints, st.lists(fetch_objects, max_size=5), st.lists(st.integers(0, 2000), max_size=6))
def test_fetch_stream_round_trip(
    request_id: int, objects: list[FetchObject], cuts: list[int]
) -> None:
    data = FetchHeader(request_id).encode() + b"".join(o.encode() for o in objects)
    assert _parse(data, [c for c in cuts if c < len(data)]) == [FetchHeader(request_id), *objects]


@settings(max_examples=300)
@given(datagrams())
def test_datagram_round_trip(datagram: ObjectDatagram) -> None:
    assert decode_datagram(datagram.encode()) == datagram


def test_datagram_type_bits() -> None:
    assert ObjectDatagram(1, 2, 0, body=ObjectBody(b"p")).encode()[0] == 0x04
    assert ObjectDatagram(1, 2, 3, body=ObjectBody(b"p"), end_of_group=True).encode()[0] == 0x02
    with_ext = ObjectDatagram(1, 2, 3, body=ObjectBody(b"p", extensions=b"\x10\x01"))
    assert with_ext.encode()[0] == 0x01
    status = ObjectDatagram(1, 2, 3, body=ObjectBody(status=ObjectStatus.END_OF_TRACK))
    assert status.encode() == bytes([0x20, 1, 2, 3, 128, 4])


def test_datagram_errors() -> None:
    with pytest.raises(DecodeError):
        decode_datagram(bytes([0x08, 1, 2, 128]))  # unknown type
    with pytest.raises(DecodeError):
        decode_datagram(bytes([0x01, 1, 2, 3, 128, 0]) + b"p")  # extensions flagged, none given
    with pytest.raises(DecodeError):
        decode_datagram(bytes([0x20, 1, 2, 3]))  # truncated
    with pytest.raises(DecodeError):
        decode_datagram(bytes([0x20, 1, 2, 3, 128, 4, 0]))  # bytes after the status


@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=5), st.booleans())
def test_arbitrary_stream_bytes_raise_only_typed_errors(
    data: bytes, cuts: list[int], fin: bool
) -> None:
    parser = DataStreamParser(max_payload=4096)
    bounds = [0, *sorted(c for c in set(cuts) if c < len(data)), len(data)]
    try:
        for start, end in itertools.pairwise(bounds):
            parser.feed(data[start:end], end_stream=fin and end == len(data))
        assert parser.buffered <= 4096 + 64
    except MoqtError:
        pass


@given(st.binary(max_size=100))
def test_arbitrary_datagrams_raise_only_typed_errors(data: bytes) -> None:
    with contextlib.suppress(MoqtError):
        decode_datagram(data)


@given(subgroup_streams(), st.data())
def test_mutated_subgroup_streams_raise_only_typed_errors(
    stream: tuple[SubgroupHeader, list[SubgroupObject]], data: st.DataObject
) -> None:
    encoded = bytearray(_encode_subgroup(*stream))
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] = data.draw(st.integers(0, 255))
    with contextlib.suppress(MoqtError):
        DataStreamParser(max_payload=4096).feed(bytes(encoded), end_stream=True)
