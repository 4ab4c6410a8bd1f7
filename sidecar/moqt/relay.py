"""kvmoq's MoQT relay on asyncio: the thin adapter between ``transport`` and ``relay_core``.

All protocol decisions live in ``relay_core.Relay`` (sans-I/O); this module gives it one
``PeerLink`` per accepted session (backlog, transmit, drain wake-up) and owns the server.

Start it in-process (benchmarks, tests that need no separate process)::

    from sidecar.moqt.quic_backend import QuicSettings
    from sidecar.moqt.relay import start_relay

    server = await start_relay(
        "127.0.0.1", 4443, QuicSettings.loopback(), cert=cert_pem, key=key_pem
    )
    ...  # clients connect to server.url ("moqt://127.0.0.1:4443")
    await server.shutdown()

or as a process (``cert.pem`` doubles as the CA file clients trust, see ``kvmoq cert``)::

    kvmoq relay --listen 127.0.0.1:4443 --cert cert.pem --key key.pem --max-datagram-size 16384

which prints ``listening on moqt://127.0.0.1:4443`` on stdout once it accepts sessions and,
on SIGTERM, sends GOAWAY, gives sessions ``--grace`` seconds to leave, then closes.

Datagram size: 16384-byte packets (``QuicSettings.loopback()``) only where every peer takes
them: picoquic (under aiomoqt) drops them, and aioquic does not lower its packet size to a
peer's max_udp_payload_size. qh3 clients always advertise 1472, so with qh3 the relay's
traffic to each subscriber (server to client) goes in 1472-byte packets whatever is set;
publisher to relay (client to server) is not capped.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from pathlib import Path

from . import transport
from .events import MoqtEvent
from .quic_backend import QuicSettings, load_backend
from .relay_core import Peer, Relay, RelayLimits


class _ConnectionLink:
    """A relay peer's connection as ``relay_core`` sees it."""

    def __init__(
        self, connection: transport.MoqtConnection, settings: QuicSettings, relay: Relay
    ) -> None:
        self._connection = connection
        self._send_backlog = load_backend(settings.backend).send_backlog
        self._limit = settings.max_send_backlog
        self._relay = relay
        self._drain_task: asyncio.Task[None] | None = None
        self.peer: Peer | None = None

    def backlogged(self) -> bool:
        return self._send_backlog(self._connection.endpoint.quic) > self._limit

    def transmit(self) -> None:
        self._connection.transmit()

    def wake_when_drained(self) -> None:
        self._drain_task = asyncio.ensure_future(self._resume_after_drain())

    async def _resume_after_drain(self) -> None:
        try:
            await self._connection.drain()
        except ConnectionError:
            return  # the session's SessionClosed event cleans up
        if self.peer is not None:
            self._relay.resume(self.peer)


@dataclass(eq=False)
class RelayServer:
    """A listening relay: ``relay`` holds the state, ``server`` the QUIC endpoint."""

    relay: Relay
    server: transport.MoqtServer
    url: str

    async def shutdown(self, grace: float = 5.0) -> None:
        """GOAWAY to every session, wait up to ``grace`` seconds for them to leave, close."""
        await self.server.shutdown(grace=grace)


async def start_relay(
    host: str,
    port: int,
    settings: QuicSettings,
    *,
    cert: Path,
    key: Path,
    limits: RelayLimits | None = None,
) -> RelayServer:
    """Listen on host:port (UDP) and relay every session that connects."""
    relay = Relay(limits)
    numbers = itertools.count(1)

    def on_session(connection: transport.MoqtConnection) -> transport.MoqtEventHandler:
        link = _ConnectionLink(connection, settings, relay)
        peer = link.peer = relay.add_peer(connection.session, link, f"session-{next(numbers)}")

        def on_event(event: MoqtEvent) -> None:
            relay.handle(peer, event)

        return on_event

    server = await transport.serve(host, port, settings, on_session, cert=cert, key=key)
    url = f"moqt://{transport.MoqtUrl(host, port, '/').authority}"
    return RelayServer(relay, server, url)
