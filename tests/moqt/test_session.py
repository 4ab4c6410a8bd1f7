"""The sans-I/O session over two real aioquic connections joined in memory."""

from __future__ import annotations

from typing import TypeVar

import pytest

from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol import messages as m
from sidecar.moqt.protocol.data import (
    FetchHeader,
    FetchObject,
    ObjectBody,
    SubgroupHeader,
    SubgroupObject,
)
from sidecar.moqt.protocol.drafts import DRAFT_14, DRAFT_14_VERSION
from sidecar.moqt.protocol.errors import (
    FetchErrorCode,
    PublishDoneStatus,
    RequestLimitReached,
    SessionErrorCode,
    SubscribeErrorCode,
    UsageError,
)
from sidecar.moqt.protocol.model import FullTrackName, GroupOrder, Location, ObjectStatus
from sidecar.moqt.protocol.session import MoqtSession, SessionLimits
from sidecar.moqt.protocol.wire import encode_varint
from tests.support.memory import of
from tests.support.quic_pair import STACKS, SessionPair

T = TypeVar("T")

TRACK = FullTrackName((b"kvcache.moq.arpa/v1", b"smollm2", b"abc123"), b"fp16")
OTHER = FullTrackName((b"kvcache.moq.arpa/v1", b"smollm2", b"abc123"), b"int8")


def _one(events: list[ev.MoqtEvent], kind: type[T]) -> T:
    found = of(events, kind)
    assert len(found) == 1, events
    return found[0]


@pytest.fixture(params=STACKS)
def stack(request: pytest.FixtureRequest) -> str:
    """Every session test runs on aioquic and on qh3 (the session only duck-types QUIC)."""
    return request.param


@pytest.fixture
def pair(stack: str) -> SessionPair:
    pair = SessionPair(stack=stack)
    pair.pump()
    return pair


def _subscribed(pair: SessionPair, track: FullTrackName = TRACK) -> tuple[int, int]:
    """Subscribe the client to ``track`` on the server; return (request id, alias)."""
    client, server = pair.sessions()
    request_id = client.subscribe(track)
    pair.pump()
    assert _one(pair.take("server"), ev.SubscribeRequested).message.track == track
    alias = server.subscribe_ok(request_id, largest=Location(0, 0))
    pair.pump()
    assert _one(pair.take("client"), ev.RequestAccepted).request_id == request_id
    return request_id, alias


def test_setup_exchanges_versions_and_parameters(pair: SessionPair) -> None:
    client, server = pair.sessions()
    server_setup = _one(pair.take("server"), ev.SetupCompleted)
    client_setup = _one(pair.take("client"), ev.SetupCompleted)
    assert server_setup.draft == client_setup.draft == DRAFT_14
    assert server_setup.parameters.path == b"/kv"
    assert server_setup.parameters.authority == b"localhost:4443"
    assert server_setup.parameters.max_request_id is not None
    assert client_setup.parameters.max_request_id is not None
    assert client.setup_complete and server.setup_complete


def test_subscribe_and_receive_objects(pair: SessionPair) -> None:
    _client, server = pair.sessions()
    pair.take("client")
    request_id, alias = _subscribed(pair)
    stream = server.objects.open_subgroup(
        request_id, group_id=3, extensions=True, end_of_group=True
    )
    payloads = [bytes([i]) * 300_000 for i in range(3)]
    for object_id, payload in enumerate(payloads):
        server.objects.send_object(stream, object_id, payload, extensions=b"\x10\x05")
    server.objects.send_object(stream, 3, status=ObjectStatus.END_OF_GROUP, end_stream=True)
    pair.pump()
    events = pair.take("client")
    objects = of(events, ev.ObjectReceived)
    assert [o.payload for o in objects] == [*payloads, b""]
    assert [o.object_id for o in objects] == [0, 1, 2, 3]
    assert objects[-1].status == ObjectStatus.END_OF_GROUP
    assert all(o.request_id == request_id and o.track_alias == alias for o in objects)
    assert all(
        (o.group_id, o.subgroup_id, o.source) == (3, 0, ev.ObjectSource.SUBGROUP) for o in objects
    )
    assert objects[0].extensions == b"\x10\x05"
    ended = _one(events, ev.DataStreamEnded)
    assert (ended.request_id, ended.group_id, ended.end_of_group) == (request_id, 3, True)


