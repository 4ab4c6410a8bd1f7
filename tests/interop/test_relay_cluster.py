"""kvmoq edge relays with independent peers on them, under a kvmoq root or a moq-rs one.

The edges are `kvmoq relay --upstream` processes (1350-byte packets: picoquic, under aiomoqt,
drops larger ones); publishers and subscribers are aiomoqt and moq-rs programs, each on a
different edge, so every object crosses edge, root, edge.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from sidecar.moqt.aio.tls import CertificatePaths
from tests.interop.certs import Certs
from tests.interop.conftest import StartPeer
from tests.interop.harness import RelayPeer
from tests.interop.scenario import TrackSpec, discovery_chain, received
from tests.support.relay import ClusterRelay, cluster_relay, edge_flags

PAIRS = [("aiomoqt", "moqrs"), ("moqrs", "aiomoqt")]


def edges(stack: ExitStack, certs: Certs, root_url: str, count: int) -> list[ClusterRelay]:
    """``count`` kvmoq edges of the relay at ``root_url``, each connected."""
    served = CertificatePaths(certs.cert, certs.key)
    started = [
        stack.enter_context(
            cluster_relay(served, "--max-datagram-size", "1350", *edge_flags(root_url, certs.ca))
        )
        for _ in range(count)
    ]
    for edge in started:
        edge.wait_for("upstream_up", 1)
    return started


@pytest.fixture
def kvmoq_root(certs: Certs) -> Iterator[ClusterRelay]:
    served = CertificatePaths(certs.cert, certs.key)
    with cluster_relay(served, "--max-datagram-size", "1350") as root:
        yield root


@pytest.mark.interop
@pytest.mark.parametrize(("pub", "sub"), PAIRS, ids=[f"{p}-edge-root-edge-{s}" for p, s in PAIRS])
def test_peers_on_different_edges_exchange_objects(
    start_peer: StartPeer, certs: Certs, kvmoq_root: ClusterRelay, pub: str, sub: str
) -> None:
    spec = TrackSpec(namespace="kvtest/cluster")
    with ExitStack() as stack:
        a, b = edges(stack, certs, kvmoq_root.url, 2)
        publisher = start_peer(pub, "pub", url=a.url, **spec.params())
        publisher.wait_ready()
        subscriber = start_peer(sub, "sub", url=b.url, **spec.params())
        subscriber.expect_success(timeout=spec.timeout + 10)
        assert received(subscriber) == spec.expected()
        assert kvmoq_root.metric("subscribes_received") == 1


@pytest.mark.interop
def test_kvmoq_edges_under_a_moqrs_root(start_peer: StartPeer, certs: Certs) -> None:
    """moq-rs's relay as the root: an edge announces its publisher's namespace to it, and
    another edge's subscription goes through it."""
    spec = TrackSpec(namespace="kvtest/moqrs-root")
    root = start_peer("moqrs", "relay")
    assert isinstance(root, RelayPeer)
    root.wait_ready()
    with ExitStack() as stack:
        a, b = edges(stack, certs, root.url, 2)
        publisher = start_peer("aiomoqt", "pub", url=a.url, **spec.params())
        publisher.wait_ready()
        subscriber = start_peer("aiomoqt", "sub", url=b.url, **spec.params())
        subscriber.expect_success(timeout=spec.timeout + 10)
        assert received(subscriber) == spec.expected()
        assert a.metric("subscribes_received") == 1  # from the root, for its publisher
        assert b.metric("subscribes_sent") == 1  # to the root


@pytest.mark.interop
def test_a_track_pushed_on_one_edge_is_offered_to_a_follower_on_another(
    start_peer: StartPeer, certs: Certs, kvmoq_root: ClusterRelay
) -> None:
    """draft-14 discovery across the cluster: edge A PUBLISHes the pushed track on to the
    root, which offers it to edge B (following the prefix for its subscriber), which offers
    it to the subscriber that knows only the namespace."""
    spec = TrackSpec(namespace="kvtest/cluster-discover", timeout=15.0)
    with ExitStack() as stack:
        a, b = edges(stack, certs, kvmoq_root.url, 2)
        subscriber = discovery_chain(start_peer, a.url, b.url, spec)
        subscriber.expect_success(timeout=spec.timeout + 10)
        assert received(subscriber) == spec.expected()
