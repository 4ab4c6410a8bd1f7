"""The asyncio adapter over real QUIC on 127.0.0.1: tuned endpoints, MoQT setup, GOAWAY, close."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from sidecar.address import free_udp_port
from sidecar.moqt.aio import transport
from sidecar.moqt.aio.quic_backend import (
    MiB,
    QuicSettings,
    QuicSettingsError,
    load_backend,
)
from sidecar.moqt.aio.tls import CertificatePaths, write_certificate
from sidecar.moqt.protocol.errors import SessionErrorCode
from sidecar.moqt.protocol.events import MoqtEvent, SessionClosed, SubscribeRequested
from sidecar.moqt.protocol.model import FullTrackName
from tests.support.aio import run
from tests.support.relay import STACKS

# Times loads over paced links or stall watches: scripts/test.sh runs it alone (see there).
pytestmark = pytest.mark.timing

HOST = "127.0.0.1"


@pytest.fixture(params=STACKS)
def settings(request: pytest.FixtureRequest, cert: CertificatePaths) -> QuicSettings:
    return QuicSettings.loopback(backend=request.param, ca_file=cert.cert)


class Recorder:
    """Collects one session's events and lets a test wait for one of a given type."""

    def __init__(self) -> None:
        self.events: list[MoqtEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, connection: transport.MoqtConnection) -> transport.MoqtEventHandler:
        self.connection = connection
        return self.record

    def record(self, event: MoqtEvent) -> None:
        self.events.append(event)
        self._changed.set()

    async def wait_for(self, kind: type) -> Any:
        while True:
            for event in self.events:
                if isinstance(event, kind):
                    return event
            self._changed.clear()
            await self._changed.wait()


class ByteSink:
    """A bare QUIC receiver: hashes one stream's bytes and resolves `done` at its FIN."""

    def __init__(self, backend: Any) -> None:
        self.stream_data = backend.events.StreamDataReceived
        self.digest = hashlib.sha256()
        self.count = 0

    def __call__(self, endpoint: transport.QuicEndpoint) -> transport.QuicEventHandler:
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        return self.on_event

    def on_event(self, event: Any) -> None:
        if isinstance(event, self.stream_data):
            self.digest.update(event.data)
            self.count += len(event.data)
            if event.end_stream:
                self.done.set_result(self.count)


@asynccontextmanager
async def moqt_server(
    settings: QuicSettings, cert: CertificatePaths, on_session: transport.OnSession
) -> AsyncIterator[tuple[transport.MoqtServer, str]]:
    port = free_udp_port()
    server = await transport.serve(HOST, port, settings, on_session, cert=cert.cert, key=cert.key)
    try:
        yield server, f"moqt://localhost:{port}/kv?tenant=a"
    finally:
        server.close()


def test_settings_reject_what_no_stack_accepts() -> None:
    with pytest.raises(QuicSettingsError):
        QuicSettings(backend="quiche")  # type: ignore[arg-type]
    with pytest.raises(QuicSettingsError):
        QuicSettings(max_datagram_size=600)
    with pytest.raises(QuicSettingsError):
        QuicSettings(max_send_backlog=0)


@pytest.mark.parametrize(
    "url",
    [
        "https://localhost:4443/",
        "moqt://localhost/",  # draft-14 has no default port
        "moqt://:4443/",
        "moqt://localhost:99999/",
        "moqt://localhost:1/" + "x" * 9000,
    ],
)
def test_bad_url_is_a_typed_error(url: str) -> None:
    with pytest.raises(transport.MoqtConnectError):
        transport.MoqtUrl.parse(url)


def test_url_keeps_path_query_and_ipv6_authority() -> None:
    url = transport.MoqtUrl.parse("moqt://[::1]:4443/relay?x=1")
    assert (url.host, url.port, url.path, url.authority) == (
        "::1",
        4443,
        "/relay?x=1",
        "[::1]:4443",
    )


def test_setup_carries_path_and_authority(settings: QuicSettings, cert: CertificatePaths) -> None:
    server_side = Recorder()
    client_side = Recorder()

    async def main() -> None:
        async with (
            moqt_server(settings, cert, server_side) as (_, url),
            transport.connect(url, settings, client_side) as connection,
        ):
            assert connection.setup.done()
            await server_side.connection.setup
            peer = server_side.connection.moqt.peer_parameters
            assert peer is not None
            assert peer.path == b"/kv?tenant=a"
            assert peer.authority == url.split("/")[2].encode()
        closed = await server_side.wait_for(SessionClosed)
        assert closed.error_code == SessionErrorCode.NO_ERROR

    run(main)


def test_untrusted_server_is_a_connect_error(
    settings: QuicSettings, cert: CertificatePaths, tmp_path: Path
) -> None:
    other_ca = write_certificate(tmp_path / "other")
    distrustful = QuicSettings.loopback(backend=settings.backend, ca_file=other_ca.cert)

    async def main() -> None:
        async with moqt_server(settings, cert, Recorder()) as (_, url):
            with pytest.raises(transport.MoqtConnectError):
                async with transport.connect(url, distrustful, Recorder()):
                    pass

    run(main)


