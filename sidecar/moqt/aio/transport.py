"""asyncio glue: tuned QUIC connections for either stack, and MoQT sessions on them.

Two layers, like aioquic's `asyncio/` package under its `H3Connection`:

1. `open_connection` / `start_server`: a QUIC connection on any stack. The
   stacks' own `connect`/`serve` do the socket and connection-ID plumbing; the
   protocol class here adds what they lack for bulk transfer: big socket
   buffers, pacing off, and `drain()`. aioquic and qh3 accept any amount of
   stream data into memory and never push back, so a producer faster than the
   path would grow the send buffer without bound; `drain()` makes it wait.
   (aiopquic, which owns its socket and thread, has its own endpoint class with
   the same interface, in `pquic`.) Whatever sits on top sees only QUIC events,
   through one callback.
2. `connect` / `serve`: a `MoqtConnection` per QUIC connection, which feeds
   every QUIC event to the sans-I/O `MoqtSession` and hands the session's events
   to one application callback. All protocol logic stays in the session; this
   layer only owns time (the session's timers) and the event loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from sidecar.moqt.aio.quic_backend import QuicBackend, QuicSettings, load_backend, tune_socket
from sidecar.moqt.protocol.drafts import by_alpn
from sidecar.moqt.protocol.errors import SessionErrorCode
from sidecar.moqt.protocol.events import GoawayReceived, MoqtEvent, SessionClosed, SetupCompleted
from sidecar.moqt.protocol.session import MoqtSession

_T = TypeVar("_T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (the recommended loop: with pacing off it is the fastest measured)."""
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """asyncio.run on the recommended loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


QuicEventHandler = Callable[[Any], None]
"""Receives every QUIC event of one connection, in order."""


class QuicEndpoint(Protocol):
    """What the layers above use of a connection; the concrete class depends on the stack."""

    @property
    def quic(self) -> Any: ...
    @property
    def closing(self) -> bool: ...
    @property
    def last_received(self) -> float: ...
    def transmit(self) -> None: ...
    def transmit_soon(self) -> None: ...
    async def drain(self) -> None: ...
    async def wait_closed(self) -> None: ...
    @property
    def closed(self) -> bool: ...


Attach = Callable[[QuicEndpoint], QuicEventHandler]
"""Called once per new connection, before any event; returns that connection's event handler."""


