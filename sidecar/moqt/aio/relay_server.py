"""kvmoq's MoQT relay on asyncio: the thin adapter between ``transport`` and ``relay.core``.

All protocol decisions live in ``relay.core.Relay`` (sans-I/O); this module gives it one
``PeerLink`` per accepted session (backlog, transmit, drain wake-up) and owns the server.

Start it in-process (benchmarks, tests that need no separate process)::

    from sidecar.moqt.aio.quic_backend import QuicSettings
    from sidecar.moqt.aio.relay_server import start_relay

    server = await start_relay(
        "127.0.0.1", 4443, QuicSettings.loopback(), cert=cert_pem, key=key_pem
    )
    ...  # clients connect to server.url ("moqt://127.0.0.1:4443")
    await server.shutdown()

or as a process (``cert.pem`` doubles as the CA file clients trust, see ``kvmoq cert``)::

    kvmoq relay --listen 127.0.0.1:4443 --cert cert.pem --key key.pem --max-datagram-size 16384

which prints ``listening on moqt://127.0.0.1:4443`` on stdout once it accepts sessions and,
on SIGTERM, sends GOAWAY, gives sessions ``--grace`` seconds to leave, then closes.

An edge relay (``upstream=`` here, ``--upstream`` on the command line) also keeps one session
to the relay above it, reconnecting with backoff whenever it is lost; ``core`` decides
what goes up and down that session.

Datagram size: 16384-byte packets (``QuicSettings.loopback()``) only where every peer takes
them: picoquic (under aiomoqt) drops them, and aioquic does not lower its packet size to a
peer's max_udp_payload_size. qh3 clients always advertise 1472, so with qh3 the relay's
traffic to each subscriber (server to client) goes in 1472-byte packets whatever is set;
publisher to relay (client to server) is not capped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..protocol.events import MoqtEvent
from ..relay.auth import Authorizer
from ..relay.core import Relay
from ..relay.records import RelayLimits, RelayPeer
from . import transport
from .peer_link import ConnectionLink
from .quic_backend import QuicSettings

logger = logging.getLogger(__name__)

# Reconnection to the upstream relay: first retry soon, then back off to a slow poll.
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 10.0
WAIT_TIMEOUTS = 3
RESUME_EVERY_S = 1.0
EXPIRY_EVERY_S = 1.0


@dataclass(eq=False)
class RelayServer:
    """A listening relay: ``relay`` holds the state, ``server`` the QUIC endpoint."""

    relay: Relay
    server: transport.MoqtServer
    url: str
    upstream_task: asyncio.Task[None] | None = field(default=None)
    expiry_task: asyncio.Task[None] | None = field(default=None)

    async def shutdown(self, grace: float = 5.0) -> None:
        """GOAWAY to every session, wait up to ``grace`` seconds for them to leave, close."""
        for task in (self.upstream_task, self.expiry_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.server.shutdown(grace=grace)


async def start_relay(
    host: str,
    port: int,
    settings: QuicSettings,
    *,
    cert: Path,
    key: Path,
    limits: RelayLimits | None = None,
    upstream: str | None = None,
    upstream_settings: QuicSettings | None = None,
    authorizer: Authorizer | None = None,
    upstream_token: Callable[[], str | None] = lambda: None,
) -> RelayServer:
    """Listen on host:port (UDP) and relay every session that connects; with ``upstream``
    (a relay's URL, reached with ``upstream_settings``), as an edge of that relay.

    With ``authorizer``, each session must present a token (``auth``) and is held to what it
    grants; ``upstream_token`` gives the token for each (re)connection to the upstream
    relay, read anew each time (a mounted secret rotates)."""
    loop = asyncio.get_running_loop()
    relay = Relay(limits, authorizer, clock=loop.time)
    timers = _Timers(relay)
    numbers = itertools.count(1)

    def on_session(connection: transport.MoqtConnection) -> transport.MoqtEventHandler:
        return _attach(relay, connection, f"session-{next(numbers)}", timers.rearm)[1]

    server = await transport.serve(host, port, settings, on_session, cert=cert, key=key)
    url = f"moqt://{transport.MoqtUrl(host, port, '/').authority}"
    task = None
    if upstream is not None:
        task = asyncio.ensure_future(
            _keep_upstream(relay, upstream, upstream_settings or settings, upstream_token)
        )
    expiry = asyncio.ensure_future(timers.run())
    return RelayServer(relay, server, url, task, expiry)


def _attach(
    relay: Relay,
    connection: transport.MoqtConnection,
    name: str,
    after: Callable[[], None] = lambda: None,
) -> tuple[RelayPeer, transport.MoqtEventHandler]:
    """Make ``connection`` a peer of ``relay``; its events go to the relay from now on
    (and then `after` runs)."""
    peer = ConnectionLink.attach(relay, connection, name)
    assert isinstance(peer, RelayPeer)  # what ``Relay.add_peer`` makes

    def on_event(event: MoqtEvent) -> None:
        relay.handle(peer, event)
        after()

    return peer, on_event


class _Timers:
    """The relay's clocked work: held SUBSCRIBEs when their wait is over (`Relay.tick`,
    to the millisecond: an event that holds a sooner one wakes it), and once a second the
    sessions whose token expired (within a second of its ``exp``) and cached tracks past
    their retention."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self._wake = asyncio.Event()
        self._planned = float("inf")

    def rearm(self) -> None:
        """After an event: wake up sooner if the relay now has earlier work."""
        due = self._relay.next_timer()
        if due is not None and due < self._planned:
            self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        every = loop.time() + EXPIRY_EVERY_S
        while True:
            self._planned = min(every, self._relay.next_timer() or every)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(self._planned):
                    await self._wake.wait()
            self._wake.clear()
            now = loop.time()
            self._relay.tick(now)
            if now >= every:
                self._relay.expire_grants(time.time())
                self._relay.expire_orphans(now)
                every = now + EXPIRY_EVERY_S


