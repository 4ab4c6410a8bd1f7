"""Control messages under draft 16 beside draft 14: reference bytes, stable wire forms, and
the replies that draft 16 folds into REQUEST_OK and REQUEST_ERROR.

The reference bytes are aiomoqt 0.13.3's encoder's (aiomoqt speaks drafts 14 to 22), each
checked field by field against draft-ietf-moq-transport-16's text.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol import messages as m
from sidecar.moqt.protocol.data import (
    DataStreamParser,
    FetchHeader,
    FetchObject,
    ObjectBody,
    ObjectDatagram,
    SubgroupHeader,
    SubgroupObject,
    decode_datagram,
)
from sidecar.moqt.protocol.drafts import (
    DRAFT_14,
    DRAFT_16,
    DRAFT_18,
    Draft,
    UnknownDraft,
    by_alpn,
    drafts,
)
from sidecar.moqt.protocol.errors import (
    DecodeError,
    FetchErrorCode,
    NeedMoreData,
    ProtocolError,
    PublishDoneStatus,
    RequestErrorCode,
    SubscribeErrorCode,
)
from sidecar.moqt.protocol.messages.replies import READ_AS
from sidecar.moqt.protocol.model import FullTrackName, GroupOrder, Location, ObjectStatus
from sidecar.moqt.protocol.wire import encode_kvps, encode_varint
from tests.support.aio import run
from tests.support.memory import of
from tests.support.quic_pair import STACKS, SessionPair
from tests.support.relay import DEFAULTS, publisher_server, running_relay
from tests.support.strategies import strategies_of, varints


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", "").replace("|", ""))


def _frame(message_type: int, payload: bytes) -> bytes:
    return encode_varint(message_type) + len(payload).to_bytes(2, "big") + payload


TRACK = FullTrackName((b"ns",), b"t")


def test_client_setup_names_no_version_and_codes_parameter_types_as_deltas() -> None:
    raw = _hex("20 000c | 03 | 01 03 2f6b76 | 01 4064 | 05 01 78")
    setup, _ = m.decode_control(raw, DRAFT_16)
    expected = m.ClientSetup(
        (), m.SetupParameters(path=b"/kv", max_request_id=100, implementation=b"x")
    )
    assert setup == expected
    assert expected.encode(DRAFT_16) == raw


def test_server_setup_names_no_version() -> None:
    raw = _hex("21 0007 | 02 | 02 4064 | 05 01 78")
    setup, _ = m.decode_control(raw, DRAFT_16)
    assert setup == m.ServerSetup(None, m.SetupParameters(max_request_id=100, implementation=b"x"))
    assert setup.encode(DRAFT_16) == raw


def test_subscribe_sends_its_delivery_fields_as_parameters() -> None:
    raw = _hex(
        "03 0015 | 00 | 01 02 6e73 | 01 74 | 04 | 10 01 | 10 4080 | 01 04 04 05 00 07 | 01 02"
    )
    subscribe, _ = m.decode_control(raw, DRAFT_16)
    rng = m.SubscriptionFilter(m.FilterType.ABSOLUTE_RANGE, Location(5, 0), 7)
    expected = m.Subscribe(0, TRACK, 128, GroupOrder.DESCENDING, True, rng)
    assert subscribe == expected
    assert expected.encode(DRAFT_16) == raw


def test_a_subscribe_without_parameters_takes_draft_14s_defaults() -> None:
    subscribe, _ = m.decode_control(_frame(0x03, _hex("00 01 02 6e73 01 74 00")), DRAFT_16)
    assert subscribe == m.Subscribe(0, TRACK, group_order=GroupOrder.PUBLISHER_DEFAULT)


def test_subscribe_ok_reports_the_largest_location_in_a_parameter() -> None:
    raw = _hex("04 0009 | 00 | 01 | 02 | 08 00 | 01 02 06 03")  # EXPIRES 0 sent explicitly
    ok, _ = m.decode_control(raw, DRAFT_16)
    assert ok == m.SubscribeOk(0, 1, 0, GroupOrder.ASCENDING, Location(6, 3))
    # The default expiry (0) goes unsaid.
    assert ok.encode(DRAFT_16) == _hex("04 0007 | 00 | 01 | 01 | 09 02 06 03")


def test_a_descending_track_says_so_in_its_track_extensions() -> None:
    ok = m.SubscribeOk(0, 1, 0, GroupOrder.DESCENDING, None)
    raw = ok.encode(DRAFT_16)
    assert raw == _hex("04 0005 | 00 | 01 | 00 | 22 02")
    assert m.decode_control(raw, DRAFT_16)[0] == ok


def test_a_refusal_is_a_request_error_with_draft_16s_code() -> None:
    refusal = m.SubscribeError(0, SubscribeErrorCode.TRACK_DOES_NOT_EXIST, "t")
    raw = refusal.encode(DRAFT_16)
    assert raw == _hex("05 0005 | 00 | 10 | 00 | 01 74")
    error, _ = m.decode_control(raw, DRAFT_16)
    assert error == m.RequestError(0, RequestErrorCode.DOES_NOT_EXIST, 0, "t")
    assert m.family_reply(error, m.Subscribe(0, TRACK)) == refusal


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (FetchErrorCode.NO_OBJECTS, RequestErrorCode.INVALID_RANGE),
        (FetchErrorCode.INVALID_JOINING_REQUEST_ID, RequestErrorCode.INVALID_JOINING_REQUEST_ID),
        (FetchErrorCode.MALFORMED_AUTH_TOKEN, RequestErrorCode.MALFORMED_AUTH_TOKEN),
        (FetchErrorCode.TIMEOUT, RequestErrorCode.TIMEOUT),
    ],
)
def test_fetch_error_codes_are_renumbered(ours: int, theirs: int) -> None:
    raw = m.FetchError(3, ours).encode(DRAFT_16)
    error, _ = m.decode_control(raw, DRAFT_16)
    assert isinstance(error, m.RequestError) and error.error_code == theirs


def test_a_code_draft_14_numbered_otherwise_reads_as_an_internal_error() -> None:
    # 0x12 is MALFORMED_TRACK in draft 16 and EXPIRED_AUTH_TOKEN in SUBSCRIBE_ERROR's table.
    error = m.RequestError(0, RequestErrorCode.MALFORMED_TRACK)
    assert m.family_reply(error, m.Subscribe(0, TRACK)).error_code == 0  # type: ignore[attr-defined]


def test_track_status_is_answered_by_request_ok() -> None:
    ok = m.TrackStatusOk(4, 0, 0, GroupOrder.ASCENDING, Location(9, 2))
    raw = ok.encode(DRAFT_16)
    assert raw == _hex("07 0006 | 04 | 01 | 09 02 09 02")
    reply, _ = m.decode_control(raw, DRAFT_16)
    assert reply == m.RequestOk(4, 0, Location(9, 2))
    assert m.family_reply(reply, m.TrackStatus(4, TRACK)) == ok


def test_namespace_replies_are_request_ok() -> None:
    for ok, request in (
        (m.PublishNamespaceOk(2), m.PublishNamespace(2, (b"ns",))),
        (m.SubscribeNamespaceOk(2), m.SubscribeNamespace(2, (b"ns",))),
    ):
        raw = ok.encode(DRAFT_16)
        assert raw == _hex("07 0002 | 02 | 00")
        reply, _ = m.decode_control(raw, DRAFT_16)
        assert m.family_reply(reply, request) == ok  # type: ignore[arg-type]


def test_namespace_withdrawal_names_the_request() -> None:
    raw = _hex("09 0001 | 04")
    done, _ = m.decode_control(raw, DRAFT_16)
    assert done == m.PublishNamespaceDone((), 4)
    assert done.encode(DRAFT_16) == raw
    with pytest.raises(ValueError, match="request id"):
        m.PublishNamespaceDone((b"ns",)).encode(DRAFT_16)


def test_subscribe_namespace_says_what_it_wants_to_hear_of() -> None:
    raw = _hex("11 0007 | 02 | 01 02 6e73 | 01 | 00")
    request, _ = m.decode_control(raw, DRAFT_16)
    assert request == m.SubscribeNamespace(2, (b"ns",), options=m.NamespaceOptions.NAMESPACE)
    assert request.encode(DRAFT_16) == raw


def test_namespace_messages_carry_the_suffix_under_the_prefix() -> None:
    assert m.decode_control(_hex("08 0001 00"), DRAFT_16)[0] == m.Namespace(())
    assert m.decode_control(_hex("0e 0003 01 01 61"), DRAFT_16)[0] == m.NamespaceDone((b"a",))


def test_publish_done_renumbers_malformed_track() -> None:
    done = m.PublishDone(0, PublishDoneStatus.MALFORMED_TRACK, 0)
    assert done.encode(DRAFT_16) == _hex("0b 0004 | 00 | 12 | 00 | 00")
    assert m.decode_control(done.encode(DRAFT_16), DRAFT_16)[0] == done


def test_subscribe_update_sends_its_range_as_a_filter() -> None:
    update = m.SubscribeUpdate(6, 0, Location(3, 0), 9, 128, False)
    raw = update.encode(DRAFT_16)
    assert raw == _hex("02 000e | 06 | 00 | 03 | 10 00 | 10 4080 | 01 04 04 03 00 09")
    assert m.decode_control(raw, DRAFT_16)[0] == update


def test_an_update_without_a_range_narrows_nothing() -> None:
    update, _ = m.decode_control(_frame(0x02, _hex("06 00 01 10 00")), DRAFT_16)
    assert update == m.SubscribeUpdate(6, 0, Location(0, 0), None, 128, False)


def test_unknown_message_parameters_close_draft_16_sessions_but_not_draft_14_ones() -> None:
    payload = _hex("00 01 02 6e73 01 74 01 3a 00")  # SUBSCRIBE with parameter 0x3a
    with pytest.raises(DecodeError, match="unknown message parameter"):
        m.decode_control(_frame(0x03, payload), DRAFT_16)
    draft_14 = _hex("00 01 02 6e73 01 74 80 01 01 02 01 3a 00")
    subscribe, _ = m.decode_control(_frame(0x03, draft_14), DRAFT_14)
    assert subscribe.parameters.unknown == ((0x3A, 0),)  # type: ignore[attr-defined]


def test_parameters_go_out_in_ascending_type_order() -> None:
    parameters = m.Parameters(delivery_timeout=5, authorization_tokens=(b"a",))
    raw = m.Fetch(0, m.JoiningFetch(2, 1), 7, GroupOrder.ASCENDING, parameters).encode(DRAFT_16)
    # types 0x02, 0x03, 0x20, 0x22 as deltas 2, 1, 0x1d, 2
    assert raw.endswith(_hex("04 02 05 01 01 61 1d 07 02 01"))


def test_what_a_draft_cannot_say_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="draft-16 has no UnsubscribeNamespace"):
        m.UnsubscribeNamespace((b"ns",)).encode(DRAFT_16)
    with pytest.raises(ValueError, match="draft-14 has no Namespace"):
        m.Namespace(()).encode(DRAFT_14)


def test_draft_14s_codes_mean_other_messages_in_draft_16() -> None:
    for code, draft_14, draft_16 in (
        (0x05, m.SubscribeError, m.RequestError),
        (0x07, m.PublishNamespaceOk, m.RequestOk),
        (0x08, m.PublishNamespaceError, m.Namespace),
        (0x0E, m.TrackStatusOk, m.NamespaceDone),
    ):
        assert draft_14.TYPE == draft_16.TYPE == code
    with pytest.raises(DecodeError, match="unknown control message type 0x14 in draft-16"):
        m.decode_control(_frame(0x14, _hex("01 01 61")), DRAFT_16)


@pytest.mark.parametrize(
    ("draft", "kind"),
    [(draft, kind) for draft in (DRAFT_16, DRAFT_18) for kind in strategies_of(draft)],
    ids=lambda value: value.__name__ if isinstance(value, type) else str(value),
)
@settings(max_examples=25)
@given(data=st.data())
def test_every_later_draft_form_reads_back_to_the_same_bytes(
    draft: Draft, kind: type[m.ControlMessage], data: st.DataObject
) -> None:
    """Every message drafts 16 and 18 can send. They carry less than draft 14 in places (a
    track status's group order, unknown parameters, draft 18's replies their request id),
    so the message itself may not come back; its wire form must. A reply whose type means
    something else off its request's stream is read as its request's stream reads it."""
    message = data.draw(strategies_of(draft)[kind])
    try:
        encoded = message.encode(draft)
    except ValueError as exc:  # draft 14 could send it
        assume("ends before it starts" not in str(exc))
        raise
    read_as = READ_AS.get(m.REQUEST_OF_OK.get(kind), {}) if draft.request_streams else None
    decoded, used = m.decode_control(encoded + b"\x00", draft, read_as)
    assert used == len(encoded)
    assert decoded.encode(draft) == encoded
    for cut in range(len(encoded)):
        with pytest.raises(NeedMoreData):
            m.decode_control(encoded[:cut], draft, read_as)


def test_drafts_are_named_by_number_and_alpn() -> None:
    assert drafts([14, 16, 14]) == (DRAFT_16, DRAFT_14)
    assert drafts([14, 18, 16]) == EVERY
    with pytest.raises(UnknownDraft, match="MoQT draft 15 is not spoken here"):
        drafts([15])
    assert by_alpn("moqt-16", (DRAFT_16, DRAFT_14)) == DRAFT_16
    assert by_alpn("moq-00", (DRAFT_16, DRAFT_14)) == DRAFT_14
    assert by_alpn("h3", (DRAFT_16, DRAFT_14)) is None


# Sessions of draft 16 over real QUIC (aioquic and qh3): the replies draft 16 folds into
# REQUEST_OK / REQUEST_ERROR reach the application as the family replies draft 14 has.


@pytest.fixture(
    params=[(stack, draft) for stack in STACKS for draft in (DRAFT_16, DRAFT_18)],
    ids=lambda param: f"{param[0]}-{param[1]}",
)
def pair(request: pytest.FixtureRequest) -> SessionPair:
    """Sessions of draft 16 and of draft 18, whose replies also take their request ids
    from the request's stream: the application sees the same either way."""
    stack, draft = request.param
    pair = SessionPair(stack=stack, draft=draft)
    pair.pump()
    return pair


