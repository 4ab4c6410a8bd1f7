"""Draft 18's wire forms: vi64 integers, one SETUP, replies without request ids, typed
message parameters, the filter's end group as a delta, FETCH objects as steps.

The reference bytes are aiomoqt 0.13.3's encoder's (it speaks drafts 14 to 22), each checked
field by field against draft-ietf-moq-transport-18's text (docs/moqt-drafts.md, section 13).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol import messages as m
from sidecar.moqt.protocol.data import (
    DataStreamParser,
    FetchHeader,
    FetchObject,
    ObjectBody,
    SubgroupHeader,
)
from sidecar.moqt.protocol.drafts import DRAFT_16, DRAFT_18
from sidecar.moqt.protocol.errors import (
    DecodeError,
    PublishDoneStatus,
    RequestErrorCode,
    SessionErrorCode,
)
from sidecar.moqt.protocol.messages.replies import READ_AS
from sidecar.moqt.protocol.model import FullTrackName, GroupOrder, Location
from tests.support.memory import of
from tests.support.quic_pair import SessionPair

TRACK = FullTrackName((b"ns",), b"t")


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", "").replace("|", ""))


def _reads_back(raw: str, expected: m.ControlMessage, **read_as: object) -> None:
    data = _hex(raw)
    message, used = m.decode_control(data, DRAFT_18, READ_AS.get(read_as.get("on")))  # type: ignore[arg-type]
    assert (message, used) == (expected, len(data))


def test_setup_is_one_message_whose_options_run_to_its_end() -> None:
    raw = "af00 | 000d | 01 03 2f6b76 | 04 03 683a34 | 02 01 78"  # 0x2F00 is af00 in vi64
    setup = m.Setup(m.SetupParameters(path=b"/kv", authority=b"h:4", implementation=b"x"))
    assert setup.encode(DRAFT_18) == _hex(raw)
    _reads_back(raw, setup)


def test_a_subscribe_sends_bytes_for_flags_and_its_end_group_as_a_delta() -> None:
    range_ = m.SubscriptionFilter(m.FilterType.ABSOLUTE_RANGE, Location(5, 0), 7)
    subscribe = m.Subscribe(0, TRACK, 128, GroupOrder.DESCENDING, True, range_)
    # FORWARD u8; SUBSCRIBER_PRIORITY u8 0x80 (40 80 as draft 16's varint); end group +2.
    raw = "03 0014 | 00 | 01 02 6e73 | 01 74 | 04 | 10 01 | 10 80 | 01 04 04 05 00 02 | 01 02"
    assert subscribe.encode(DRAFT_18) == _hex(raw)
    _reads_back(raw, subscribe)


def test_a_subscribe_may_ask_to_wait_for_a_publisher() -> None:
    aiomoqts = "03 000a | 00 | 01 01 78 | 01 74 | 01 | 04 81f4"  # RENDEZVOUS_TIMEOUT 500
    waiting = m.Parameters(rendezvous_timeout=500)
    track = FullTrackName((b"x",), b"t")
    _reads_back(
        aiomoqts,
        m.Subscribe(0, track, group_order=GroupOrder.PUBLISHER_DEFAULT, parameters=waiting),
    )
    assert waiting.pairs(DRAFT_16) == ()  # draft 16 cannot say it


def test_replies_carry_no_request_id() -> None:
    _reads_back(
        "04 0007 | 01 | 02 | 08 00 | 01 06 03",  # alias 1; EXPIRES 0; LARGEST_OBJECT bare
        m.SubscribeOk(m.ON_STREAM, 1, 0, GroupOrder.ASCENDING, Location(6, 3)),
    )
    refusal = m.RequestError(9, RequestErrorCode.TIMEOUT, 0, "t")
    assert refusal.encode(DRAFT_18) == _hex("05 0004 | 02 | 00 | 01 74")
    _reads_back("05 0004 | 02 | 00 | 01 74", m.RequestError(m.ON_STREAM, 2, 0, "t"))
    done = m.PublishDone(4, PublishDoneStatus.TOO_FAR_BEHIND, 0, "")
    assert done.encode(DRAFT_18) == _hex("0b 0003 | 05 | 00 | 00")  # 0x6 in drafts 14 and 16
    _reads_back("0b 0003 | 05 | 00 | 00", m.PublishDone(m.ON_STREAM, 6, 0, ""))


def test_a_publish_is_answered_by_request_ok_which_its_stream_reads_as_publish_ok() -> None:
    accepted = m.PublishOk(3, True, 200, GroupOrder.ASCENDING)
    wire = accepted.encode(DRAFT_18)
    assert wire[:1] == b"\x07"  # REQUEST_OK
    message, _ = m.decode_control(wire, DRAFT_18, READ_AS[m.Publish])
    assert message == m.PublishOk(m.ON_STREAM, True, 200, GroupOrder.ASCENDING)
    elsewhere, _ = m.decode_control(wire, DRAFT_18)
    assert isinstance(elsewhere, m.RequestOk)


def test_an_update_names_no_subscription_its_stream_does() -> None:
    update = m.SubscribeUpdate(6, 2, Location(3, 0), 9, subscriber_priority=7)
    wire = update.encode(DRAFT_18)
    decoded, _ = m.decode_control(wire, DRAFT_18)
    assert decoded == m.SubscribeUpdate(6, m.ON_STREAM, Location(3, 0), 9, 7)


def test_subscribe_namespace_moved_to_0x50_and_says_no_options() -> None:
    raw = "50 0006 | 02 | 01 02 6e73 | 00"
    _reads_back(raw, m.SubscribeNamespace(2, (b"ns",), options=m.NamespaceOptions.NAMESPACE))
    assert m.SubscribeNamespace(2, (b"ns",)).encode(DRAFT_18) == _hex(raw)


def test_goaway_says_how_long_and_from_which_request() -> None:
    goaway = m.Goaway(b"", 300, 4)
    assert goaway.encode(DRAFT_18) == _hex("10 0004 | 00 | 812c | 04")  # 300 ms in vi64
    _reads_back("10 0004 | 00 | 812c | 04", goaway)
    _reads_back("10 0003 | 00 | 812c", m.Goaway(b"", 300))  # on a request stream


@pytest.mark.parametrize(
    "message",
    [
        m.Unsubscribe(0),
        m.FetchCancel(0),
        m.MaxRequestId(4),
        m.RequestsBlocked(4),
        m.PublishNamespaceDone((), 0),
        m.ClientSetup(()),
    ],
    ids=lambda message: type(message).__name__,
)
def test_what_draft_18_does_with_streams_has_no_message(message: m.ControlMessage) -> None:
    with pytest.raises(ValueError, match="draft-18 has no"):
        message.encode(DRAFT_18)
    with pytest.raises(DecodeError, match="unknown control message type"):
        m.decode_control(message.encode(DRAFT_16), DRAFT_18)


def test_a_parameter_draft_18_does_not_know_closes_the_session() -> None:
    # 0x0C: no length tells how to skip it.
    with pytest.raises(DecodeError, match="unknown message parameter 0xc"):
        m.decode_control(_hex("03 0009 | 00 | 01 01 78 | 01 74 | 01 | 0c 01"), DRAFT_18)


def test_limits_a_publisher_may_leave_unkept_are_read_not_refused() -> None:
    # aiomoqt's bytes: a SUBSCRIBE with SUBGROUP_DELIVERY_TIMEOUT 250 (0x06) beside
    # OBJECT_DELIVERY_TIMEOUT 1000, a FETCH with FILL_TIMEOUT 300 (0x0A).
    track = FullTrackName((b"ns",), b"t")
    _reads_back(
        "03 0017 | 00 | 01 02 6e73 | 01 74 | 06 | 02 83e8 | 04 80fa | 0a 01 | 10 80 | 01 01 02"
        "| 01 01",
        m.Subscribe(0, track, parameters=m.Parameters(delivery_timeout=1000)),
    )
    _reads_back(
        "16 0014 | 00 | 01 | 01 02 6e73 | 01 74 | 01 00 | 02 00 | 03 | 0a 812c | 16 80 | 02 01",
        m.Fetch(0, m.StandaloneFetch(track, Location(1, 0), 2), 128, GroupOrder.ASCENDING),
    )
    with pytest.raises(DecodeError, match="unknown message parameter 0x6"):  # not in draft 16
        m.decode_control(_hex("03 0009 | 00 | 01 01 78 | 01 74 | 01 | 06 01"), DRAFT_16)


def test_a_redirect_is_read_whole() -> None:
    raw = "05 000a | 34 | 00 | 00 | 04 6d3a2f2f | 00 | 00"  # uri "m://", same names
    _reads_back(raw, m.RequestError(m.ON_STREAM, RequestErrorCode.REDIRECT, 0, ""))


# ------------------------------------------------------------------------------------------
# Data plane.


def _fed(data: bytes, descending: bool = False) -> list[object]:
    parser = DataStreamParser(1 << 20, DRAFT_18, lambda request_id: descending)
    return parser.feed(data, end_stream=True)


def test_a_subgroup_stream_may_say_it_starts_its_subgroup() -> None:
    header, *_ = _fed(_hex("51 01 07 80"))  # FIRST_OBJECT | 0x10 | extensions
    assert header == SubgroupHeader(1, 7, 0, 128, extensions=True)
    with pytest.raises(DecodeError, match="unknown data stream type"):
        DataStreamParser(1 << 20, DRAFT_16).feed(_hex("51 01 07 80"), end_stream=True)


_ASCENDING = [
    FetchObject(5, 0, 0, 128, ObjectBody(b"a")),
    FetchObject(5, 0, 3, 128, ObjectBody(b"b")),
    FetchObject(7, 0, 0, 128, ObjectBody(b"c")),
    FetchObject(7, 0, 1, 128, ObjectBody(b"d")),
]
_DESCENDING = [
    FetchObject(9, 0, 2, 128, ObjectBody(b"a")),
    FetchObject(6, 0, 0, 128, ObjectBody(b"b")),
    FetchObject(6, 0, 1, 128, ObjectBody(b"c")),
]


@pytest.mark.parametrize(
    ("objects", "descending", "aiomoqts"),
    [
        # First absolute; +3 in the group (no +1); next group 1 on; the one after implied.
        (_ASCENDING, False, "1c 05 00 80 01 61 | 04 03 01 62 | 0c 01 00 01 63 | 00 01 64"),
        # Newest group first: 9, then 2 below it and one more, 6.
        (_DESCENDING, True, "1c 09 02 80 01 61 | 0c 02 00 01 62 | 00 01 63"),
    ],
)
def test_fetch_objects_step_from_the_one_before(
    objects: list[FetchObject], descending: bool, aiomoqts: str
) -> None:
    wire, previous = b"", None
    for obj in objects:
        wire += obj.encode(previous, DRAFT_18)
        previous = obj
    assert wire == _hex(aiomoqts)
    header = FetchHeader(3).encode(DRAFT_18)
    assert _fed(header + wire, descending) == [FetchHeader(3), *objects]


def test_a_step_below_group_zero_is_refused() -> None:
    wire = FetchHeader(3).encode(DRAFT_18) + _hex("1c 01 00 80 01 61 | 0c 05 00 01 62")
    with pytest.raises(DecodeError, match="leaves the group ids"):
        _fed(wire, descending=True)


big = st.integers(0, 1 << 40)


@settings(max_examples=150)
@given(
    st.lists(st.tuples(big, st.integers(0, 3), big, st.binary(max_size=4)), min_size=1, max_size=6),
    st.booleans(),
)
def test_any_fetch_stream_reads_back(
    rows: list[tuple[int, int, int, bytes]], descending: bool
) -> None:
    """Groups in the fetch's order, objects ascending within each: ids of any size (vi64)."""
    rows = sorted(rows, key=lambda row: (-row[0] if descending else row[0], row[2]))
    objects = [FetchObject(g, s, o, 128, ObjectBody(p)) for g, s, o, p in rows]
    objects = [obj for index, obj in enumerate(objects) if obj not in objects[:index]]
    wire, previous = FetchHeader(1).encode(DRAFT_18), None
    for obj in objects:
        wire += obj.encode(previous, DRAFT_18)
        previous = obj
    assert _fed(wire, descending) == [FetchHeader(1), *objects]


