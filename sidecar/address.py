"""`HOST:PORT` addresses as the commands take them, parsed in one place.

A module of its own that imports nothing heavy, because `kvmoq relay` parses its `--listen` at
argument time and must not pay for `sidecar.service.config`, which imports torch.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

Address = tuple[str, int]

EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Where Linux says which ports it hands to sockets bound to port 0 (every outgoing
connection's)."""
LOWEST_PICKED_PORT = 10000
PICK_ATTEMPTS = 64
_picks = random.Random()  # its own generator: a test that seeds `random` must not pick ours


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port on `host` that was free a moment ago (the kernel's pick), for a server
    started as another process, which must be told its port."""
    return _free_port(host, socket.SOCK_DGRAM)


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """As `free_udp_port`, for a TCP server (gRPC, HTTP probes)."""
    return _free_port(host, socket.SOCK_STREAM)


def _free_port(host: str, kind: socket.SocketKind) -> int:
    """A port below the kernel's ephemeral range where it has one: a port the kernel picked
    there may be handed to another process's outgoing connection (a QUIC client's UDP
    socket) before the server that was told it binds it, and that server then fails to
    start. Below the range only other servers bind, and they pick at random as well."""
    with socket.socket(socket.AF_INET, kind) as probe:
        below = range(LOWEST_PICKED_PORT, _ephemeral_low())
        for port in _picks.sample(below, min(PICK_ATTEMPTS, len(below))):
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest ephemeral port (Linux's default range starts at 32768); where it is
    unknown, `LOWEST_PICKED_PORT`, and the kernel picks."""
    try:
        return int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LOWEST_PICKED_PORT


def parse_address(text: str) -> Address:
    """`HOST:PORT`, `[V6]:PORT` or `V6:PORT` as `(host, port)`; port 0 is allowed (any port).

    Raises `ValueError` naming the text for anything else.
    """
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def format_address(address: Address) -> str:
    """The inverse of `parse_address`: an IPv6 host goes in brackets."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