def test_sessions_set_up_with_no_version_in_setup(pair: SessionPair) -> None:
    client, server = pair.sessions()
    for side in ("client", "server"):
        (setup,) = of(pair.take(side), ev.SetupCompleted)
        assert setup.draft == client.draft
    assert server.peer_parameters.path == b"/kv"  # type: ignore[union-attr]
    # Draft 18 has no MAX_REQUEST_ID: QUIC's stream limits bound the requests.
    credit = client.peer_parameters.max_request_id  # type: ignore[union-attr]
    assert (credit is None) == client.draft.request_streams


def test_refusals_and_track_status_arrive_as_their_familys_replies(pair: SessionPair) -> None:
    client, server = pair.sessions()
    refused = client.subscribe(TRACK)
    status = client.track_status(TRACK)
    pair.pump()
    server.reject(refused, SubscribeErrorCode.TRACK_DOES_NOT_EXIST, "no such track")
    server.track_status_ok(status, largest=Location(4, 7))
    pair.pump()
    events = pair.take("client")
    (rejected,) = of(events, ev.RequestRejected)
    assert rejected.message == m.SubscribeError(
        refused, SubscribeErrorCode.TRACK_DOES_NOT_EXIST, "no such track"
    )
    (accepted,) = of(events, ev.RequestAccepted)
    assert accepted.message == m.TrackStatusOk(status, 0, largest=Location(4, 7))