# ------------------------------------------------------------------------------------------
# Sessions: a scripted draft-18 client (raw QUIC) against a kvmoq session.


def _scripted() -> tuple[SessionPair, Any]:
    """A server session of draft 18 and a raw client QUIC connection that plays its peer;
    the server's SETUP has gone out (on its own control stream)."""
    pair = SessionPair(draft=DRAFT_18, client_session=False)
    pair.pump()
    return pair, pair.client_quic


def _setup(quic: Any) -> None:
    stream = quic.get_next_available_stream_id(True)
    quic.send_stream_data(stream, m.Setup(m.SetupParameters(path=b"/")).encode(DRAFT_18))


def _request(quic: Any, *messages: m.ControlMessage) -> int:
    stream = quic.get_next_available_stream_id(False)
    data = b"".join(message.encode(DRAFT_18) for message in messages)
    quic.send_stream_data(stream, data)
    return stream


def test_requests_sent_before_the_peers_setup_wait_for_it() -> None:
    pair, quic = _scripted()
    _request(quic, m.Subscribe(0, TRACK))  # draft 18 lets a client not wait for SETUP
    pair.pump()
    assert pair.take("server") == []
    _setup(quic)
    pair.pump()
    events = pair.take("server")
    assert [type(event) for event in events] == [ev.SetupCompleted, ev.SubscribeRequested]