class _EndpointMixin:
    """Mixed in front of a stack's QuicConnectionProtocol (see `_protocol_class`)."""

    _quic: Any
    _loop: asyncio.AbstractEventLoop
    _transmit_task: asyncio.Handle | None
    _backend: QuicBackend  # set on the class by `_protocol_class`

    def __init__(
        self, quic: Any, stream_handler: Any = None, *, settings: QuicSettings, attach: Attach
    ) -> None:
        super().__init__(quic, stream_handler)  # type: ignore[call-arg]
        self._settings = settings
        self._drain_waiter: asyncio.Future[None] | None = None
        self._terminated = False
        self._last_received = self._loop.time()
        if not settings.pacing:
            self._backend.disable_pacing(quic)
        self._on_event = attach(self)  # type: ignore[arg-type]

    # The stack calls these.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A server's connections share its socket; re-tuning it per connection is idempotent.
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_socket(sock, self._settings.socket_buffer)
        super().connection_made(transport)  # type: ignore[misc]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        # The stacks transmit after every datagram; at loopback rates several arrive per
        # loop iteration, and one transmit (ACKs, more data) after all of them is enough.
        self._last_received = now = self._loop.time()
        self._quic.receive_datagram(data, addr, now=now)
        self._process_events()  # type: ignore[attr-defined]
        self.transmit_soon()

    def datagrams_received(self, data: list[bytes], addr: Any) -> None:
        """qh3's own UDP transport hands over a batch here instead (its clients; aioquic's
        asyncio transport never calls this): the same, once per batch. Without it a qh3
        client never counted as hearing from its peer, and the stall watch dropped it."""
        self._last_received = now = self._loop.time()
        self._quic.receive_many_datagrams(data, addr, now=now)
        self._process_events()  # type: ignore[attr-defined]
        self.transmit_soon()

    def quic_event_received(self, event: Any) -> None:
        # Replaces the stack's StreamReader plumbing entirely: the handler owns all streams.
        if isinstance(event, self._backend.events.ConnectionTerminated):
            self._terminated = True
            self._wake_writer(ConnectionError("QUIC connection closed"))
        self._on_event(event)

    def transmit(self) -> None:
        super().transmit()  # type: ignore[misc]
        if self._drain_waiter is not None and not self.backlogged():
            self._wake_writer(None)

    # The layers above call these.

    @property
    def closed(self) -> bool:
        return self._terminated

    @property
    def closing(self) -> bool:
        """Either side closed: writes are futile from here (qh3 even raises on them)."""
        # Both stacks set `_close_event` on the first CONNECTION_CLOSE, sent or received,
        # while ConnectionTerminated waits out the draining period.
        return self._terminated or self._quic._close_event is not None

    @property
    def last_received(self) -> float:
        """Loop time of the last datagram from the peer (an ACK of our PING counts)."""
        return self._last_received

    @property
    def quic(self) -> Any:
        """The stack's sans-I/O QuicConnection (write into it, then `transmit_soon`)."""
        return self._quic

    def transmit_soon(self) -> None:
        """Send what was written, once per loop iteration however many writes came before."""
        if self._transmit_task is None:
            self._transmit_task = self._loop.call_soon(self.transmit)

    async def drain(self) -> None:
        """Wait until the connection's unsent backlog is under `max_send_backlog`.

        Always yields to the loop at least once, so that a producer that never has to wait
        still lets transmissions and ACK processing interleave with its writes.
        """
        await asyncio.sleep(0)
        while True:
            if self.closing:
                raise ConnectionError("QUIC connection closed")
            if not self.backlogged():
                return
            if self._drain_waiter is None:
                self._drain_waiter = self._loop.create_future()
            await asyncio.shield(self._drain_waiter)

    def backlogged(self) -> bool:
        """Whether more than `max_send_backlog` bytes wait to be sent."""
        return self._backend.send_backlog(self._quic) > self._settings.max_send_backlog

    def _wake_writer(self, exc: Exception | None) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is None or waiter.done():
            return
        if exc is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(exc)


@cache
def _protocol_class(backend: QuicBackend) -> type:
    if backend.endpoint is not None:
        return backend.endpoint
    return type(
        f"{backend.name.capitalize()}Endpoint",
        (_EndpointMixin, backend.QuicConnectionProtocol),
        {
            "__doc__": f"A tuned {backend.name} connection (see sidecar.moqt.aio.transport).",
            "_backend": backend,
        },
    )


def _protocol_factory(settings: QuicSettings, attach: Attach) -> Callable[..., Any]:
    cls = _protocol_class(load_backend(settings.backend))

    def create(quic: Any, stream_handler: Any = None) -> Any:
        return cls(quic, stream_handler, settings=settings, attach=attach)

    return create


@asynccontextmanager
async def open_connection(
    host: str, port: int, settings: QuicSettings, attach: Attach, *, server_name: str | None = None
) -> AsyncIterator[QuicEndpoint]:
    """Connect and complete the QUIC handshake; closes the connection on exit."""
    backend = load_backend(settings.backend)
    config = backend.configuration(settings, is_client=True, server_name=server_name or host)
    async with backend.connect(
        host, port, configuration=config, create_protocol=_protocol_factory(settings, attach)
    ) as endpoint:
        yield endpoint


async def start_server(
    host: str, port: int, settings: QuicSettings, attach: Attach, *, cert: Path, key: Path
) -> Any:
    """Listen for QUIC connections; returns the stack's server (call `.close()` to stop)."""
    backend = load_backend(settings.backend)
    config = backend.configuration(settings, is_client=False, cert=cert, key=key)
    return await backend.serve(
        host, port, configuration=config, create_protocol=_protocol_factory(settings, attach)
    )


# MoQT sessions --------------------------------------------------------------------------

MoqtEventHandler = Callable[[MoqtEvent], None]
OnSession = Callable[["MoqtConnection"], MoqtEventHandler]
"""Called once per MoQT session as soon as its QUIC handshake completes (before SETUP is
answered); returns the callback that receives that session's events."""

