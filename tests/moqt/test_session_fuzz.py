"""A peer sending arbitrary messages or bytes: the session must close with a protocol code
(or carry on), never fail internally. INTERNAL_ERROR here means an exception we did not expect."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol import messages as m
from sidecar.moqt.protocol.drafts import DRAFT_14_VERSION
from sidecar.moqt.protocol.errors import SessionErrorCode
from sidecar.moqt.protocol.model import FullTrackName, Location
from tests.support.quic_pair import SessionPair
from tests.support.strategies import messages

_fuzz = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _server_after_setup() -> SessionPair:
    pair = SessionPair(client_session=False)
    setup = m.ClientSetup((DRAFT_14_VERSION,), m.SetupParameters(max_request_id=1000))
    pair.client_quic.send_stream_data(0, setup.encode())
    pair.pump()
    return pair


def _assert_no_internal_error(pair: SessionPair) -> None:
    pair.pump()
    for closed in [e for e in pair.take("server") if isinstance(e, ev.SessionClosed)]:
        assert closed.error_code != SessionErrorCode.INTERNAL_ERROR, closed


@_fuzz
@given(st.lists(messages, min_size=1, max_size=6))
def test_arbitrary_control_messages(sequence: list[m.ControlMessage]) -> None:
    pair = _server_after_setup()
    pair.client_quic.send_stream_data(0, b"".join(message.encode() for message in sequence))
    _assert_no_internal_error(pair)


@_fuzz
@given(st.lists(messages, min_size=1, max_size=8), st.binary(max_size=40))
def test_arbitrary_requests_in_sequence(sequence: list[m.ControlMessage], tail: bytes) -> None:
    """As above, but requests carry the ids the server expects, so they reach the handlers;
    then arbitrary bytes, so decoding fails with earlier messages already consumed."""
    pair = _server_after_setup()
    next_id = 0
    data = b""
    for message in sequence:
        if message.NEW_REQUEST:
            message = dataclasses.replace(message, request_id=next_id)  # type: ignore[call-arg]
            next_id += 2
        data += message.encode()
    pair.client_quic.send_stream_data(0, data + tail)
    _assert_no_internal_error(pair)


@_fuzz
@given(st.binary(min_size=1, max_size=300))
def test_arbitrary_control_bytes(data: bytes) -> None:
    pair = _server_after_setup()
    pair.client_quic.send_stream_data(0, data)
    _assert_no_internal_error(pair)


@_fuzz
@given(st.lists(st.tuples(st.binary(max_size=200), st.booleans()), min_size=1, max_size=4))
def test_arbitrary_data_streams(streams: list[tuple[bytes, bool]]) -> None:
    pair = _server_after_setup()
    for data, fin in streams:
        stream_id = pair.client_quic.get_next_available_stream_id(is_unidirectional=True)
        pair.client_quic.send_stream_data(stream_id, data, end_stream=fin)
    _assert_no_internal_error(pair)


@_fuzz
@given(st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=4))
def test_arbitrary_datagrams(datagrams: list[bytes]) -> None:
    pair = _server_after_setup()
    for data in datagrams:
        pair.client_quic.send_datagram_frame(data)
    _assert_no_internal_error(pair)


def _client_with_open_requests() -> tuple[SessionPair, list[int]]:
    """A client session whose raw server has completed setup; the client has one request of
    every kind open, so replies the fuzzer aims at them reach the reply handlers."""
    pair = SessionPair(server_session=False)
    pair.pump()
    client = pair.client
    assert client is not None
    setup = m.ServerSetup(DRAFT_14_VERSION, m.SetupParameters(max_request_id=1000))
    pair.server_quic.send_stream_data(0, setup.encode())
    pair.pump()
    track = FullTrackName((b"ns",), b"t")
    ids = [
        client.subscribe(track),
        client.fetch(m.StandaloneFetch(track, Location(0, 0), 3)),
        client.publish(FullTrackName((b"ns",), b"mine")),
        client.track_status(track),
        client.publish_namespace((b"ns",)),
        client.subscribe_namespace((b"ns",)),
    ]
    pair.pump()
    return pair, ids


@_fuzz
@given(st.lists(messages, min_size=1, max_size=8), st.data())
def test_arbitrary_replies_and_requests_to_a_client(
    sequence: list[m.ControlMessage], data: st.DataObject
) -> None:
    pair, open_ids = _client_with_open_requests()
    next_id = 1
    out = b""
    for message in sequence:
        if message.NEW_REQUEST:
            message = dataclasses.replace(message, request_id=next_id)  # type: ignore[call-arg]
            next_id += 2
        elif hasattr(message, "request_id") and not isinstance(message, m.MaxRequestId):
            target = data.draw(st.sampled_from(open_ids))
            message = dataclasses.replace(message, request_id=target)  # type: ignore[call-arg]
        out += message.encode()
    pair.server_quic.send_stream_data(0, out)
    pair.pump()
    for closed in [e for e in pair.take("client") if isinstance(e, ev.SessionClosed)]:
        assert closed.error_code != SessionErrorCode.INTERNAL_ERROR, closed
