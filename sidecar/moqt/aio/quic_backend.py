"""QUIC settings and the three interchangeable QUIC stacks kvmoq runs on.

aioquic is the default (pure Python, the reference for the sans-I/O style);
qh3 is an API-compatible fork with a Rust core, measured 2.3x faster at
1452-byte packets; aiopquic runs picoquic (C) on a thread of its own and needs
Python >= 3.12 (module `pquic`). Everything stack-specific lives here or in
`pquic`, behind `QuicBackend`, so the transport and the session never test
which stack they run on. Each stack is imported only when selected, so any may
be absent.

The defaults are the figures measured on loopback and a 25 GbE link: stock
aioquic windows (1 MiB) and the kernel's UDP receive buffer cap a connection
at 10-20 MB/s.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from sidecar.moqt.protocol.drafts import SPOKEN, Draft, drafts

BackendName = Literal["aioquic", "qh3", "aiopquic"]
BACKENDS: tuple[BackendName, ...] = ("aioquic", "qh3", "aiopquic")

INTERNET_DATAGRAM_SIZE = 1350
"""Fits any real path MTU (1500 minus IPv6/UDP headers and tunnel overhead)."""

LOOPBACK_DATAGRAM_SIZE = 16384
"""Loopback and jumbo-frame paths; ~5x the throughput of 1350 on loopback."""

SELF_SIZED: frozenset[BackendName] = frozenset({"aiopquic"})
"""Stacks that size their packets themselves (picoquic: path MTU discovery, at most 1536
bytes): `max_datagram_size` does not apply to them, and they always run at internet sizes."""

ETHERNET_DATAGRAM_SIZE = 1500
"""Above this only loopback and jumbo-frame paths carry a packet; self-sized stacks never do."""

RELAY_PREFERENCE: dict[bool, tuple[BackendName, ...]] = {
    True: ("aiopquic", "aioquic", "qh3"),
    False: ("aioquic", "qh3"),
}
"""The relay's stacks for internet-size packets (True) and bigger ones, in order of choice,
from `kvmoq bench transport` (docs/benchmarks.md) and interop: at 1350 bytes a relay on
aiopquic moves 2x what one on qh3 does (qh3 clients both) on less than half the CPU per GB,
and qh3 4x aioquic, but a qh3 2.1 server fails the handshakes of picoquic clients (aiomoqt's:
"packet builder capacity exhausted" in its transmit, each setup 4.4 s instead of 0.1, and
half of aiomoqt's interop cases timing out), so a relay takes aioquic before it
(tests/interop/test_aiomoqt_suite.py). At 16 KiB aioquic edges out qh3 (qh3 clients ask for
1472-byte packets, which a qh3 relay then sends them) and aiopquic cannot take such
packets."""

SIDECAR_PREFERENCE: tuple[BackendName, ...] = ("qh3", "aioquic")
"""The sidecar's stacks (Python 3.11, where the CPU torch build is: no aiopquic), fastest
first, from `kvmoq bench transport`: MoQT direct on qh3 moves 3x what aioquic does at
1350-byte packets and 2x at 16 KiB."""

MiB = 1 << 20
DATAGRAM_SIZES = range(1200, 65528)
"""QUIC packet sizes a stack may be set to: RFC 9000 §14 asks for 1200 bytes at least, and a
UDP payload holds 65527 at most."""

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
    drafts: tuple[Draft, ...] = SPOKEN
    """The MoQT drafts offered (client) or accepted (server), newest first: each is an ALPN,
    and TLS settles on one (a server takes the first of its own a client offers)."""
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
        if self.max_datagram_size not in DATAGRAM_SIZES:
            sizes = f"{DATAGRAM_SIZES.start}..{DATAGRAM_SIZES.stop - 1}"
            raise QuicSettingsError(f"max_datagram_size must be {sizes} (RFC 9000 §14)")
        for name in ("max_data", "max_stream_data", "socket_buffer", "max_send_backlog"):
            if getattr(self, name) <= 0:
                raise QuicSettingsError(f"{name} must be positive")
        if self.idle_timeout <= 0:
            raise QuicSettingsError("idle_timeout must be positive")
        if self.stall_timeout is not None and self.stall_timeout <= 0:
            raise QuicSettingsError("stall_timeout must be positive")
        if not self.drafts:
            raise QuicSettingsError("offer at least one MoQT draft")

    @property
    def alpns(self) -> list[str]:
        return [draft.alpn for draft in self.drafts]

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON values, for a process of ours to rebuild (`from_json`):
        drafts by number, paths as text."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        fields["drafts"] = [draft.number for draft in self.drafts]
        fields["ca_file"] = None if self.ca_file is None else str(self.ca_file)
        return fields

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> QuicSettings:
        ca_file = fields.get("ca_file")
        return cls(
            **{
                **fields,
                "drafts": drafts(fields.get("drafts", ())),
                "ca_file": None if ca_file is None else Path(ca_file),
            }
        )

    @classmethod
    def loopback(cls, **overrides: Any) -> QuicSettings:
        """Settings for peers on one host or a jumbo-frame LAN."""
        return cls(max_datagram_size=LOOPBACK_DATAGRAM_SIZE, **overrides)

    @classmethod
    def sidecar_like(cls, **overrides: Any) -> QuicSettings:
        """Settings for a process that stands in for a sidecar (the demo's prefill node, the
        benches' publishers and decoders): the stack a sidecar here runs by default, so
        their figures are a sidecar's."""
        return cls(backend=fastest_sidecar_backend(), **overrides)


@dataclass(frozen=True, slots=True)
class QuicBackend:
    """One QUIC stack: its classes and the few operations that differ between stacks."""

    name: BackendName
    events: ModuleType
    """The stack's `quic.events` module: each stack has its own event classes."""
    connect: Callable[..., Any]
    serve: Callable[..., Any]
    configuration: Callable[..., Any]
    """(settings, *, is_client, server_name=None, cert=None, key=None): a fresh configuration
    of this stack for `settings` in one role."""
    send_backlog: Callable[[Any], int]
    """Bytes queued on a connection that were not yet sent (or, for aioquic, not yet acked)."""
    disable_pacing: Callable[[Any], None]
    QuicConnectionProtocol: type
    """The stack's protocol class: `transport` mixes its endpoint in front of it..."""
    endpoint: type | None = None
    """... unless the stack brings an endpoint class of its own (aiopquic: `pquic`)."""


def configuration_factory(
    config_class: type, own_fields: Callable[[QuicSettings], dict[str, Any]]
) -> Callable[..., Any]:
    """A stack's `QuicBackend.configuration`: the fields every stack names alike, the
    stack's `own_fields`, its certificate and whom it trusts."""

    def configuration(
        settings: QuicSettings,
        *,
        is_client: bool,
        server_name: str | None = None,
        cert: Path | None = None,
        key: Path | None = None,
    ) -> Any:
        config = config_class(
            is_client=is_client,
            alpn_protocols=settings.alpns,
            max_data=settings.max_data,
            max_stream_data=settings.max_stream_data,
            max_datagram_frame_size=settings.max_datagram_frame_size,
            idle_timeout=settings.idle_timeout,
            server_name=server_name,
            **own_fields(settings),
        )
        if cert is not None:
            config.load_cert_chain(str(cert), None if key is None else str(key))
        if is_client:
            if settings.insecure:
                config.verify_mode = ssl.CERT_NONE
            elif settings.ca_file is not None:
                config.load_verify_locations(cafile=str(settings.ca_file))
        return config

    return configuration


def _sans_io_fields(settings: QuicSettings) -> dict[str, Any]:
    """aioquic and qh3 size packets as told; the socket is tuned by `transport`."""
    return {"max_datagram_size": settings.max_datagram_size}


def _aioquic_send_backlog(quic: Any) -> int:
    # aioquic keeps each stream's bytes in `sender._buffer` until they are acked and has no
    # public accessor (1.7); the sum is what the connection holds in memory for the peer.
    return sum(len(stream.sender._buffer) for stream in quic._streams.values())


def _aioquic_disable_pacing(quic: Any) -> None:
    # No configuration switch exists; a pacer that never asks to wait is "pacing off".
    quic._loss._pacer.next_send_time = lambda now: None


def _qh3_send_backlog(quic: Any) -> int:
    return int(quic.get_send_buffer_size())


def _paced_by_the_stack(quic: Any) -> None:
    """qh3's Rust core and picoquic pace internally and cope with uvloop; nothing to turn off."""


def installed(name: BackendName) -> bool:
    """Whether this interpreter has the stack (aiopquic only installs on Python >= 3.12)."""
    return importlib.util.find_spec(name) is not None


def fastest_sidecar_backend() -> BackendName:
    """The sidecar's stack when none is named: the first of `SIDECAR_PREFERENCE` installed."""
    return next(name for name in SIDECAR_PREFERENCE if installed(name))


def fastest_relay_backend(
    max_datagram_size: int, available: Callable[[BackendName], bool] = installed
) -> BackendName:
    """The relay's stack when none is named: the fastest `available` one (default: in this
    interpreter) for packets of `max_datagram_size` bytes (`RELAY_PREFERENCE`); aioquic is
    always installed."""
    internet = max_datagram_size <= ETHERNET_DATAGRAM_SIZE
    return next(name for name in RELAY_PREFERENCE[internet] if available(name))


@cache
def load_backend(name: BackendName) -> QuicBackend:
    """Import and describe one QUIC stack; raises QuicSettingsError if it is not installed."""
    if name not in BACKENDS:
        raise QuicSettingsError(f"unknown QUIC backend {name!r}; choose from {BACKENDS}")
    try:
        asyncio_mod = importlib.import_module(f"{name}.asyncio")
        events_mod = importlib.import_module(f"{name}.quic.events")
        config_class = importlib.import_module(f"{name}.quic.configuration").QuicConfiguration
        pquic = importlib.import_module("sidecar.moqt.aio.pquic") if name == "aiopquic" else None
    except ImportError as exc:
        raise QuicSettingsError(f"QUIC backend {name!r} is not installed: {exc}") from exc
    common = {
        "name": name,
        "events": events_mod,
        "connect": asyncio_mod.connect,
        "serve": asyncio_mod.serve,
        "QuicConnectionProtocol": asyncio_mod.QuicConnectionProtocol,
    }
    if pquic is not None:
        return QuicBackend(
            **common,
            configuration=configuration_factory(config_class, pquic.own_fields),
            send_backlog=pquic.send_backlog,
            disable_pacing=_paced_by_the_stack,
            endpoint=pquic.PquicEndpoint,
        )
    aioquic = name == "aioquic"
    return QuicBackend(
        **common,
        configuration=configuration_factory(config_class, _sans_io_fields),
        send_backlog=_aioquic_send_backlog if aioquic else _qh3_send_backlog,
        disable_pacing=_aioquic_disable_pacing if aioquic else _paced_by_the_stack,
    )


def tune_socket(sock: socket.socket, size: int) -> None:
    """Raise a UDP socket's kernel buffers to `size`, past net.core.*mem_max when allowed."""
    for forced, plain in ((_SO_RCVBUFFORCE, socket.SO_RCVBUF), (_SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, forced, size)
        except OSError:
            # Without CAP_NET_ADMIN the kernel silently caps at net.core.*mem_max.
            sock.setsockopt(socket.SOL_SOCKET, plain, size)
