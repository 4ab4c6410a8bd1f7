"""QUIC settings and the two interchangeable QUIC stacks kvmoq runs on.

aioquic is the default (pure Python, the reference for the sans-I/O style);
qh3 is an API-compatible fork with a Rust core, measured 2.3x faster at
1452-byte packets. Everything stack-specific lives here, behind `QuicBackend`,
so the transport and the session never test which stack they run on. Each
stack is imported only when selected, so either may be absent.

The defaults are the figures measured on loopback and a 25 GbE link: stock
aioquic windows (1 MiB) and the kernel's UDP receive buffer cap a connection
at 10-20 MB/s.
"""

from __future__ import annotations

import importlib
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

BackendName = Literal["aioquic", "qh3"]
BACKENDS: tuple[BackendName, ...] = ("aioquic", "qh3")

ALPN = "moq-00"
"""Raw-QUIC MoQT ALPN for drafts 07 to 14 (the version itself is negotiated in SETUP)."""

INTERNET_DATAGRAM_SIZE = 1350
"""Fits any real path MTU (1500 minus IPv6/UDP headers and tunnel overhead)."""

LOOPBACK_DATAGRAM_SIZE = 16384
"""Loopback and jumbo-frame paths; ~5x the throughput of 1350 on loopback."""

MiB = 1 << 20

# Linux lets CAP_NET_ADMIN raise a socket buffer above net.core.[rw]mem_max;
# Python's socket module has no names for these options.
_SO_SNDBUFFORCE = 32
_SO_RCVBUFFORCE = 33


class QuicSettingsError(ValueError):
    """Settings that no QUIC stack would accept (caught before any socket opens)."""


@dataclass(frozen=True, slots=True)
class QuicSettings:
    """Everything kvmoq tunes on a QUIC connection, for either stack and either role."""

    backend: BackendName = "aioquic"
    alpn: str = ALPN
    max_datagram_size: int = INTERNET_DATAGRAM_SIZE
    # Flow-control windows: the best measured here; smaller ones stall a 64 KiB-object stream.
    max_data: int = 64 * MiB
    max_stream_data: int = 16 * MiB
    # The default UDP receive buffer (208 KiB) drops bursts at loopback speed.
    socket_buffer: int = 32 * MiB
    # Bytes written but not yet sent (per connection) before writers must await drain().
    max_send_backlog: int = 8 * MiB
    # RFC 9221 DATAGRAM: the draft requires it negotiated; objects this small only.
    max_datagram_frame_size: int | None = 65535
    idle_timeout: float = 30.0
    # While the session waits on the peer (a request unanswered, a stream to come), a peer
    # that acknowledges nothing this long although pinged is gone (MoqtConnection): seconds
    # instead of the idle timeout. None: only the idle timeout.
    stall_timeout: float | None = None
    # The CA to trust; None means the system store. cert.pem from `kvmoq cert` works here.
    ca_file: Path | None = None
    # Skip certificate verification; only for peers in tests that present no usable cert.
    insecure: bool = False
    # aioquic's pacer with uvloop schedules ~1 ms timers it then misses: throughput collapses.
    pacing: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise QuicSettingsError(
                f"unknown QUIC backend {self.backend!r}; choose from {BACKENDS}"
            )
        if not 1200 <= self.max_datagram_size <= 65527:
            raise QuicSettingsError("max_datagram_size must be 1200..65527 (RFC 9000 §14)")
        for name in ("max_data", "max_stream_data", "socket_buffer", "max_send_backlog"):
            if getattr(self, name) <= 0:
                raise QuicSettingsError(f"{name} must be positive")
        if self.idle_timeout <= 0:
            raise QuicSettingsError("idle_timeout must be positive")
        if self.stall_timeout is not None and self.stall_timeout <= 0:
            raise QuicSettingsError("stall_timeout must be positive")

    @classmethod
    def loopback(cls, **overrides: Any) -> QuicSettings:
        """Settings for peers on one host or a jumbo-frame LAN."""
        return cls(max_datagram_size=LOOPBACK_DATAGRAM_SIZE, **overrides)