def test_a_namespace_is_withdrawn_and_cancelled_by_its_request_id(pair: SessionPair) -> None:
    client, server = pair.sessions()
    first = client.publish_namespace((b"a",))
    client.publish_namespace((b"b",))
    pair.pump()
    assert [e.message.namespace for e in of(pair.take("server"), ev.NamespacePublished)] == [
        (b"a",),
        (b"b",),
    ]
    server.publish_namespace_ok(first)
    pair.pump()
    assert of(pair.take("client"), ev.RequestAccepted)[0].message == m.PublishNamespaceOk(first)
    client.publish_namespace_done((b"a",))
    server.publish_namespace_cancel((b"b",), 0x4, "not wanted")
    pair.pump()
    assert of(pair.take("server"), ev.NamespacePublishDone) == [ev.NamespacePublishDone((b"a",))]
    (cancelled,) = of(pair.take("client"), ev.NamespacePublishCancelled)
    # Draft 18 cancels by resetting the request's stream, which carries no error code.
    code = 0 if client.draft.request_streams else 0x4
    assert (cancelled.message.namespace, cancelled.message.error_code) == ((b"b",), code)


def test_an_update_is_answered_and_takes_a_request_id(pair: SessionPair) -> None:
    client, server = pair.sessions()
    subscription = client.subscribe(TRACK)
    pair.pump()
    server.subscribe_ok(subscription)
    pair.pump()
    pair.take("client")
    update = client.subscribe_update(subscription, Location(2, 0), 5)
    pair.pump()
    (updated,) = of(pair.take("server"), ev.SubscribeUpdated)
    assert (updated.message.start, updated.message.end_group) == (Location(2, 0), 5)
    pair.pump()
    assert pair.take("client") == []  # the REQUEST_OK closes the update quietly
    assert not client.awaiting() and update == subscription + 2
    assert not client.closed and not server.closed


