"""Control messages: round trips, captured reference bytes, framing errors, fuzzing."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.moqt.protocol import messages as m
from sidecar.moqt.protocol.drafts import CODED, DRAFT_14, DRAFT_14_VERSION
from sidecar.moqt.protocol.errors import DecodeError, MoqtError, NeedMoreData
from sidecar.moqt.protocol.model import (
    FullTrackName,
    GroupOrder,
    Location,
    ObjectStatus,
    TrackObject,
)
from sidecar.moqt.protocol.wire import encode_varint
from tests.support.strategies import messages, strategies_of


def test_every_message_type_has_a_strategy() -> None:
    every = {kind for draft in CODED.values() for kind in strategies_of(draft)}
    assert every == set(m.ALL_MESSAGE_TYPES)
    assert len(m.ALL_MESSAGE_TYPES) == 36  # 14: 30; 16: four new; 18: SETUP, SUBSCRIBE_TRACKS


@settings(max_examples=400)
@given(messages)
def test_round_trip(message: m.ControlMessage) -> None:
    encoded = message.encode()
    decoded, consumed = m.decode_control(encoded + b"\x00trailing")
    assert decoded == message
    assert consumed == len(encoded)
    assert int.from_bytes(encoded[len(encode_varint(message.TYPE)) :][:2], "big") == (
        len(encoded) - len(encode_varint(message.TYPE)) - 2
    )


@given(messages)
def test_every_truncation_needs_more_data(message: m.ControlMessage) -> None:
    encoded = message.encode()
    for cut in range(len(encoded)):
        with pytest.raises(NeedMoreData):
            m.decode_control(encoded[:cut])


@given(messages, st.data())
def test_mutations_raise_only_typed_errors(message: m.ControlMessage, data: st.DataObject) -> None:
    encoded = bytearray(message.encode())
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(encoded) - 1))
        encoded[position] = data.draw(st.integers(0, 255))
    with contextlib.suppress(MoqtError):
        m.decode_control(bytes(encoded))


def _frame(message_type: int, payload: bytes) -> bytes:
    return encode_varint(message_type) + len(payload).to_bytes(2, "big") + payload


# Section 5 of the implementer notes: bytes captured from aiomoqt and moq-rs.
CLIENT_SETUP_AIOMOQT = "20 0012 01 c0000000ff00000e 02 01 03 2f6b76 02 4064"
SERVER_SETUP_MOQRS = (
    "21 0029 c0000000ff00000e 04 02 c0000000ffffffff 80040b5a 01 80040b5c 01 07 0b"
    + b"moq-lite-rs".hex()
)
SUBSCRIBE = "03 0011 00 01 06" + b"kvtest".hex() + "02" + b"t0".hex() + "80 01 01 02 00"
SUBSCRIBE_OK_MOQRS = "04 0008 00 00 00 02 01 06 03 00"
SUBSCRIBE_NAMESPACE_EMPTY_MOQRS = "11 0003 01 00 00"


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def test_reference_client_setup_from_aiomoqt() -> None:
    raw = _hex(CLIENT_SETUP_AIOMOQT)
    message, consumed = m.decode_control(raw)
    assert consumed == len(raw)
    assert message == m.ClientSetup(
        (DRAFT_14_VERSION,), m.SetupParameters(path=b"/kv", max_request_id=100)
    )
    assert message.encode() == raw


def test_reference_server_setup_from_moq_rs_keeps_unknown_parameters() -> None:
    raw = _hex(SERVER_SETUP_MOQRS)
    message, consumed = m.decode_control(raw)
    assert consumed == len(raw)
    assert isinstance(message, m.ServerSetup)
    assert message.version == 0xFF00000E
    assert message.parameters.max_request_id == 0xFFFFFFFF
    assert message.parameters.implementation == b"moq-lite-rs"
    assert message.parameters.unknown == ((0x40B5A, 1), (0x40B5C, 1))


def test_reference_subscribe() -> None:
    raw = _hex(SUBSCRIBE)
    message, _ = m.decode_control(raw)
    assert message == m.Subscribe(
        0,
        FullTrackName((b"kvtest",), b"t0"),
        subscriber_priority=128,
        group_order=GroupOrder.ASCENDING,
        forward=True,
        filter=m.SubscriptionFilter(m.FilterType.LARGEST_OBJECT),
    )
    assert message.encode() == raw


def test_reference_subscribe_ok_from_moq_rs_with_descending_order() -> None:
    raw = _hex(SUBSCRIBE_OK_MOQRS)
    message, _ = m.decode_control(raw)
    assert message == m.SubscribeOk(
        0, track_alias=0, expires=0, group_order=GroupOrder.DESCENDING, largest=Location(6, 3)
    )
    assert message.encode() == raw


def test_reference_empty_subscribe_namespace_from_moq_rs_is_tolerated() -> None:
    message, _ = m.decode_control(_hex(SUBSCRIBE_NAMESPACE_EMPTY_MOQRS))
    assert message == m.SubscribeNamespace(1, ())


def test_empty_namespace_is_refused_where_no_peer_needs_it() -> None:
    with pytest.raises(DecodeError):
        m.decode_control(_frame(0x06, b"\x02\x00\x00"))  # PUBLISH_NAMESPACE
    with pytest.raises(DecodeError):
        m.decode_control(_frame(0x09, b"\x00"))  # PUBLISH_NAMESPACE_DONE


def test_unknown_and_reserved_types_are_refused() -> None:
    for message_type in (0x01, 0x40, 0x41, 0x2F, 0x3FFF):
        with pytest.raises(DecodeError):
            m.decode_control(_frame(message_type, b""))


def test_length_longer_than_fields_is_refused() -> None:
    with pytest.raises(DecodeError):
        m.decode_control(_frame(0x0A, b"\x05\x00"))  # UNSUBSCRIBE with a stray byte


def test_length_shorter_than_fields_is_refused() -> None:
    raw = _hex(SUBSCRIBE)
    short = raw[:1] + (len(raw) - 4).to_bytes(2, "big") + raw[3:-1]
    with pytest.raises(DecodeError):
        m.decode_control(short)


def test_payload_over_u16_is_refused_on_encode() -> None:
    huge = m.ClientSetup(tuple(range(0x4000, 0x4000 + 20_000)))
    with pytest.raises(ValueError):
        huge.encode()


def test_field_range_checks() -> None:
    subscribe_ok = bytearray(_hex(SUBSCRIBE_OK_MOQRS))
    subscribe_ok[6] = 0  # group order 0 is not a publisher's choice
    with pytest.raises(DecodeError):
        m.decode_control(bytes(subscribe_ok))
    subscribe = bytearray(_hex(SUBSCRIBE))
    subscribe[-3] = 2  # forward must be 0 or 1
    with pytest.raises(DecodeError):
        m.decode_control(bytes(subscribe))
    subscribe[-3] = 1
    subscribe[-2] = 9  # unknown filter type
    with pytest.raises(DecodeError):
        m.decode_control(bytes(subscribe))


def test_full_track_name_is_capped_at_4096_bytes() -> None:
    track = FullTrackName((b"a" * 4000,), b"b" * 97)
    with pytest.raises(ValueError):
        m.Subscribe(0, track).encode()
    payload = b"\x00\x01" + encode_varint(4000) + b"a" * 4000 + encode_varint(97) + b"b" * 97
    with pytest.raises(DecodeError):
        m.decode_control(_frame(0x03, payload + b"\x80\x01\x01\x02\x00"))


def test_repeated_known_parameter_is_refused_but_tokens_may_repeat() -> None:
    twice = b"\x02" + b"\x02\x05" * 2
    with pytest.raises(DecodeError):
        m.decode_control(_frame(0x21, encode_varint(DRAFT_14_VERSION) + twice))
    tokens = b"\x02" + b"\x03\x01x" + b"\x03\x01y"
    message, _ = m.decode_control(_frame(0x21, encode_varint(DRAFT_14_VERSION) + tokens))
    assert message.parameters.authorization_tokens == (b"x", b"y")


def test_subscribe_update_end_group_is_sent_plus_one() -> None:
    open_ended = m.SubscribeUpdate(2, 0, Location(1, 0))
    bounded = m.SubscribeUpdate(2, 0, Location(1, 0), end_group=0)
    assert open_ended.encode_payload(DRAFT_14)[4] == 0
    assert bounded.encode_payload(DRAFT_14)[4] == 1


def test_fetch_end_object_is_sent_plus_one() -> None:
    track = FullTrackName((b"n",), b"t")
    whole = m.Fetch(0, m.StandaloneFetch(track, Location(0, 0), 3))
    assert whole.encode().endswith(b"\x00\x00\x03\x00\x00")
    upto_five = m.Fetch(0, m.StandaloneFetch(track, Location(0, 0), 3, 5))
    assert upto_five.encode().endswith(b"\x00\x00\x03\x06\x00")
    assert m.decode_control(upto_five.encode())[0] == upto_five


def test_fetch_types() -> None:
    joining = m.Fetch(4, m.JoiningFetch(2, 1, absolute=True))
    assert joining.fetch_type == m.FetchType.ABSOLUTE_JOINING
    raw = bytearray(joining.encode())
    raw[6] = 9  # fetch type byte
    with pytest.raises(DecodeError):
        m.decode_control(bytes(raw))


def test_filter_fields_must_match_type() -> None:
    with pytest.raises(ValueError):
        m.SubscriptionFilter(m.FilterType.ABSOLUTE_START)
    with pytest.raises(ValueError):
        m.SubscriptionFilter(m.FilterType.LARGEST_OBJECT, Location(0, 0))


def test_fetch_end_is_one_past_the_last_object_that_is_not_an_end_marker() -> None:
    content = [(4, TrackObject(0, b"a")), (5, TrackObject(0, b"b")), (5, TrackObject(1, b"c"))]
    assert m.fetch_end(content) == Location(5, 2)
    marker = TrackObject(2, b"", status=ObjectStatus.END_OF_GROUP)
    assert m.fetch_end([*content, (5, marker)]) == Location(5, 2)
    assert m.fetch_end([(5, marker)]) == Location(5, 3)


def test_a_goaway_uri_over_its_bound_is_refused() -> None:
    """A GOAWAY's new session URI is bounded (`MAX_GOAWAY_URI`): a peer cannot make the
    session buffer an arbitrary URI."""
    at_bound = m.Goaway(b"u" * m.MAX_GOAWAY_URI).encode()
    assert m.decode_control(at_bound)[0] == m.Goaway(b"u" * m.MAX_GOAWAY_URI)
    over = m.Goaway(b"u" * (m.MAX_GOAWAY_URI + 1)).encode()
    with pytest.raises(DecodeError, match="new session URI"):
        m.decode_control(over)