@dataclass(frozen=True, slots=True)
class QuicBackend:
    """One QUIC stack: its classes and the few operations that differ between stacks."""

    name: BackendName
    QuicConfiguration: type
    QuicConnection: type
    QuicConnectionProtocol: type
    events: ModuleType
    """The stack's `quic.events` module: each stack has its own event classes."""
    connect: Callable[..., Any]
    serve: Callable[..., Any]
    send_backlog: Callable[[Any], int]
    """Bytes queued on a connection that were not yet sent (or, for aioquic, not yet acked)."""
    disable_pacing: Callable[[Any], None]

    def configuration(
        self,
        settings: QuicSettings,
        *,
        is_client: bool,
        server_name: str | None = None,
        cert: Path | None = None,
        key: Path | None = None,
    ) -> Any:
        """A fresh QuicConfiguration of this stack for `settings` in one role."""
        config = self.QuicConfiguration(
            is_client=is_client,
            alpn_protocols=[settings.alpn],
            max_datagram_size=settings.max_datagram_size,
            max_data=settings.max_data,
            max_stream_data=settings.max_stream_data,
            max_datagram_frame_size=settings.max_datagram_frame_size,
            idle_timeout=settings.idle_timeout,
            server_name=server_name,
        )
        if cert is not None:
            config.load_cert_chain(cert, key)
        if is_client:
            if settings.insecure:
                config.verify_mode = ssl.CERT_NONE
            elif settings.ca_file is not None:
                config.load_verify_locations(cafile=str(settings.ca_file))
        return config


def _aioquic_send_backlog(quic: Any) -> int:
    # aioquic keeps each stream's bytes in `sender._buffer` until they are acked and has no
    # public accessor (1.7); the sum is what the connection holds in memory for the peer.
    return sum(len(stream.sender._buffer) for stream in quic._streams.values())


def _aioquic_disable_pacing(quic: Any) -> None:
    # No configuration switch exists; a pacer that never asks to wait is "pacing off".
    quic._loss._pacer.next_send_time = lambda now: None


def _qh3_send_backlog(quic: Any) -> int:
    return int(quic.get_send_buffer_size())


def _qh3_disable_pacing(quic: Any) -> None:
    """qh3's Rust core paces internally and copes with uvloop; nothing to turn off."""


@cache
def load_backend(name: BackendName) -> QuicBackend:
    """Import and describe one QUIC stack; raises QuicSettingsError if it is not installed."""
    if name not in BACKENDS:
        raise QuicSettingsError(f"unknown QUIC backend {name!r}; choose from {BACKENDS}")
    try:
        config_mod = importlib.import_module(f"{name}.quic.configuration")
        conn_mod = importlib.import_module(f"{name}.quic.connection")
        asyncio_mod = importlib.import_module(f"{name}.asyncio")
        events_mod = importlib.import_module(f"{name}.quic.events")
    except ImportError as exc:
        raise QuicSettingsError(f"QUIC backend {name!r} is not installed: {exc}") from exc
    aioquic = name == "aioquic"
    return QuicBackend(
        name=name,
        QuicConfiguration=config_mod.QuicConfiguration,
        QuicConnection=conn_mod.QuicConnection,
        QuicConnectionProtocol=asyncio_mod.QuicConnectionProtocol,
        events=events_mod,
        connect=asyncio_mod.connect,
        serve=asyncio_mod.serve,
        send_backlog=_aioquic_send_backlog if aioquic else _qh3_send_backlog,
        disable_pacing=_aioquic_disable_pacing if aioquic else _qh3_disable_pacing,
    )


def tune_socket(sock: socket.socket, size: int) -> None:
    """Raise a UDP socket's kernel buffers to `size`, past net.core.*mem_max when allowed."""
    for forced, plain in ((_SO_RCVBUFFORCE, socket.SO_RCVBUF), (_SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, forced, size)
        except OSError:
            # Without CAP_NET_ADMIN the kernel silently caps at net.core.*mem_max.
            sock.setsockopt(socket.SOL_SOCKET, plain, size)