SETUP_TIMEOUT = 10.0
TICK_INTERVAL = 0.25
"""How often the session's timeouts are checked. They are seconds long (late streams, drained
subscriptions), and a fixed tick avoids recomputing `next_timer()` after every event."""
KEEPALIVE_INTERVAL = 5.0
"""Longest QUIC PING period: a publisher whose prompt nobody loads for a while must not idle
out of the relay (QUIC sends nothing on its own)."""


STALL_PINGS = 3
"""PINGs a waiting session sends into silence before it calls the peer gone: one lost
packet, or one slow loop iteration on either side, is not a dead peer."""


def keepalive_interval(idle_timeout: float, stall_timeout: float | None = None) -> float:
    """PINGs often enough that a shorter idle timeout (a sidecar's --relay-timeout, an edge's
    --upstream-timeout) only fires when the peer is really gone: three per timeout; with a
    stall timeout, one per stall timeout, so that a quiet session notices a dead peer in
    about two of them (a prefill sidecar must announce its prompts again soon after its
    relay restarts)."""
    return min(KEEPALIVE_INTERVAL, idle_timeout / 3, stall_timeout or math.inf)


MAX_URL_LENGTH = 8192


class MoqtConnectError(ConnectionError):
    """The QUIC or MoQT handshake failed, or the URL cannot name a MoQT server.

    ``error_code``: the session error code when the peer closed the session during SETUP
    (a relay refusing the token: UNAUTHORIZED, EXPIRED_AUTH_TOKEN, ...), else None.
    """

    def __init__(self, message: str, error_code: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
class MoqtUrl:
    """A raw-QUIC MoQT URL: moqt://host:port/path?query (draft-14 has no default port)."""

    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> MoqtUrl:
        if len(url) > MAX_URL_LENGTH:
            raise MoqtConnectError(f"URL longer than {MAX_URL_LENGTH} characters")
        parts = urlsplit(url)
        if parts.scheme != "moqt":
            raise MoqtConnectError(f"not a moqt:// URL: {url!r}")
        try:
            port = parts.port
        except ValueError as exc:
            raise MoqtConnectError(f"bad port in {url!r}") from exc
        if not parts.hostname or port is None:
            raise MoqtConnectError(f"a moqt URL needs a host and a port: {url!r}")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.hostname, port, path)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class MoqtConnection:
    """One MoQT session on one QUIC connection: the session plus the clock and the loop.

    Use `moqt` (the sans-I/O session) to issue requests, answers and objects, then call
    `transmit()`; after writing objects, `await drain()` so the producer never outruns the path.
    """

    def __init__(
        self,
        endpoint: QuicEndpoint,
        session: MoqtSession,
        on_session: OnSession,
        loop: asyncio.AbstractEventLoop,
        keepalive: float,
        stall_timeout: float | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.moqt = session
        self._loop = loop
        self.setup: asyncio.Future[SetupCompleted] = loop.create_future()
        self.closed: asyncio.Future[SessionClosed] = loop.create_future()
        self.goaway: asyncio.Future[bytes] = loop.create_future()
        self._tick = loop.call_later(TICK_INTERVAL, self._on_tick)
        self._keepalive = keepalive
        self._next_ping = loop.time() + keepalive
        self._stall = _StallWatch(stall_timeout) if stall_timeout is not None else None
        self._on_event = on_session(self)

    def transmit(self) -> None:
        """Send what the session wrote, coalesced per loop iteration."""
        self.endpoint.transmit_soon()

    async def drain(self) -> None:
        """Wait until the send backlog is under the limit; ConnectionError once closed."""
        await self.endpoint.drain()

    def backlogged(self) -> bool:
        return self.endpoint.backlogged()

    @property
    def closing(self) -> bool:
        """Either side closed the connection; nothing more can be sent."""
        return self.endpoint.closing

    def close(self, error_code: int = SessionErrorCode.NO_ERROR, reason: str = "") -> None:
        """Close the session (and its QUIC connection) with a MoQT session error code."""
        self.moqt.close(error_code, reason)
        self.endpoint.transmit()
        # The session reports SessionClosed only for closes it did not ask for.
        if not self.closed.done():
            self._dispatch(SessionClosed(error_code, reason, by_peer=False))

    async def wait_closed(self) -> None:
        await self.endpoint.wait_closed()

    def handle_quic_event(self, event: Any) -> None:
        for moqt_event in self.moqt.handle_event(event, self._loop.time()):
            self._dispatch(moqt_event)

    def _dispatch(self, event: MoqtEvent) -> None:
        if isinstance(event, SetupCompleted) and not self.setup.done():
            self.setup.set_result(event)
        elif isinstance(event, GoawayReceived) and not self.goaway.done():
            self.goaway.set_result(event.new_session_uri)
        elif isinstance(event, SessionClosed):
            self._tick.cancel()
            if not self.setup.done():
                refused = MoqtConnectError(f"session closed: {event.reason}", event.error_code)
                self.setup.set_exception(refused)
            if not self.closed.done():
                self.closed.set_result(event)
        self._on_event(event)

    def _on_tick(self) -> None:
        now = self._loop.time()
        self.moqt.tick(now)
        if not self.closing:
            stall = self._stall
            heard = self.endpoint.last_received
            if stall is not None and stall.gone(now, heard, self.moqt.awaiting(), self._ping):
                self.close(SessionErrorCode.NO_ERROR, "the peer stopped answering")
                return
            if now >= self._next_ping:
                self._ping(now)
        self.transmit()
        if not self.endpoint.closed:
            self._tick = self._loop.call_later(TICK_INTERVAL, self._on_tick)

    def _ping(self, now: float) -> None:
        self.endpoint.quic.send_ping(0)
        self._next_ping = now + self._keepalive
        if self._stall is not None:
            self._stall.pinged_at = now


@dataclass(slots=True)
class _StallWatch:
    """Tells a dead peer from a quiet one in about `timeout` seconds, not the idle timeout.

    QUIC notices a dead peer only when the idle timeout passes (10 s or more: a quiet peer
    must not be dropped). But a live QUIC stack ACKs a PING within a round trip whatever its
    application is doing, so a peer that owes us something (an answer or data the session
    waits for, or the ACK of our keepalive PING) and has sent nothing for a tick is probed:
    every tick sends a PING, and `STALL_PINGS` of them unanswered over `timeout` seconds end
    the session. Anything heard ends the probe.
    """

    timeout: float
    pinged_at: float = -math.inf
    """When our last PING (keepalive or probe) went out."""
    probing_since: float = 0.0
    unanswered: int = 0

    def gone(self, now: float, heard: float, awaiting: bool, ping: Callable[[float], None]) -> bool:
        if heard > self.pinged_at:
            self.unanswered = 0  # every PING so far is answered
        owed = awaiting or heard < self.pinged_at
        if not owed or now - heard < TICK_INTERVAL:
            self.unanswered = 0
            return False
        if self.unanswered == 0:
            self.probing_since = now  # a tick into the silence
        elif self.unanswered >= STALL_PINGS and now - self.probing_since >= (
            self.timeout - TICK_INTERVAL
        ):
            return True
        ping(now)
        self.unanswered += 1
        return False


def _moqt_attach(
    settings: QuicSettings,
    on_session: OnSession,
    *,
    url: MoqtUrl | None = None,
    token: str | None = None,
) -> Attach:
    """Per QUIC connection: create the MoQT session once the handshake completes."""
    handshake_completed = load_backend(settings.backend).events.HandshakeCompleted

    def attach(endpoint: QuicEndpoint) -> QuicEventHandler:
        loop = asyncio.get_running_loop()
        connection: MoqtConnection | None = None

        def on_event(event: Any) -> None:
            nonlocal connection
            if connection is not None:
                connection.handle_quic_event(event)
            elif isinstance(event, handshake_completed):
                # Only TLS-level events come earlier, and a client may not open its
                # control stream before the handshake anyway.
                draft = by_alpn(event.alpn_protocol, settings.drafts)
                if draft is None:  # a stack that let the handshake finish without one
                    endpoint.quic.close(
                        error_code=SessionErrorCode.VERSION_NEGOTIATION_FAILED,
                        reason_phrase=f"no MoQT draft agreed (ALPN {event.alpn_protocol!r})",
                    )
                    endpoint.transmit()
                    return
                session = MoqtSession(
                    endpoint.quic,
                    is_client=url is not None,
                    path=url.path.encode() if url else None,
                    authority=url.authority.encode() if url else None,
                    authorization=None if token is None else token.encode(),
                    now=loop.time(),
                    draft=draft,
                )
                keepalive = keepalive_interval(settings.idle_timeout, settings.stall_timeout)
                connection = MoqtConnection(
                    endpoint, session, on_session, loop, keepalive, settings.stall_timeout
                )
                connection.transmit()

        return on_event

    return attach


@asynccontextmanager
async def connect(
    url: str, settings: QuicSettings, on_session: OnSession, *, token: str | None = None
) -> AsyncIterator[MoqtConnection]:
    """Open a MoQT session to `url` and wait for SETUP; closes it on exit. `token` (a JWT
    for a relay that checks them) goes in CLIENT_SETUP's AUTHORIZATION_TOKEN."""
    target = MoqtUrl.parse(url)
    created: list[MoqtConnection] = []

    def remember(connection: MoqtConnection) -> MoqtEventHandler:
        created.append(connection)
        return on_session(connection)

    attach = _moqt_attach(settings, remember, url=target, token=token)
    async with AsyncExitStack() as stack:
        try:
            endpoint = await stack.enter_async_context(
                open_connection(target.host, target.port, settings, attach)
            )
            if not created:
                raise MoqtConnectError("QUIC connected without completing the handshake")
            await asyncio.wait_for(asyncio.shield(created[0].setup), SETUP_TIMEOUT)
        except (ConnectionError, TimeoutError) as exc:
            code = exc.error_code if isinstance(exc, MoqtConnectError) else None
            message = f"cannot open a MoQT session to {url}: {exc}"
            raise MoqtConnectError(message, code) from exc
        connection = created[0]
        try:
            yield connection
        finally:
            if not endpoint.closed:
                connection.close()


class MoqtServer:
    """A listening MoQT endpoint: every accepted session goes to `on_session`."""

    def __init__(self, quic_server: Any, connections: set[MoqtConnection]) -> None:
        self._quic_server = quic_server
        self._connections = connections

    @property
    def connections(self) -> set[MoqtConnection]:
        """The sessions still open (closed ones are forgotten as soon as they close)."""
        self._connections.difference_update([c for c in self._connections if c.closed.done()])
        return set(self._connections)

    def goaway(self, new_session_uri: str = "") -> None:
        """Ask every client to move (draft-14 §GOAWAY); they close when they are done."""
        for connection in self.connections:
            if connection.closing:
                continue  # writing to it raises on qh3, and it is leaving anyway
            connection.moqt.goaway(new_session_uri.encode())
            connection.transmit()

    async def shutdown(self, new_session_uri: str = "", grace: float = 5.0) -> None:
        """GOAWAY, wait up to `grace` seconds for clients to leave, close the rest, stop."""
        self.goaway(new_session_uri)
        waiting = [asyncio.ensure_future(c.wait_closed()) for c in self.connections]
        if waiting:
            _, pending = await asyncio.wait(waiting, timeout=grace)
            for future in pending:
                future.cancel()
        for connection in self.connections:
            connection.close(SessionErrorCode.GOAWAY_TIMEOUT, "server shutting down")
        self.close()

    def close(self) -> None:
        self._quic_server.close()


async def serve(
    host: str,
    port: int,
    settings: QuicSettings,
    on_session: OnSession,
    *,
    cert: Path,
    key: Path,
) -> MoqtServer:
    """Accept MoQT sessions on host:port (UDP) with the given certificate chain and key."""
    connections: set[MoqtConnection] = set()

    def track(connection: MoqtConnection) -> MoqtEventHandler:
        connections.add(connection)
        return on_session(connection)

    quic_server = await start_server(
        host, port, settings, _moqt_attach(settings, track), cert=cert, key=key
    )
    return MoqtServer(quic_server, connections)