# The draft is the ALPN TLS settles on: real QUIC over loopback, each stack.

EVERY = (DRAFT_18, DRAFT_16, DRAFT_14)


@pytest.mark.parametrize("backend", STACKS)
@pytest.mark.parametrize(
    ("served", "offered", "agreed"),
    [
        (EVERY, (DRAFT_18,), DRAFT_18),
        (EVERY, (DRAFT_16,), DRAFT_16),
        (EVERY, (DRAFT_14,), DRAFT_14),
        (EVERY, EVERY, DRAFT_18),
        ((DRAFT_16, DRAFT_14), EVERY, DRAFT_16),
        ((DRAFT_14,), EVERY, DRAFT_14),
    ],
)
def test_the_session_speaks_the_draft_its_alpn_names(
    backend: str,
    served: tuple[Draft, ...],
    offered: tuple[Draft, ...],
    agreed: Draft,
    cert: CertificatePaths,
) -> None:
    publisher = api.Publisher()
    publisher.track((b"ns",), b"t")
    server = QuicSettings.loopback(backend=backend, ca_file=cert.cert, drafts=served)  # type: ignore[arg-type]
    client = dataclasses.replace(server, drafts=offered)

    async def main() -> None:
        async with (
            publisher_server(server, cert, publisher) as (url, sessions),
            api.connect(url, client) as session,
        ):
            assert session.connection.moqt.draft == agreed
            assert sessions[0].connection.moqt.draft == agreed
            assert (await session.track_status(TRACK)).largest is None
            with pytest.raises(api.RequestRefused) as refused:
                await session.track_status(FullTrackName((b"ns",), b"nope"))
            assert refused.value.code == SubscribeErrorCode.TRACK_DOES_NOT_EXIST

    run(main)