def test_subscribe_error_and_one_subscription_per_track(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id = client.subscribe(TRACK)
    with pytest.raises(UsageError):
        client.subscribe(TRACK)
    pair.pump()
    server.reject(request_id, SubscribeErrorCode.TRACK_DOES_NOT_EXIST, "no such prompt")
    with pytest.raises(UsageError):
        server.reject(request_id, SubscribeErrorCode.INTERNAL_ERROR)
    pair.pump()
    rejected = _one(pair.take("client"), ev.RequestRejected)
    assert isinstance(rejected.message, m.SubscribeError)
    assert rejected.message.error_code == SubscribeErrorCode.TRACK_DOES_NOT_EXIST
    assert rejected.message.reason == "no such prompt"
    client.subscribe(TRACK)  # the track is free again


def test_unsubscribe_and_publish_done(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id, _ = _subscribed(pair)
    for group in range(2):
        server.objects.open_subgroup(request_id, group)
    server.publish_done(request_id, PublishDoneStatus.TRACK_ENDED, "done")
    pair.pump()
    ended = _one(pair.take("client"), ev.SubscriptionEnded)
    assert ended.message.stream_count == 2
    assert ended.message.status_code == PublishDoneStatus.TRACK_ENDED
    other_id, _ = _subscribed(pair, OTHER)
    client.unsubscribe(other_id)
    pair.pump()
    assert _one(pair.take("server"), ev.Unsubscribed).request_id == other_id
    with pytest.raises(UsageError):
        server.objects.open_subgroup(other_id, 0)


def _raw_server(
    stack: str, client_limits: SessionLimits | None = None
) -> tuple[SessionPair, MoqtSession]:
    pair = SessionPair(client_limits, stack=stack, server_session=False)
    pair.pump()
    assert pair.client is not None
    pair.server_quic.send_stream_data(
        0, m.ServerSetup(DRAFT_14_VERSION, m.SetupParameters(max_request_id=100)).encode()
    )
    pair.pump()
    pair.take("client")
    return pair, pair.client


def test_data_stream_before_subscribe_ok_is_held_until_the_alias_is_known(stack: str) -> None:
    """moq-rs sends objects before SUBSCRIBE_OK; they must not be lost or misrouted."""
    pair, client = _raw_server(stack)
    request_id = client.subscribe(TRACK)
    pair.pump()
    header = SubgroupHeader(7, 1, extensions=True)
    data = header.encode() + SubgroupObject(0, ObjectBody(b"early", extensions=b"\x10\x01")).encode(
        header, None
    )
    stream_id = pair.server_quic.get_next_available_stream_id(is_unidirectional=True)
    pair.server_quic.send_stream_data(stream_id, data, end_stream=True)
    pair.pump()
    assert not of(pair.take("client"), ev.ObjectReceived)
    assert client.next_timer() is not None
    pair.server_quic.send_stream_data(
        0, m.SubscribeOk(request_id, track_alias=7, group_order=GroupOrder.DESCENDING).encode()
    )
    pair.pump()
    events = pair.take("client")
    accepted = _one(events, ev.RequestAccepted)
    received = _one(events, ev.ObjectReceived)
    assert events.index(accepted) < events.index(received)
    assert (received.request_id, received.payload, received.extensions) == (
        request_id,
        b"early",
        b"\x10\x01",
    )
    assert _one(events, ev.DataStreamEnded).request_id == request_id
    assert client.next_timer() is None


def _raw_subgroup(pair: SessionPair, alias: int, payload: bytes, fin: bool = True) -> int:
    header = SubgroupHeader(alias, 0)
    stream_id = pair.server_quic.get_next_available_stream_id(is_unidirectional=True)
    pair.server_quic.send_stream_data(
        stream_id,
        header.encode() + SubgroupObject(0, ObjectBody(payload)).encode(header, None),
        end_stream=fin,
    )
    return stream_id


def test_unclaimed_early_streams_expire(stack: str) -> None:
    pair, client = _raw_server(stack, SessionLimits(pending_stream_timeout=2.0))
    request_id = client.subscribe(TRACK)
    _raw_subgroup(pair, alias=5, payload=b"orphan", fin=False)
    pair.pump()
    deadline = client.next_timer()
    assert deadline is not None
    client.tick(deadline + 0.1)
    pair.pump()
    assert any(type(e).__name__ == "StopSendingReceived" for e in pair.server_raw)
    assert client.next_timer() is None
    pair.server_quic.send_stream_data(0, m.SubscribeOk(request_id, track_alias=5).encode())
    pair.pump()
    assert not of(pair.take("client"), ev.ObjectReceived)


def test_early_streams_are_bounded_in_count_and_bytes(stack: str) -> None:
    pair, client = _raw_server(
        stack, SessionLimits(max_pending_streams=2, max_pending_bytes=10_000)
    )
    request_id = client.subscribe(TRACK)
    for i in range(4):
        _raw_subgroup(pair, alias=3, payload=bytes([i]) * 100)
    _raw_subgroup(pair, alias=3, payload=b"x" * 20_000)
    pair.pump()
    pair.server_quic.send_stream_data(0, m.SubscribeOk(request_id, track_alias=3).encode())
    pair.pump()
    objects = of(pair.take("client"), ev.ObjectReceived)
    assert [o.payload for o in objects] == [bytes([0]) * 100, bytes([1]) * 100]


def test_object_over_the_payload_cap_costs_the_stream_not_the_session(stack: str) -> None:
    pair = SessionPair(stack=stack, client_limits=SessionLimits(max_object_payload=1000))
    pair.pump()
    _client, server = pair.sessions()
    request_id, _ = _subscribed(pair)
    big = server.objects.open_subgroup(request_id, 0)
    server.objects.send_object(big, 0, b"x" * 1001, end_stream=True)
    small = server.objects.open_subgroup(request_id, 1)
    server.objects.send_object(small, 0, b"y" * 1000, end_stream=True)
    pair.pump()
    events = pair.take("client")
    assert [o.payload for o in of(events, ev.ObjectReceived)] == [b"y" * 1000]
    assert not of(events, ev.SessionClosed)


def test_fetch(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id = client.fetch(m.StandaloneFetch(TRACK, Location(0, 0), 1))
    pair.pump()
    requested = _one(pair.take("server"), ev.FetchRequested)
    assert requested.track == TRACK
    server.fetch_ok(request_id, Location(1, 1), end_of_track=True)
    stream = server.objects.open_fetch_stream(request_id)
    for group in range(2):
        for obj in range(2):
            server.objects.send_fetch_object(
                stream, group, 0, obj, f"{group}.{obj}".encode(), extensions=b"\x10\x01"
            )
    server.objects.end_stream(stream)
    pair.pump()
    events = pair.take("client")
    assert isinstance(_one(events, ev.RequestAccepted).message, m.FetchOk)
    objects = of(events, ev.ObjectReceived)
    assert [(o.group_id, o.object_id, o.payload) for o in objects] == [
        (0, 0, b"0.0"),
        (0, 1, b"0.1"),
        (1, 0, b"1.0"),
        (1, 1, b"1.1"),
    ]
    assert all(o.source == ev.ObjectSource.FETCH and o.request_id == request_id for o in objects)
    assert _one(events, ev.DataStreamEnded).source == ev.ObjectSource.FETCH


def test_joining_fetch_resolves_the_track_or_is_refused(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id, _ = _subscribed(pair)
    fetch_id = client.fetch(m.JoiningFetch(request_id, 2))
    pair.take("server")
    pair.pump()
    assert _one(pair.take("server"), ev.FetchRequested).track == TRACK
    pending = client.subscribe(OTHER)  # not yet accepted: nothing to join on the server
    join_pending = client.fetch(m.JoiningFetch(pending, 0))
    pair.pump()
    assert not of(pair.take("server"), ev.FetchRequested)
    rejected = _one(pair.take("client"), ev.RequestRejected)
    assert rejected.request_id == join_pending
    assert rejected.message.error_code == FetchErrorCode.INVALID_JOINING_REQUEST_ID
    server.reject(fetch_id, FetchErrorCode.NO_OBJECTS)


def test_fetch_cancel_resets_the_stream(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id = client.fetch(m.StandaloneFetch(TRACK, Location(0, 0), 5))
    pair.pump()
    server.fetch_ok(request_id, Location(5, 0))
    stream = server.objects.open_fetch_stream(request_id)
    server.objects.send_fetch_object(stream, 0, 0, 0, b"a")
    pair.pump()
    client.fetch_cancel(request_id)
    pair.pump()
    # FETCH_CANCEL and the STOP_SENDING of the stream race; whichever lands first ends the fetch.
    ended = of(pair.take("server"), ev.FetchCancelled | ev.DataStreamStopped)
    assert [e.request_id for e in ended] == [request_id]
    with pytest.raises(UsageError):
        server.objects.send_fetch_object(stream, 0, 0, 1, b"b")


def test_publish(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id = client.publish(TRACK, largest=Location(4, 2))
    stream = client.objects.open_subgroup(request_id, 5)
    client.objects.send_object(stream, 0, b"pushed", end_stream=True)
    pair.pump()
    events = pair.take("server")
    requested = _one(events, ev.PublishRequested)
    assert (requested.message.track, requested.message.largest) == (TRACK, Location(4, 2))
    received = _one(events, ev.ObjectReceived)
    assert (received.request_id, received.group_id, received.payload) == (request_id, 5, b"pushed")
    server.publish_ok(request_id)
    pair.pump()
    assert isinstance(_one(pair.take("client"), ev.RequestAccepted).message, m.PublishOk)
    client.publish_done(request_id, PublishDoneStatus.TRACK_ENDED)
    pair.pump()
    assert _one(pair.take("server"), ev.SubscriptionEnded).request_id == request_id


def test_datagrams(pair: SessionPair) -> None:
    _, server = pair.sessions()
    request_id, _ = _subscribed(pair)
    server.objects.send_datagram(request_id, 2, 0, b"tiny", end_of_group=True)
    server.objects.send_datagram(request_id, 2, 1, status=ObjectStatus.END_OF_TRACK)
    pair.pump()
    objects = of(pair.take("client"), ev.ObjectReceived)
    assert [(o.object_id, o.payload, o.status, o.end_of_group) for o in objects] == [
        (0, b"tiny", ObjectStatus.NORMAL, True),
        (1, b"", ObjectStatus.END_OF_TRACK, False),
    ]
    assert all(o.source == ev.ObjectSource.DATAGRAM and o.subgroup_id is None for o in objects)


def test_namespaces(pair: SessionPair) -> None:
    client, server = pair.sessions()
    namespace = TRACK.namespace
    request_id = client.publish_namespace(namespace)
    pair.pump()
    assert _one(pair.take("server"), ev.NamespacePublished).message.namespace == namespace
    server.publish_namespace_ok(request_id)
    pair.pump()
    assert isinstance(_one(pair.take("client"), ev.RequestAccepted).message, m.PublishNamespaceOk)
    client.publish_namespace_done(namespace)
    pair.pump()
    assert _one(pair.take("server"), ev.NamespacePublishDone).namespace == namespace

    client.publish_namespace(namespace)
    pair.pump()
    server.publish_namespace_cancel(namespace, 0x4, "uninterested")
    pair.pump()
    assert _one(pair.take("client"), ev.NamespacePublishCancelled).message.reason == "uninterested"

    prefix_id = client.subscribe_namespace(namespace[:1])
    pair.pump()
    assert (
        _one(pair.take("server"), ev.NamespaceSubscribeRequested).message.namespace == namespace[:1]
    )
    server.subscribe_namespace_ok(prefix_id)
    client.unsubscribe_namespace(namespace[:1])
    pair.pump()
    assert _one(pair.take("server"), ev.NamespaceUnsubscribed).prefix == namespace[:1]


def test_track_status(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id = client.track_status(TRACK)
    pair.pump()
    assert _one(pair.take("server"), ev.TrackStatusRequested).message.track == TRACK
    server.track_status_ok(request_id, largest=Location(9, 3))
    pair.pump()
    reply = _one(pair.take("client"), ev.RequestAccepted).message
    assert isinstance(reply, m.TrackStatusOk) and reply.largest == Location(9, 3)


def test_goaway(pair: SessionPair) -> None:
    client, server = pair.sessions()
    server.goaway(b"moqt://other:4443/kv")
    with pytest.raises(UsageError):
        client.goaway(b"moqt://elsewhere")
    pair.pump()
    assert _one(pair.take("client"), ev.GoawayReceived).new_session_uri == b"moqt://other:4443/kv"


def test_request_credit_is_enforced_and_replenished(stack: str) -> None:
    pair = SessionPair(stack=stack, server_limits=SessionLimits(request_window=4))
    pair.pump()
    client, server = pair.sessions()
    ids = [client.subscribe(FullTrackName((b"n",), bytes([i]))) for i in range(4)]
    assert ids == [0, 2, 4, 6]
    with pytest.raises(RequestLimitReached):
        client.subscribe(TRACK)
    pair.pump()
    assert _one(pair.take("server"), ev.RequestsBlockedReceived).limit == 8
    for request_id in ids[:2]:
        server.reject(request_id, SubscribeErrorCode.INTERNAL_ERROR)
    pair.pump()
    assert _one(pair.take("client"), ev.MaxRequestIdReceived).limit == 12
    assert client.subscribe(TRACK) == 8


def test_request_methods_need_an_established_session(stack: str) -> None:
    pair = SessionPair(stack=stack)
    client, _ = pair.sessions()
    with pytest.raises(UsageError):
        client.subscribe(TRACK)


# ---------------------------------------------------------------------------------------------
# Violations: the peer sends something the protocol forbids; the session closes with its code.


def _control(message: m.ControlMessage | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.encode()


def _frame(message_type: int, payload: bytes) -> bytes:
    return encode_varint(message_type) + len(payload).to_bytes(2, "big") + payload


def _expect_close(pair: SessionPair, code: SessionErrorCode, side: str = "server") -> None:
    pair.pump()
    pair.advance(5.0)  # past the draining period, after which aioquic reports the close
    closed = _one(pair.take(side), ev.SessionClosed)
    assert (closed.error_code, closed.by_peer) == (code, False), closed
    other = _one(pair.take("client" if side == "server" else "server"), ev.SessionClosed)
    assert (other.error_code, other.by_peer) == (code, True)


VIOLATIONS: list[tuple[str, bytes, SessionErrorCode]] = [
    ("unknown message type", _frame(0x3F, b""), SessionErrorCode.PROTOCOL_VIOLATION),
    (
        "unknown type after a valid request",
        _control(m.Subscribe(0, TRACK)) + _frame(0x3F, b""),
        SessionErrorCode.PROTOCOL_VIOLATION,
    ),
    ("length mismatch", _frame(0x0A, b"\x00\x00"), SessionErrorCode.PROTOCOL_VIOLATION),
    (
        "second CLIENT_SETUP",
        _control(m.ClientSetup((DRAFT_14_VERSION,))),
        SessionErrorCode.PROTOCOL_VIOLATION,
    ),
    ("skipped request id", _control(m.Subscribe(2, TRACK)), SessionErrorCode.INVALID_REQUEST_ID),
    ("wrong parity", _control(m.Subscribe(1, TRACK)), SessionErrorCode.INVALID_REQUEST_ID),
    (
        "over the limit",
        _control(m.Subscribe(0, TRACK))
        + _control(m.Subscribe(2, OTHER))
        + _control(m.SubscribeNamespace(4, ())),
        SessionErrorCode.TOO_MANY_REQUESTS,
    ),
    (
        "second subscription to a track",
        _control(m.Subscribe(0, TRACK)) + _control(m.Subscribe(2, TRACK)),
        SessionErrorCode.PROTOCOL_VIOLATION,
    ),
    ("reply to nothing", _control(m.SubscribeOk(1, 0)), SessionErrorCode.PROTOCOL_VIOLATION),
    ("MAX_REQUEST_ID going down", _control(m.MaxRequestId(1)), SessionErrorCode.PROTOCOL_VIOLATION),
    (
        "GOAWAY from a client with a URI",
        _control(m.Goaway(b"moqt://x")),
        SessionErrorCode.PROTOCOL_VIOLATION,
    ),
    ("second GOAWAY", _control(m.Goaway()) * 2, SessionErrorCode.PROTOCOL_VIOLATION),
    (
        "update of no subscription",
        _control(m.SubscribeUpdate(0, 8, Location(0, 0))),
        SessionErrorCode.PROTOCOL_VIOLATION,
    ),
    (
        "parameter over 65535 bytes",
        _frame(0x11, b"\x00\x01\x01a\x01\x01" + encode_varint(70_000)),
        SessionErrorCode.KEY_VALUE_FORMATTING_ERROR,
    ),
]


@pytest.mark.parametrize(("what", "data", "code"), VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_control_violations_close_with_the_right_code(
    stack: str, what: str, data: bytes, code: SessionErrorCode
) -> None:
    pair = SessionPair(stack=stack, server_limits=SessionLimits(request_window=2))
    pair.pump()
    pair.take("client"), pair.take("server")
    pair.client_quic.send_stream_data(0, data)
    _expect_close(pair, code)


def test_message_before_setup_is_a_violation(stack: str) -> None:
    pair = SessionPair(stack=stack, client_session=False)
    pair.client_quic.send_stream_data(0, m.Subscribe(0, TRACK).encode())
    pair.pump()
    closed = _one(pair.take("server"), ev.SessionClosed)
    assert closed.error_code == SessionErrorCode.PROTOCOL_VIOLATION


def test_no_common_version(stack: str) -> None:
    pair = SessionPair(stack=stack, client_session=False)
    pair.client_quic.send_stream_data(0, m.ClientSetup((0xFF00000D, 0xFF00000F)).encode())
    pair.pump()
    closed = _one(pair.take("server"), ev.SessionClosed)
    assert closed.error_code == SessionErrorCode.VERSION_NEGOTIATION_FAILED


def test_server_picking_a_version_not_offered(stack: str) -> None:
    pair = SessionPair(stack=stack, server_session=False)
    pair.pump()
    pair.server_quic.send_stream_data(0, m.ServerSetup(0xFF00000D).encode())
    pair.pump()
    closed = _one(pair.take("client"), ev.SessionClosed)
    assert closed.error_code == SessionErrorCode.VERSION_NEGOTIATION_FAILED


def test_duplicate_track_alias(stack: str) -> None:
    pair, client = _raw_server(stack)
    first = client.subscribe(TRACK)
    second = client.subscribe(OTHER)
    for request_id in (first, second):
        pair.server_quic.send_stream_data(0, m.SubscribeOk(request_id, track_alias=4).encode())
    pair.pump()
    closed = _one(pair.take("client"), ev.SessionClosed)
    assert closed.error_code == SessionErrorCode.DUPLICATE_TRACK_ALIAS


def _data_violation(stack: str, data: bytes, fin: bool = True) -> SessionPair:
    pair = SessionPair(stack=stack)
    pair.pump()
    pair.take("server")
    stream_id = pair.client_quic.get_next_available_stream_id(is_unidirectional=True)
    pair.client_quic.send_stream_data(stream_id, data, end_stream=fin)
    return pair


@pytest.mark.parametrize(
    ("what", "data", "code"),
    [
        ("invalid stream type", b"\x16\x00\x00\x80", SessionErrorCode.PROTOCOL_VIOLATION),
        (
            "FIN inside an object",
            SubgroupHeader(0, 0).encode() + b"\x00\x05ab",
            SessionErrorCode.PROTOCOL_VIOLATION,
        ),
        ("fetch stream of no fetch", FetchHeader(0).encode(), SessionErrorCode.PROTOCOL_VIOLATION),
        (
            "bad extension block",
            SubgroupHeader(0, 0, extensions=True).encode() + b"\x00\x02\x01\x09\x01a",
            SessionErrorCode.KEY_VALUE_FORMATTING_ERROR,
        ),
    ],
)
def test_data_violations_close_with_the_right_code(
    stack: str, what: str, data: bytes, code: SessionErrorCode
) -> None:
    _expect_close(_data_violation(stack, data), code)


def test_second_bidirectional_stream_is_a_violation(pair: SessionPair) -> None:
    pair.take("server")
    stream_id = pair.client_quic.get_next_available_stream_id()
    pair.client_quic.send_stream_data(stream_id, b"\x00")
    _expect_close(pair, SessionErrorCode.PROTOCOL_VIOLATION)


def test_closing_the_control_stream_is_a_violation(pair: SessionPair) -> None:
    pair.take("server")
    pair.client_quic.send_stream_data(0, b"", end_stream=True)
    _expect_close(pair, SessionErrorCode.PROTOCOL_VIOLATION)


# ---------------------------------------------------------------------------------------------
# moq-rs, replayed from the bytes captured in the implementer notes (section 5).


def test_moq_rs_session_replayed(stack: str) -> None:
    """moq-rs: unknown setup parameters, an empty SUBSCRIBE_NAMESPACE prefix, objects before
    SUBSCRIBE_OK, and group order 2 when 1 was asked. All must be accepted."""
    pair = SessionPair(stack=stack, server_session=False)
    pair.pump()
    client = pair.client
    assert client is not None
    server_setup = (
        bytes.fromhex("210029c0000000ff00000e0402c0000000ffffffff80040b5a0180040b5c01070b")
        + b"moq-lite-rs"
    )
    pair.server_quic.send_stream_data(
        0, server_setup + bytes.fromhex("1100030100 00".replace(" ", ""))
    )
    pair.pump()
    events = pair.take("client")
    assert _one(events, ev.SetupCompleted).parameters.implementation == b"moq-lite-rs"
    assert _one(events, ev.NamespaceSubscribeRequested).message.namespace == ()
    client.subscribe_namespace_ok(1)

    request_id = client.subscribe(FullTrackName((b"kvtest",), b"t0"))
    stream_id = pair.server_quic.get_next_available_stream_id(is_unidirectional=True)
    objects = bytes.fromhex("0003105b5804") + b"g7o0" + bytes.fromhex("0003105b5904") + b"g7o1"
    pair.server_quic.send_stream_data(
        stream_id, bytes.fromhex("19000780") + objects, end_stream=True
    )
    pair.pump()
    pair.server_quic.send_stream_data(0, bytes.fromhex("0400080000000201060300"))
    pair.pump()
    events = pair.take("client")
    ok = _one(events, ev.RequestAccepted).message
    assert isinstance(ok, m.SubscribeOk) and ok.group_order == GroupOrder.DESCENDING
    received = of(events, ev.ObjectReceived)
    assert [(o.request_id, o.group_id, o.object_id, o.payload) for o in received] == [
        (request_id, 7, 0, b"g7o0"),
        (request_id, 7, 1, b"g7o1"),
    ]
    assert _one(events, ev.DataStreamEnded).end_of_group
    assert not of(events, ev.SessionClosed)


# ---------------------------------------------------------------------------------------------
# Races between a request's reply and our own withdrawal of it: none is a violation.


def test_unsubscribe_before_subscribe_ok_arrives(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id = client.subscribe(TRACK)
    pair.pump()
    server.subscribe_ok(request_id)
    stream = server.objects.open_subgroup(request_id, 0)
    server.objects.send_object(stream, 0, b"late", end_stream=True)
    client.unsubscribe(request_id)  # crosses the SUBSCRIBE_OK and the stream
    pair.pump()
    events = pair.take("client")
    assert not of(events, ev.SessionClosed) and not of(events, ev.ObjectReceived)
    assert _one(pair.take("server"), ev.Unsubscribed).request_id == request_id


def test_fetch_cancel_before_fetch_ok_arrives(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id = client.fetch(m.StandaloneFetch(TRACK, Location(0, 0), 0))
    pair.pump()
    server.fetch_ok(request_id, Location(0, 0))
    client.fetch_cancel(request_id)
    pair.pump()
    assert not of(pair.take("client"), ev.SessionClosed)
    assert _one(pair.take("server"), ev.FetchCancelled).request_id == request_id


def test_a_fetch_stream_that_crosses_our_fetch_cancel_is_dropped(pair: SessionPair) -> None:
    client, server = pair.sessions()
    request_id = client.fetch(m.StandaloneFetch(TRACK, Location(0, 0), 0))
    pair.pump()
    server.fetch_ok(request_id, Location(0, 0))
    stream = server.objects.open_fetch_stream(request_id)
    server.objects.send_fetch_object(stream, 0, 0, 0, b"late", end_stream=True)
    client.fetch_cancel(request_id)  # crosses the FETCH_OK and the stream
    pair.pump()
    events = pair.take("client")
    assert not of(events, ev.SessionClosed) and not of(events, ev.ObjectReceived)
    pair.take("server")
    later = client.fetch(m.StandaloneFetch(TRACK, Location(0, 0), 0))  # the session goes on
    pair.pump()
    assert _one(pair.take("server"), ev.FetchRequested).message.request_id == later


def test_a_request_withdrawn_before_the_peer_read_it_is_never_reported(
    pair: SessionPair,
) -> None:
    """SUBSCRIBE + UNSUBSCRIBE and FETCH + FETCH_CANCEL that arrive together: the
    application hears of neither, so it never answers a request that is over."""
    client, server = pair.sessions()
    subscribed = client.subscribe(TRACK)
    client.unsubscribe(subscribed)
    fetched = client.fetch(m.StandaloneFetch(OTHER, Location(0, 0), 0))
    client.fetch_cancel(fetched)
    pair.pump()
    heard = ev.SubscribeRequested | ev.Unsubscribed | ev.FetchRequested | ev.FetchCancelled
    assert not of(pair.take("server"), heard)
    again = client.subscribe(TRACK)  # the track is free on both sides
    pair.pump()
    assert _one(pair.take("server"), ev.SubscribeRequested).message.request_id == again
    server.subscribe_ok(again)
    pair.pump()
    assert _one(pair.take("client"), ev.RequestAccepted).request_id == again


def test_fetch_stream_may_end_before_fetch_ok(stack: str) -> None:
    pair, client = _raw_server(stack)
    request_id = client.fetch(m.StandaloneFetch(TRACK, Location(0, 0), 0))
    pair.pump()
    stream_id = pair.server_quic.get_next_available_stream_id(is_unidirectional=True)
    data = FetchHeader(request_id).encode() + FetchObject(0, 0, 0, body=ObjectBody(b"f")).encode()
    pair.server_quic.send_stream_data(stream_id, data, end_stream=True)
    pair.pump()
    pair.server_quic.send_stream_data(0, m.FetchOk(request_id, Location(0, 0)).encode())
    pair.pump()
    events = pair.take("client")
    assert [type(e) for e in events] == [ev.ObjectReceived, ev.DataStreamEnded, ev.RequestAccepted]


def test_a_request_refused_locally_spends_no_request_id(pair: SessionPair) -> None:
    client, _ = pair.sessions()
    with pytest.raises(UsageError):
        client.subscribe(TRACK, subscriber_priority=256)
    with pytest.raises(UsageError):
        client.publish_namespace((b"x" * 5000,))
    assert client.subscribe(TRACK) == 0
    pair.pump()
    assert _one(pair.take("server"), ev.SubscribeRequested).message.request_id == 0


def test_bad_objects_are_refused_before_anything_is_written(pair: SessionPair) -> None:
    _, server = pair.sessions()
    request_id, _ = _subscribed(pair)
    stream = server.objects.open_subgroup(request_id, 0)
    server.objects.send_object(stream, 5, b"a")
    with pytest.raises(UsageError):
        server.objects.send_object(stream, 5, b"again")  # ids must increase
    with pytest.raises(UsageError):
        server.objects.send_object(
            stream, 6, b"x", extensions=b"\x10\x01"
        )  # header has no extensions
    with pytest.raises(UsageError):
        server.objects.send_object(stream, 6, b"x", status=ObjectStatus.END_OF_GROUP)
    with pytest.raises(UsageError):
        server.objects.open_subgroup(request_id, 1, publisher_priority=300)
    server.objects.send_object(stream, 6, b"b", end_stream=True)
    pair.pump()
    objects = of(pair.take("client"), ev.ObjectReceived)
    assert [(o.object_id, o.payload) for o in objects] == [(5, b"a"), (6, b"b")]


def test_incomplete_objects_are_bounded_across_streams(stack: str) -> None:
    pair, client = _raw_server(stack, SessionLimits(max_buffered_bytes=1500))
    request_id = client.subscribe(TRACK)
    pair.server_quic.send_stream_data(0, m.SubscribeOk(request_id, track_alias=1).encode())
    header = SubgroupHeader(1, 0)
    whole = header.encode() + SubgroupObject(0, ObjectBody(b"z" * 2000)).encode(header, None)

    def open_partial() -> int:
        stream_id = pair.server_quic.get_next_available_stream_id(is_unidirectional=True)
        pair.server_quic.send_stream_data(stream_id, whole[:1000])
        pair.pump()
        return stream_id

    for _ in range(2):  # one at a time: each completes and gives its bytes back
        stream_id = open_partial()
        pair.server_quic.send_stream_data(stream_id, whole[1000:], end_stream=True)
        pair.pump()
    first, second = open_partial(), open_partial()  # together over the limit: second dropped
    stopped = [e.stream_id for e in pair.server_raw if type(e).__name__ == "StopSendingReceived"]
    assert stopped == [second]
    pair.server_quic.send_stream_data(first, whole[1000:], end_stream=True)
    pair.pump()
    objects = of(pair.take("client"), ev.ObjectReceived)
    assert len(objects) == 3 and objects[-1].stream_id == first


def test_an_ended_subscription_gives_its_alias_to_a_new_one(stack: str) -> None:
    pair, client = _raw_server(stack)
    first = client.subscribe(TRACK)
    pair.server_quic.send_stream_data(0, m.SubscribeOk(first, track_alias=0).encode())
    pair.server_quic.send_stream_data(
        0, m.PublishDone(first, PublishDoneStatus.TRACK_ENDED, 0).encode()
    )
    pair.pump()
    second = client.subscribe(OTHER)
    pair.server_quic.send_stream_data(0, m.SubscribeOk(second, track_alias=0).encode())
    pair.pump()
    _raw_subgroup(pair, alias=0, payload=b"new")
    pair.pump()
    events = pair.take("client")
    assert not of(events, ev.SessionClosed)
    assert _one(events, ev.ObjectReceived).request_id == second