async def _keep_upstream(
    relay: Relay, url: str, settings: QuicSettings, token: Callable[[], str | None]
) -> None:
    """Hold a session to the upstream relay; reconnect with backoff whenever it is lost."""
    watch = asyncio.ensure_future(_watch_lost(relay, WAIT_TIMEOUTS * settings.idle_timeout))
    delay = RECONNECT_FIRST_S
    try:
        while True:
            try:
                await _upstream_session(relay, url, settings, token())
                delay = RECONNECT_FIRST_S
            except transport.MoqtConnectError as exc:
                logger.warning(
                    "relay: cannot reach upstream %s (%s); retry in %.1f s", url, exc, delay
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)
    finally:
        watch.cancel()


async def _watch_lost(relay: Relay, window: float) -> None:
    """Subscriptions the upstream relay fed wait for it (``UpstreamState.LOST``): subscribe
    again each second once it is back (the edge with their publisher may announce again
    later than this one reconnects), and end them after ``window`` seconds: long enough for
    a root to restart, short enough that a decoder does not wait on one gone for good."""
    loop = asyncio.get_running_loop()
    since: float | None = None
    while True:
        await asyncio.sleep(RESUME_EVERY_S)
        if not relay.resume_lost():
            since = None
        elif since is None:
            since = loop.time()
        elif loop.time() - since > window:
            relay.give_up_upstream()
            since = None


async def _upstream_session(
    relay: Relay, url: str, settings: QuicSettings, token: str | None
) -> None:
    """One session to the upstream relay, from SETUP until it closes."""
    peers: list[RelayPeer] = []

    def on_session(connection: transport.MoqtConnection) -> transport.MoqtEventHandler:
        peer, handler = _attach(relay, connection, f"upstream {url}")
        peers.append(peer)
        return handler

    async with transport.connect(url, settings, on_session, token=token) as connection:
        relay.attach_upstream(peers[0])
        logger.info("relay: connected to upstream %s (%s)", url, connection.moqt.draft)
        closed = await connection.closed
        logger.warning("relay: lost upstream %s (%s); reconnecting", url, closed.reason)