def test_no_common_draft_means_no_session(cert: CertificatePaths) -> None:
    server = QuicSettings.loopback(ca_file=cert.cert, drafts=(DRAFT_14,))
    client = dataclasses.replace(server, drafts=(DRAFT_16,))

    async def main() -> None:
        async with publisher_server(server, cert, api.Publisher()) as (url, sessions):
            with pytest.raises(transport.MoqtConnectError):
                async with api.connect(url, client):
                    pass
            assert sessions == []

    run(main)


@pytest.mark.parametrize("backend", [DEFAULTS, "aioquic"])
def test_one_relay_serves_sessions_of_every_draft(backend: str, cert: CertificatePaths) -> None:
    """`kvmoq relay` as users run it (aiopquic) and on aioquic: it speaks every draft."""
    with running_relay(cert, backend=backend) as relay:
        settings = relay.settings

        async def main() -> None:
            for offered in ((DRAFT_18,), (DRAFT_16,), (DRAFT_14,), EVERY):
                client = dataclasses.replace(settings, drafts=offered)
                async with api.connect(relay.url, client) as session:
                    assert session.connection.moqt.draft == offered[0]
                    with pytest.raises(api.RequestRefused) as refused:
                        await session.track_status(TRACK)
                    assert refused.value.code == SubscribeErrorCode.TRACK_DOES_NOT_EXIST

        run(main)


# The data plane under draft 16.

sorted_extensions = st.lists(
    st.tuples(st.integers(0, 200).map(lambda k: k * 2), varints), max_size=3
).map(lambda pairs: encode_kvps(sorted(pairs, key=lambda pair: pair[0])))
"""Extension bytes as kvmoq keeps them (draft 14's absolute types), in type order: draft 16
sends types as deltas, so what comes back is sorted."""
fetched = st.builds(
    FetchObject,
    st.integers(0, 3),
    st.integers(0, 3),
    st.integers(0, 6),
    st.sampled_from([64, 128]),
    st.builds(ObjectBody, st.binary(max_size=20), st.just(ObjectStatus.NORMAL), sorted_extensions),
)


def _fed(data: bytes, draft: Draft, cut: int = 1) -> list[object]:
    parser = DataStreamParser(1 << 20, draft)
    items: list[object] = []
    for start in range(0, len(data), cut):
        items += parser.feed(data[start : start + cut], end_stream=start + cut >= len(data))
    return items


def test_fetch_objects_leave_out_what_the_one_before_implies() -> None:
    first = FetchObject(5, 0, 0, 128, ObjectBody(b"a"))
    second = FetchObject(5, 0, 1, 128, ObjectBody(b"b"))
    third = FetchObject(6, 2, 0, 64, ObjectBody(b"c"))
    assert first.encode(None, DRAFT_16) == _hex("1c 05 00 80 01 61")  # group, object, priority
    assert second.encode(first, DRAFT_16) == _hex("00 01 62")  # all implied
    assert third.encode(second, DRAFT_16) == _hex("1f 06 02 00 40 01 63")  # subgroup field
    stream = FetchHeader(7).encode() + _hex("1c 05 00 80 01 61 00 01 62 1f 06 02 00 40 01 63")
    assert _fed(stream, DRAFT_16) == [FetchHeader(7), first, second, third]