def test_nobody_listening_is_a_connect_error(settings: QuicSettings) -> None:
    quick = QuicSettings.loopback(backend=settings.backend, idle_timeout=1.0)

    async def main() -> None:
        with pytest.raises(transport.MoqtConnectError):
            async with transport.connect(f"moqt://{HOST}:{free_udp_port()}/", quick, Recorder()):
                pass

    run(main)


def test_goaway_reaches_client_and_shutdown_closes(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    client_side = Recorder()

    async def main() -> None:
        async with (
            moqt_server(settings, cert, Recorder()) as (server, url),
            transport.connect(url, settings, client_side) as connection,
        ):
            await server.shutdown("moqt://elsewhere:4443/kv", grace=0.5)
            assert await connection.goaway == b"moqt://elsewhere:4443/kv"
            closed = await connection.closed
            assert closed.error_code == SessionErrorCode.GOAWAY_TIMEOUT
            assert closed.by_peer

    run(main)


def test_client_that_leaves_after_goaway_is_not_timed_out(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    server_side = Recorder()

    async def main() -> None:
        async with moqt_server(settings, cert, server_side) as (server, url):
            async with transport.connect(url, settings, Recorder()) as connection:
                server.goaway()
                assert await connection.goaway == b""
            closed = await server_side.wait_for(SessionClosed)
            assert closed.error_code == SessionErrorCode.NO_ERROR
            assert not server.connections

    run(main)


def test_drain_bounds_the_send_backlog_and_delivers_every_byte(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    """A producer 16x faster than the backlog limit: drain() holds it, nothing is lost."""
    limit = 1 * MiB
    tight = QuicSettings.loopback(
        backend=settings.backend, ca_file=cert.cert, max_send_backlog=limit
    )
    backend = load_backend(settings.backend)
    data = os.urandom(16 * MiB)
    sink = ByteSink(backend)

    async def main() -> None:
        port = free_udp_port()
        server = await transport.start_server(HOST, port, tight, sink, cert=cert.cert, key=cert.key)
        try:
            async with transport.open_connection(
                HOST, port, tight, lambda _: lambda _: None, server_name="localhost"
            ) as endpoint:
                stream_id = endpoint.quic.get_next_available_stream_id(is_unidirectional=True)
                view = memoryview(data)
                for offset in range(0, len(data), 256 * 1024):
                    endpoint.quic.send_stream_data(
                        stream_id, bytes(view[offset : offset + 256 * 1024])
                    )
                    endpoint.transmit_soon()
                    await endpoint.drain()
                    assert backend.send_backlog(endpoint.quic) <= limit
                endpoint.quic.send_stream_data(stream_id, b"", end_stream=True)
                endpoint.transmit_soon()
                assert await sink.done == len(data)
        finally:
            server.close()
        assert sink.digest.digest() == hashlib.sha256(data).digest()

    run(main, timeout=120)


def test_drain_fails_once_the_connection_is_gone(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    async def main() -> None:
        async with moqt_server(settings, cert, Recorder()) as (_, url):
            tight = QuicSettings.loopback(
                backend=settings.backend, ca_file=cert.cert, max_send_backlog=1
            )
            async with transport.connect(url, tight, Recorder()) as connection:
                stream_id = connection.endpoint.quic.get_next_available_stream_id(
                    is_unidirectional=True
                )
                connection.endpoint.quic.send_stream_data(stream_id, b"x" * 100_000)
                connection.close(SessionErrorCode.INTERNAL_ERROR, "gone")
                with pytest.raises(ConnectionError):
                    await connection.drain()

    run(main)


def test_a_live_peer_that_owes_an_answer_is_not_taken_for_gone(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    """The stall watch calls a peer gone only when it acknowledges nothing: client and server
    each leave the other's SUBSCRIBE unanswered for many stall timeouts, while their QUIC
    stacks ACK the probes, and both sessions stay up (each stack hands datagrams over its own
    way: qh3's client in batches, which must count as hearing from the peer too)."""
    stall = 0.3
    watching = dataclasses.replace(settings, stall_timeout=stall)
    server_side = Recorder()
    client_side = Recorder()
    track = FullTrackName((b"ns",), b"never-answered")

    async def main() -> None:
        async with (
            moqt_server(watching, cert, server_side) as (_, url),
            transport.connect(url, watching, client_side) as client,
        ):
            await server_side.connection.setup
            for side in (server_side.connection, client):
                side.moqt.subscribe(track)
                side.transmit()
            await client_side.wait_for(SubscribeRequested)
            await server_side.wait_for(SubscribeRequested)
            await asyncio.sleep(10 * stall)
            for side in (server_side, client_side):
                assert not side.connection.closed.done(), side.events[-1:]

    run(main)
