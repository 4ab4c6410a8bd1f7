"""`HOST:PORT` addresses as the commands take them, parsed in one place.

A module of its own that imports nothing heavy, because `kvmoq relay` parses its `--listen` at
argument time and must not pay for `sidecar.service.config`, which imports torch.
"""

from __future__ import annotations

import socket

Address = tuple[str, int]


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port on `host` that was free a moment ago (the kernel's pick), for a server
    started as another process, which must be told its port."""
    return _free_port(host, socket.SOCK_DGRAM)


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """As `free_udp_port`, for a TCP server (gRPC, HTTP probes)."""
    return _free_port(host, socket.SOCK_STREAM)


def _free_port(host: str, kind: socket.SocketKind) -> int:
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


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