def test_an_end_of_range_marker_moves_the_ids_on_and_delivers_nothing() -> None:
    stream = FetchHeader(7).encode() + _hex("1c 05 00 80 01 61 | 408c 05 09 | 00 01 62")
    assert _fed(stream, DRAFT_16)[1:] == [
        FetchObject(5, 0, 0, 128, ObjectBody(b"a")),
        FetchObject(5, 0, 10, 128, ObjectBody(b"b")),
    ]


@pytest.mark.parametrize(
    ("objects", "why"),
    [
        ("00 01 61", "leaves out what no object before it says"),
        ("4080 01 61", "unknown FETCH serialization flags"),
    ],
)
def test_malformed_fetch_objects_are_refused(objects: str, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        _fed(FetchHeader(7).encode() + _hex(objects), DRAFT_16, cut=64)


def test_fetch_objects_carry_no_status_in_draft_16() -> None:
    with pytest.raises(ValueError, match="carry no status"):
        FetchObject(1, 0, 0, body=ObjectBody(status=ObjectStatus.END_OF_GROUP)).encode(
            None, DRAFT_16
        )
    empty = FetchObject(1, 0, 0, 128, ObjectBody())
    assert _fed(FetchHeader(1).encode() + empty.encode(None, DRAFT_16), DRAFT_16)[1] == empty


@settings(max_examples=200)
@given(st.lists(fetched, min_size=1, max_size=6), st.integers(1, 40))
def test_any_fetch_stream_reads_back_in_draft_16(objects: list[FetchObject], cut: int) -> None:
    data = FetchHeader(3).encode()
    previous = None
    for obj in objects:
        data += obj.encode(previous, DRAFT_16)
        previous = obj
    assert _fed(data, DRAFT_16, cut) == [FetchHeader(3), *objects]


def test_a_subgroup_may_leave_out_its_priority_in_draft_16() -> None:
    stream = _hex("31 01 07 | 00 02 0a 00 01 61")  # extensions, priority left out
    header, obj = _fed(stream, DRAFT_16, cut=64)
    assert header == SubgroupHeader(1, 7, 0, 128, extensions=True)
    assert obj == SubgroupObject(0, ObjectBody(b"a", extensions=encode_kvps([(0x0A, 0)])))
    with pytest.raises(DecodeError, match="unknown data stream type 0x31"):
        _fed(stream, DRAFT_14, cut=64)


def test_extension_types_go_out_as_deltas_and_come_back_as_kvmoq_keeps_them() -> None:
    kept = encode_kvps([(0x3C, 1), (0x3E, 2)])
    header = SubgroupHeader(1, 7, extensions=True)
    obj = SubgroupObject(0, ObjectBody(b"a", extensions=kept))
    wire = header.encode() + obj.encode(header, None, DRAFT_16)
    assert wire.endswith(_hex("04 3c 01 02 02 01 61"))  # 0x3C, then 0x3E as +2
    assert _fed(wire, DRAFT_16, cut=64)[1] == obj
    assert header.encode() + obj.encode(header, None) == wire[:-7] + _hex("04 3c 01 3e 02 01 61")


def test_draft_16_has_no_does_not_exist_status() -> None:
    gone = ObjectBody(status=ObjectStatus.DOES_NOT_EXIST)
    with pytest.raises(ValueError, match="no object status DOES_NOT_EXIST"):
        SubgroupObject(0, gone).encode(SubgroupHeader(1, 7), None, DRAFT_16)
    with pytest.raises(DecodeError, match="unknown object status 0x1 in draft-16"):
        _fed(SubgroupHeader(1, 7).encode() + _hex("00 00 01"), DRAFT_16, cut=64)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("08 01 02 03 61", ObjectDatagram(1, 2, 3, 128, ObjectBody(b"a"))),  # priority left out
        ("2c 01 02 04", ObjectDatagram(1, 2, 0, 128, ObjectBody(status=ObjectStatus.END_OF_TRACK))),
    ],
)
def test_draft_16_datagram_forms(raw: str, expected: ObjectDatagram) -> None:
    assert decode_datagram(_hex(raw), DRAFT_16) == expected
    with pytest.raises(DecodeError, match="unknown datagram type"):
        decode_datagram(_hex(raw), DRAFT_14)


