"""Hostile bytes at a real relay process over real QUIC: each bad session closes alone.

A raw QUIC client completes SETUP, then sends malformed or truncated control messages or a
bogus data stream. Every case must end with the relay closing that session with a MoQT error
code (never INTERNAL_ERROR, never silence), while two bystander sessions, connected through
the whole run on a loop of their own, keep exchanging objects and the cache stays intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from sidecar.moqt.aio import transport
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.protocol.data import FETCH_HEADER_TYPE, FetchHeader, is_subgroup_type
from sidecar.moqt.protocol.drafts import DRAFTS, Draft
from sidecar.moqt.protocol.errors import ProtocolError, SessionErrorCode
from sidecar.moqt.protocol.events import DataStreamEnded, RequestAccepted, SubscribeRequested
from sidecar.moqt.protocol.messages import (
    ClientSetup,
    ControlMessage,
    Setup,
    SetupParameters,
    StandaloneFetch,
    decode_control,
)
from sidecar.moqt.protocol.model import Location
from sidecar.moqt.protocol.wire import encode_varint
from tests.support import strategies
from tests.support.relay import (
    FROM_START,
    HOST,
    NAMESPACE,
    RELAY_BACKENDS,
    TRACK,
    Client,
    RelayProcess,
    accept,
    expected,
    payload,
    received,
    send_groups,
)

T = TypeVar("T")
CASE_TIMEOUT_S = 15.0
# Codes a peer's garbage can legitimately earn; INTERNAL_ERROR would mean a relay bug.
PEER_FAULTS = set(SessionErrorCode) - {SessionErrorCode.NO_ERROR, SessionErrorCode.INTERNAL_ERROR}


class LoopThread:
    """An event loop on its own thread, so sessions outlive each hypothesis example."""

    def __init__(self) -> None:
        self.loop = transport.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


async def hostile_session(
    relay: RelayProcess,
    cert: CertificatePaths,
    draft: Draft,
    unidirectional: bool,
    data: bytes,
    fin: bool,
) -> int:
    """Set up a session of `draft` by hand, send ``data`` on the control stream or a new uni
    stream, and return the error code the relay closes the connection with."""
    closed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    setup_answered = asyncio.Event()

    def attach(endpoint: transport.QuicEndpoint) -> transport.QuicEventHandler:
        def on_event(event: Any) -> None:
            name = type(event).__name__
            if name == "StreamDataReceived":  # the relay's SETUP (or SERVER_SETUP)
                setup_answered.set()
            elif name == "ConnectionTerminated" and not closed.done():
                closed.set_result(event.error_code)

        return on_event

    port = int(relay.url.rsplit(":", 1)[1])
    settings = dataclasses.replace(relay.settings, drafts=(draft,))
    async with transport.open_connection(HOST, port, settings, attach) as endpoint:
        quic = endpoint.quic
        if draft.request_streams:  # SETUP on a control stream of its own; requests apart
            setup: ControlMessage = Setup(SetupParameters(path=b"/"))
            control = quic.get_next_available_stream_id(True)
        else:
            versions = () if draft.setup_version is None else (draft.setup_version,)
            setup = ClientSetup(versions, SetupParameters(path=b"/", max_request_id=10))
            control = quic.get_next_available_stream_id(False)
        quic.send_stream_data(control, setup.encode(draft))
        endpoint.transmit()
        await asyncio.wait_for(setup_answered.wait(), CASE_TIMEOUT_S)
        if unidirectional:
            stream_id = quic.get_next_available_stream_id(True)
        elif draft.request_streams:  # where requests go: a stream of their own
            stream_id = quic.get_next_available_stream_id(False)
        else:
            stream_id = control
        quic.send_stream_data(stream_id, data, fin)
        endpoint.transmit()
        return await asyncio.wait_for(closed, CASE_TIMEOUT_S)


@st.composite
def lying_lengths(draw: st.DrawFn, draft: Draft) -> bytes:
    """A valid control message whose length field claims fewer bytes than its fields need."""
    try:
        encoded = draw(strategies.messages_of(draft)).encode(draft)
    except ValueError:  # what this draft cannot say (a range that ends before it starts)
        reject()
    reader = draft.wire.reader(encoded)
    reader.varint()
    head = encoded[: reader.pos]
    payload = encoded[reader.pos + 2 :]
    if not payload:  # nothing to lie about (draft 18's SETUP with no options)
        reject()
    length = draw(st.integers(0, len(payload) - 1))
    lied = head + length.to_bytes(2, "big") + payload[:length]
    with contextlib.suppress(ProtocolError):
        decode_control(lied, draft)
        reject()  # still a whole message (one whose track properties run to its end)
    return lied


@st.composite
def bad_stream_types(draw: st.DrawFn, draft: Draft) -> bytes:
    known = st.integers(0, 0x3F).filter(
        lambda t: t != FETCH_HEADER_TYPE and not is_subgroup_type(t, draft)
    )
    return encode_varint(draw(known)) + draw(st.binary(max_size=40))


@st.composite
def truncated_subgroups(draw: st.DrawFn, draft: Draft) -> bytes:
    """A subgroup stream whose last object promises more payload than comes before FIN."""
    header, objects = draw(strategies.subgroup_streams())
    data = header.encode(draft)
    previous: int | None = None
    for obj in objects:
        if obj.body.status not in draft.object_statuses:
            continue
        data += obj.encode(header, previous, draft)
        previous = obj.object_id
    promised = draw(st.integers(1, 5000))
    given = draw(st.binary(max_size=promised - 1))
    ints = draft.wire
    extensions = ints.varint(0) if header.extensions else b""
    return data + ints.varint(0) + extensions + ints.varint(promised) + given


def _fetch_header(request_id: int) -> bytes:
    return FetchHeader(request_id).encode() + b"\x00\x00\x00\x80\x00\x01"


@pytest.mark.parametrize("module_relay", RELAY_BACKENDS, indirect=True)
class TestHostileInput:
    def test_bad_sessions_close_alone(
        self, module_relay: RelayProcess, cert: CertificatePaths, loop: LoopThread
    ) -> None:
        """Every draft's hostile sessions against one relay that speaks every draft; its
        other sessions carry on."""
        bystanders = loop.run(_start_bystanders(module_relay, cert))
        for draft in DRAFTS.values():
            for case in _hostile_cases(module_relay, cert, loop, draft):
                case()
        loop.run(_bystanders_still_work(bystanders, module_relay, cert))


def _hostile_cases(
    relay: RelayProcess, cert: CertificatePaths, loop: LoopThread, draft: Draft
) -> list[Callable[[], None]]:
    def check(unidirectional: bool, data: bytes, fin: bool, codes: set[int]) -> None:
        code = loop.run(hostile_session(relay, cert, draft, unidirectional, data, fin))
        assert code in codes, f"{draft}: closed with {code:#x}"

    violation = {SessionErrorCode.PROTOCOL_VIOLATION}
    # Examples per draft scale down as drafts are added: the relay process's time per
    # session is the cost, and the fuzz targets (fuzz/) read every draft far longer.

    @settings(
        max_examples=25 * 2 // len(DRAFTS),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.binary(max_size=300))
    def garbage_then_fin(data: bytes) -> None:
        check(False, data, True, PEER_FAULTS)

    @settings(
        max_examples=25 * 2 // len(DRAFTS),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(lying_lengths(draft))
    def control_lengths(data: bytes) -> None:
        check(False, data, False, violation | {SessionErrorCode.KEY_VALUE_FORMATTING_ERROR})

    @settings(
        max_examples=15 * 2 // len(DRAFTS),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(bad_stream_types(draft))
    def stream_types(data: bytes) -> None:
        check(True, data, False, violation)

    @settings(
        max_examples=20 * 2 // len(DRAFTS),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(truncated_subgroups(draft))
    def subgroups(data: bytes) -> None:
        check(True, data, True, violation)

    @settings(max_examples=5 * 2 // len(DRAFTS), deadline=None)
    @given(st.integers(0, 2**30))
    def unknown_fetches(request_id: int) -> None:
        check(True, _fetch_header(request_id), False, violation)

    return [garbage_then_fin, control_lengths, stream_types, subgroups, unknown_fetches]


class Bystanders:
    def __init__(self, publisher: Client, subscriber: Client, upstream: int, sub_id: int) -> None:
        self.publisher, self.subscriber = publisher, subscriber
        self.upstream, self.sub_id = upstream, sub_id
        self.contexts: list[Any] = []


async def _open(relay: RelayProcess, cert: CertificatePaths, contexts: list[Any]) -> Client:
    client = Client()
    context = transport.connect(relay.url, relay.settings, client.attach)
    await context.__aenter__()
    contexts.append(context)
    return client


async def _start_bystanders(relay: RelayProcess, cert: CertificatePaths) -> Bystanders:
    contexts: list[Any] = []
    publisher = await _open(relay, cert, contexts)
    request_id = publisher.moqt.publish_namespace(NAMESPACE)
    publisher.send()
    await publisher.next(RequestAccepted, lambda e: e.request_id == request_id)
    subscriber = await _open(relay, cert, contexts)
    sub_id = subscriber.moqt.subscribe(TRACK, filter=FROM_START)
    subscriber.send()
    upstream = accept(publisher, await publisher.next(SubscribeRequested))
    sent = await send_groups(publisher, upstream, groups=3, objects=4, size=4000)
    await subscriber.until(lambda: len(subscriber.objects(sub_id)) == sent)
    bystanders = Bystanders(publisher, subscriber, upstream, sub_id)
    bystanders.contexts = contexts
    return bystanders


async def _bystanders_still_work(
    bystanders: Bystanders, relay: RelayProcess, cert: CertificatePaths
) -> None:
    publisher, subscriber = bystanders.publisher, bystanders.subscriber
    moqt = publisher.moqt
    for group in (3, 4, 5):
        stream = moqt.objects.open_subgroup(bystanders.upstream, group)
        for obj in range(4):
            moqt.objects.send_object(stream, obj, payload(group, obj, 4000), end_stream=obj == 3)
    publisher.send()
    await subscriber.until(lambda: len(subscriber.objects(bystanders.sub_id)) == 24)
    assert received(subscriber, bystanders.sub_id) == expected(6, 4, 4000)

    late = await _open(relay, cert, bystanders.contexts)
    fetch_id = late.moqt.fetch(StandaloneFetch(TRACK, Location(0, 0), 5, None))
    late.send()
    await late.next(DataStreamEnded, lambda e: e.request_id == fetch_id)
    assert received(late, fetch_id) == expected(6, 4, 4000)
    for context in reversed(bystanders.contexts):
        await context.__aexit__(None, None, None)
