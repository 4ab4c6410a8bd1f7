"""Fixtures that run independent MoQT peers (moq-rs, aiomoqt) for interop tests.

    def test_x(start_peer):
        relay = start_peer("moqrs", "relay")
        relay.wait_ready()
        start_peer("aiomoqt", "pub", url=relay.url, namespace="kvtest/ns", track="t0").wait_ready()
        sub = start_peer("moqrs", "sub", url=relay.url, namespace="kvtest/ns", track="t0")
        sub.expect_success(timeout=30)
        assert sub.results() == ...

Every peer started through `start_peer` is stopped at teardown, and its log is printed
there, so pytest shows it under "Captured stdout teardown" when the test fails.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sidecar.address import free_udp_port
from tests.interop.certs import Certs, make_certs
from tests.interop.harness import Peer, StartPeer, launch

__all__ = ["StartPeer", "certs", "start_peer"]


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """ca.pem, cert.pem, key.pem for 127.0.0.1, in a directory of their own."""
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def start_peer(certs: Certs) -> Iterator[StartPeer]:
    """start_peer(kind, role, **params) -> Peer, with TLS material and a port filled in.

    kind: "moqrs" | "aiomoqt" (see harness.PROGRAMS); role: "relay" | "pub" | "sub".
    params become --flags (underscores to dashes, lists comma-joined). A relay gets a free
    port and cert/key; a client gets ca. Skips the test if the implementation is missing.
    """
    started: list[Peer] = []

    def start(kind: str, role: str, **params: object) -> Peer:
        tls: dict[str, object]
        if role == "relay":
            tls = {"port": free_udp_port(), "cert": certs.cert, "key": certs.key}
        else:
            tls = {"ca": certs.ca}
        peer = launch(kind, role, {**tls, **params})
        started.append(peer)
        return peer

    yield start
    for peer in reversed(started):
        peer.stop()
    for peer in started:
        print(peer.log())