def test_a_status_datagram_cannot_end_a_group() -> None:
    with pytest.raises(DecodeError, match="unknown datagram type 0x22"):
        decode_datagram(_hex("22 01 02 03 80 03"), DRAFT_16)


def test_objects_flow_over_a_draft_16_session(pair: SessionPair) -> None:
    """Subgroup stream, FETCH stream and datagram, as draft 16 writes them; what draft 16
    cannot say (a DOES_NOT_EXIST object, a FETCH object's status) is left out."""
    client, server = pair.sessions()
    request_id = client.subscribe(TRACK)
    pair.pump()
    server.subscribe_ok(request_id, largest=Location(0, 0))
    pair.pump()
    stream = server.objects.open_subgroup(request_id, 1, extensions=True)
    server.objects.send_object(stream, 0, b"first", extensions=encode_kvps([(0x3C, 4)]))
    server.objects.send_object(stream, 1, status=ObjectStatus.DOES_NOT_EXIST)
    server.objects.send_object(stream, 2, b"third", end_stream=True)
    server.objects.send_datagram(request_id, 2, 0, b"datagram")
    fetch = client.fetch(m.StandaloneFetch(TRACK, Location(1, 0), 1, 2))
    pair.pump()
    server.fetch_ok(fetch, Location(1, 3))
    fetch_stream = server.objects.open_fetch_stream(fetch)
    server.objects.send_fetch_object(fetch_stream, 1, 0, 0, b"first")
    server.objects.send_fetch_object(fetch_stream, 1, 0, 2, b"third")
    server.objects.send_fetch_object(
        fetch_stream, 1, 0, 3, status=ObjectStatus.END_OF_GROUP, end_stream=True
    )
    pair.pump()
    received = of(pair.take("client"), ev.ObjectReceived)
    got = sorted((o.source.value, o.group_id, o.object_id, o.body.payload) for o in received)
    assert got == sorted(
        [
            (ev.ObjectSource.SUBGROUP.value, 1, 0, b"first"),
            (ev.ObjectSource.SUBGROUP.value, 1, 2, b"third"),
            (ev.ObjectSource.DATAGRAM.value, 2, 0, b"datagram"),
            (ev.ObjectSource.FETCH.value, 1, 0, b"first"),
            (ev.ObjectSource.FETCH.value, 1, 2, b"third"),
        ]
    )
    (first,) = (o for o in received if o.source == ev.ObjectSource.SUBGROUP and o.object_id == 0)
    assert first.body.extensions == encode_kvps([(0x3C, 4)])
    assert not client.closed and not server.closed


def _namespace_followed(pair: SessionPair, prefix: tuple[bytes, ...]) -> int:
    client, server = pair.sessions()
    request_id = client.subscribe_namespace(prefix)
    pair.pump()
    asked = of(pair.take("server"), ev.NamespaceSubscribeRequested)
    # Draft 18 asks for the namespaces and, apart (SUBSCRIBE_TRACKS), for the tracks.
    assert len(asked) == (2 if client.draft.request_streams else 1)
    for request in asked:
        assert request.message.namespace == prefix
        server.subscribe_namespace_ok(request.message.request_id)
    pair.pump()
    (accepted,) = of(pair.take("client"), ev.RequestAccepted)
    assert accepted.message == m.SubscribeNamespaceOk(request_id)
    return request_id


def test_a_namespace_subscription_lives_on_a_stream_of_its_own(pair: SessionPair) -> None:
    client, server = pair.sessions()
    _namespace_followed(pair, (b"kv",))
    server.tell_namespace((b"kv", b"model"))
    server.tell_namespace((b"other",))  # nobody follows it: PUBLISH_NAMESPACE, a request
    pair.pump()
    events = pair.take("client")
    assert of(events, ev.NamespaceAnnounced) == [ev.NamespaceAnnounced((b"kv", b"model"))]
    assert [e.message.namespace for e in of(events, ev.NamespacePublished)] == [(b"other",)]
    server.tell_namespace_done((b"kv", b"model"))
    pair.pump()
    assert of(pair.take("client"), ev.NamespacePublishDone) == [
        ev.NamespacePublishDone((b"kv", b"model"))
    ]
    client.unsubscribe_namespace((b"kv",))
    pair.pump()
    assert set(of(pair.take("server"), ev.NamespaceUnsubscribed)) == {
        ev.NamespaceUnsubscribed((b"kv",))
    }
    assert not client.closed and not server.closed