@pytest.mark.parametrize(
    ("messages", "why"),
    [
        ([m.SubscribeOk(0, 1)], "opened by SubscribeOk"),
        ([m.Subscribe(0, TRACK), m.Subscribe(2, TRACK)], "Subscribe on another request"),
        ([m.Goaway()], "opened by Goaway"),
    ],
    ids=["a reply", "a second request", "a goaway"],
)
def test_a_request_stream_carries_one_request_and_what_belongs_to_it(
    messages: list[m.ControlMessage], why: str
) -> None:
    pair, quic = _scripted()
    _setup(quic)
    _request(quic, *messages)
    pair.pump()
    (closed,) = of(pair.take("server"), ev.SessionClosed)
    assert why in closed.reason and closed.error_code == SessionErrorCode.PROTOCOL_VIOLATION


def test_requests_go_on_no_control_stream() -> None:
    pair, quic = _scripted()
    stream = quic.get_next_available_stream_id(True)
    setup = m.Setup(m.SetupParameters(path=b"/")).encode(DRAFT_18)
    quic.send_stream_data(stream, setup + m.Subscribe(0, TRACK).encode(DRAFT_18))
    pair.pump()
    (closed,) = of(pair.take("server"), ev.SessionClosed)
    assert "Subscribe on the control stream" in closed.reason


def test_a_reset_request_stream_withdraws_its_request() -> None:
    pair, quic = _scripted()
    _setup(quic)
    stream = _request(quic, m.Subscribe(0, TRACK))
    pair.pump()
    pair.take("server")
    quic.reset_stream(stream, 0x1)  # draft 18's UNSUBSCRIBE
    pair.pump()
    assert of(pair.take("server"), ev.Unsubscribed) == [ev.Unsubscribed(0)]
    server = pair.server
    assert server is not None and not server.closed and not server.awaiting()


def test_the_documented_catalog_subscribe_is_what_draft_18_sends() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "wire-format.md").read_text()
    marker = "as\n`tests/moqt/test_draft_18.py` asserts it:\n\n```\n"
    block = docs.split(marker)[1].split("```")[0]
    catalog = FullTrackName((b"kvcache.moq.arpa/v1", b"m", b"a1b2"), b"catalog")
    assert m.Subscribe(0, catalog).encode(DRAFT_18) == bytes.fromhex(block.replace("\n", " "))
