"""asyncio glue: tuned QUIC connections for either stack, and MoQT sessions on them.

Two layers, as in aioquic's `asyncio/` package. First a tuned QUIC connection
with send backpressure, for either stack:

The stacks' own `connect`/`serve` do the socket and connection-ID plumbing; the
protocol class here adds what they lack for bulk transfer: big socket buffers,
pacing off, and `drain()`. aioquic and qh3 accept any amount of stream data
into memory and never push back, so a producer faster than the path would grow
the send buffer without bound; `drain()` makes it wait instead.

Whatever sits on top (the MoQT session, or a bare byte counter in the
benchmark) sees only QUIC events, through one callback per connection.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sidecar.moqt.quic_backend import QuicBackend, QuicSettings, load_backend, tune_socket

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

    _quic: Any

    def transmit(self) -> None: ...
    def transmit_soon(self) -> None: ...
    async def drain(self) -> None: ...
    def close_with(self, error_code: int, reason: str) -> None: ...
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

    def __init__(
        self,
        quic: Any,
        stream_handler: Any = None,
        *,
        backend: QuicBackend,
        settings: QuicSettings,
        attach: Attach,
    ) -> None:
        super().__init__(quic, stream_handler)  # type: ignore[call-arg]
        self._backend = backend
        self._settings = settings
        self._drain_waiter: asyncio.Future[None] | None = None
        self._terminated = False
        if not settings.pacing:
            backend.disable_pacing(quic)
        self._on_event = attach(self)  # type: ignore[arg-type]

    # The stack calls these.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A server's connections share its socket; re-tuning it per connection is idempotent.
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_socket(sock, self._settings.socket_buffer)
        super().connection_made(transport)  # type: ignore[misc]

    def quic_event_received(self, event: Any) -> None:
        # Replaces the stack's StreamReader plumbing entirely: the handler owns all streams.
        if isinstance(event, self._backend.events.ConnectionTerminated):
            self._terminated = True
            self._wake_writer(ConnectionError("QUIC connection closed"))
        self._on_event(event)

    def transmit(self) -> None:
        super().transmit()  # type: ignore[misc]
        if self._drain_waiter is not None and not self._backlogged():
            self._wake_writer(None)

    # The layers above call these.

    @property
    def closed(self) -> bool:
        return self._terminated

    def transmit_soon(self) -> None:
        """Send what was written, once per loop iteration however many writes came before."""
        if self._transmit_task is None:
            self._transmit_task = self._loop.call_soon(self.transmit)

    async def drain(self) -> None:
        """Wait until the connection's unsent backlog is under `max_send_backlog`."""
        while self._backlogged():
            if self._terminated:
                raise ConnectionError("QUIC connection closed")
            if self._drain_waiter is None:
                self._drain_waiter = self._loop.create_future()
            await asyncio.shield(self._drain_waiter)

    def close_with(self, error_code: int, reason: str) -> None:
        """Close with an application error code (CONNECTION_CLOSE 0x1d)."""
        self._quic.close(error_code=error_code, reason_phrase=reason)
        self.transmit()

    def _backlogged(self) -> bool:
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
    return type(
        f"{backend.name.capitalize()}Endpoint",
        (_EndpointMixin, backend.QuicConnectionProtocol),
        {"__doc__": f"A tuned {backend.name} connection (see quic_endpoint)."},
    )


def _protocol_factory(settings: QuicSettings, attach: Attach) -> Callable[..., Any]:
    backend = load_backend(settings.backend)
    cls = _protocol_class(backend)

    def create(quic: Any, stream_handler: Any = None) -> Any:
        return cls(quic, stream_handler, backend=backend, settings=settings, attach=attach)

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
