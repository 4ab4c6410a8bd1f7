"""Ports picked for servers started as other processes (`sidecar.address`)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sidecar import address
from sidecar.address import free_tcp_port, free_udp_port


def ephemeral_range() -> tuple[int, int]:
    low, high = address.EPHEMERAL_PORTS.read_text().split()
    return int(low), int(high)


@pytest.mark.parametrize("pick, kind", [(free_udp_port, socket.SOCK_DGRAM),
                                        (free_tcp_port, socket.SOCK_STREAM)])  # fmt: skip
def test_a_picked_port_binds_and_is_none_the_kernel_gives_clients(pick, kind) -> None:
    """Client sockets (port 0) get ports in the ephemeral range; a server's picked port lies
    below it, so an outgoing connection never takes it before the server binds it."""
    low, _ = ephemeral_range()
    clients = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(32)]
    try:
        for client in clients:
            client.bind(("127.0.0.1", 0))
        taken = {client.getsockname()[1] for client in clients}
        picked = [pick() for _ in range(32)]
        assert all(address.LOWEST_PICKED_PORT <= port < low for port in picked), picked
        assert not taken & set(picked)
        with socket.socket(socket.AF_INET, kind) as server:
            server.bind(("127.0.0.1", picked[0]))
    finally:
        for client in clients:
            client.close()


def test_without_the_kernels_range_the_kernel_picks(monkeypatch, tmp_path: Path) -> None:
    low, high = ephemeral_range()
    monkeypatch.setattr(address, "EPHEMERAL_PORTS", tmp_path / "absent")
    port = free_udp_port()
    assert low <= port <= high
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", port))