def test_a_refused_namespace_subscription_closes_its_stream(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id = client.subscribe_namespace((b"kv",))
    pair.pump()
    server.reject(request_id, 0x1, "not yours")
    pair.pump()
    (rejected,) = of(pair.take("client"), ev.RequestRejected)
    assert rejected.message == m.SubscribeNamespaceError(request_id, 0x1, "not yours")
    assert not client.awaiting()  # draft 18's SUBSCRIBE_TRACKS went with it
    taken = 4 if client.draft.request_streams else 2  # draft 18: and SUBSCRIBE_TRACKS's
    assert client.subscribe_namespace((b"kv",)) == request_id + taken  # the prefix is free


def test_requests_on_their_own_streams_may_arrive_out_of_order() -> None:
    from sidecar.moqt.protocol.request_ids import RequestIds

    ids = RequestIds(is_client=False, window=8, in_order=False)
    for request_id in (2, 0, 4):
        ids.accept_peer(request_id)
    with pytest.raises(ProtocolError, match="was used"):
        ids.accept_peer(2)
    with pytest.raises(ProtocolError, match="not the peer's"):
        ids.accept_peer(5)
    in_order = RequestIds(is_client=False, window=8)
    with pytest.raises(ProtocolError, match="expected 0"):
        in_order.accept_peer(2)


def test_draft_16_refuses_subscribe_namespace_on_the_control_stream() -> None:
    pair = SessionPair(draft=DRAFT_16, server_session=False)
    pair.pump()
    client = pair.client
    assert client is not None
    control = 0  # the client's first bidirectional stream
    setup = m.ServerSetup(None, m.SetupParameters(max_request_id=10)).encode(DRAFT_16)
    pair.server_quic.send_stream_data(control, setup, False)
    pair.server_quic.send_stream_data(
        control, m.SubscribeNamespace(1, (b"kv",)).encode(DRAFT_16), False
    )
    pair.pump()
    (closed,) = of(pair.take("client"), ev.SessionClosed)
    assert "control stream" in closed.reason


def test_the_documented_catalog_subscribe_is_what_draft_16_sends() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "wire-format.md").read_text()
    block = docs.split("as `tests/moqt/test_drafts.py`\nasserts it:\n\n```\n")[1].split("```")[0]
    catalog = FullTrackName((b"kvcache.moq.arpa/v1", b"m", b"a1b2"), b"catalog")
    assert m.Subscribe(0, catalog).encode(DRAFT_16) == bytes.fromhex(block.replace("\n", " "))


def test_publish_and_publish_ok_carry_their_fields_as_parameters() -> None:
    offer = m.Publish(5, TRACK, 2, GroupOrder.DESCENDING, Location(3, 4), forward=False)
    raw = offer.encode(DRAFT_16)
    # request 5, the track, alias 2; LARGEST_OBJECT (3,4) and FORWARD 0; extension: descending
    assert raw == _hex("1d 0011 | 05 | 01 02 6e73 | 01 74 | 02 | 02 09 02 03 04 07 00 | 22 02")
    assert m.decode_control(raw, DRAFT_16)[0] == offer
    accept = m.PublishOk(3)
    raw = accept.encode(DRAFT_16)
    assert raw == _hex("1e 000c | 03 | 04 10 01 10 4080 01 01 02 01 01")
    assert m.decode_control(raw, DRAFT_16)[0] == accept


def test_an_update_of_anything_but_a_subscription_is_refused_in_words() -> None:
    """Draft 16 lets a peer update a FETCH or a namespace request; kvmoq refuses, in that
    draft's words (REQUEST_ERROR NOT_SUPPORTED), and the session goes on."""
    pair = SessionPair(draft=DRAFT_16, client_session=False)
    control = 0  # the client's first bidirectional stream
    setup = m.ClientSetup((), m.SetupParameters(path=b"/kv", max_request_id=10))
    fetch = m.Fetch(0, m.StandaloneFetch(TRACK, Location(0, 0), 3))
    update = m.SubscribeUpdate(2, 0, Location(1, 0))
    for message in (setup, fetch, update):
        pair.client_quic.send_stream_data(control, message.encode(DRAFT_16), False)
    pair.pump()
    server = pair.server
    assert server is not None and not server.closed
    assert [e.message for e in of(pair.take("server"), ev.FetchRequested)] == [fetch]
    answer = b"".join(e.data for e in pair.client_raw if type(e).__name__ == "StreamDataReceived")
    replies = m.decode_buffered(bytearray(answer), DRAFT_16)
    assert replies[1:] == [
        m.RequestError(2, RequestErrorCode.NOT_SUPPORTED, 0, "kvmoq updates subscriptions only")
    ]
