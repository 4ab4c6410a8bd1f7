"""Relays as a cluster: a root `kvmoq relay` and edges started with `--upstream`, as processes.

What an operator relies on: a track published through one edge reaches subscribers on every
other edge; each relay asks the one above it once per track however many subscribe below it
(read from each relay's /metrics); a namespace follower on one edge hears of a namespace
published on another; and an edge whose root restarts reconnects, announces again and serves
again.
"""

from __future__ import annotations

import asyncio
import signal
from contextlib import ExitStack

import pytest

from sidecar.address import free_udp_port
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.protocol.errors import PublishDoneStatus
from sidecar.moqt.protocol.events import (
    RequestAccepted,
    SubscribeRequested,
    SubscriptionEnded,
)
from tests.support.aio import off_the_loop, run
from tests.support.relay import (
    FROM_START,
    NAMESPACE,
    RELAY_BACKENDS,
    TRACK,
    Client,
    ClusterRelay,
    Sessions,
    accept,
    announce,
    cluster_relay,
    edge_flags,
    expected,
    received,
    send_groups,
)


@pytest.mark.parametrize("backend", RELAY_BACKENDS)
def test_a_track_published_on_one_edge_reaches_subscribers_on_the_others(
    cert: CertificatePaths, backend: str
) -> None:
    edges_carry_a_track(cert, backend)


def test_edges_on_draft_16_carry_a_track_through_a_root_on_14(cert: CertificatePaths) -> None:
    """A root not yet on draft 16 under edges that are: the edges reach it on 14 and serve
    their sessions on 16, the objects crossing drafts twice."""
    edges_carry_a_track(cert, "aioquic", "--drafts", "14")


def test_edges_on_draft_16_carry_a_track_through_a_root_on_18(cert: CertificatePaths) -> None:
    """Edges not yet on draft 18 under a root that is (its default): they reach it on 16,
    and their sessions (on 18 by default) land on 16 too."""
    edges_carry_a_track(cert, "aioquic", edge_drafts="16")


def edges_carry_a_track(
    cert: CertificatePaths, backend: str, *root_flags: str, edge_drafts: str | None = None
) -> None:
    with ExitStack() as stack:
        root = stack.enter_context(cluster_relay(cert, *root_flags, backend=backend))
        edge = edge_flags(root.url, cert.cert)
        if edge_drafts is not None:
            edge = (*edge, "--drafts", edge_drafts)
        edges = [stack.enter_context(cluster_relay(cert, *edge, backend=backend)) for _ in "ABC"]
        a, b, c = edges

        async def main() -> None:
            for edge in edges:
                await asyncio.to_thread(edge.wait_for, "upstream_up", 1)
            async with (
                Sessions(a.process, cert) as at_a,
                Sessions(b.process, cert) as at_b,
                Sessions(c.process, cert) as at_c,
            ):
                follower = await at_b.open()
                follow = follower.moqt.subscribe_namespace(NAMESPACE[:1])
                follower.send()
                await follower.next(RequestAccepted, lambda e: e.request_id == follow)

                publisher = await at_a.open()
                await announce(publisher)
                await follower.hears(NAMESPACE)  # from edge A, through the root

                decoders = [await at_b.open(), await at_b.open(), await at_c.open()]
                decoders.append(await at_c.open())
                request_ids = []
                for decoder in decoders:
                    request_ids.append(decoder.moqt.subscribe(TRACK, filter=FROM_START))
                    decoder.send()
                upstream = accept(publisher, await publisher.next(SubscribeRequested))
                sent = await send_groups(publisher, upstream, groups=3, objects=4, size=5000)
                for decoder, request_id in zip(decoders, request_ids, strict=True):
                    await decoder.until(lambda d=decoder, r=request_id: len(d.objects(r)) == sent)
                    assert received(decoder, request_id) == expected(3, 4, 5000)
                assert len(publisher.of(SubscribeRequested)) == 1

            # One subscription per track on each hop, whatever the number of decoders.
            assert root.metric("subscribes_received") == 2  # one from B, one from C
            assert root.metric("subscribes_sent") == 1  # to A
            assert a.metric("subscribes_sent") == 1  # to the publisher
            for edge in (b, c):
                assert edge.metric("subscribes_received") == 2
                assert edge.metric("subscribes_sent") == 1
            size = 3 * 4 * 5000
            assert root.metric("object_bytes_received") == size
            assert root.metric("object_bytes_sent") == 2 * size

        run(main)


async def streaming(
    a: ClusterRelay, b: ClusterRelay, at_a: Sessions, at_b: Sessions, groups: int
) -> tuple[Client, int, Client, int]:
    """Once both edges are up: a publisher on edge A, a decoder on edge B subscribed from the
    start and holding ``groups`` groups of 3 objects; (publisher, its upstream subscription's
    request id, decoder, the decoder's request id)."""
    for edge in (a, b):
        await asyncio.to_thread(edge.wait_for, "upstream_up", 1)
    publisher = await at_a.open()
    await announce(publisher)
    decoder = await at_b.open()
    first = decoder.moqt.subscribe(TRACK, filter=FROM_START)
    decoder.send()
    upstream = accept(publisher, await publisher.next(SubscribeRequested))
    await send_groups(publisher, upstream, groups=groups, objects=3, size=2000)
    await decoder.until(lambda: len(decoder.objects(first)) == 3 * groups)
    return publisher, upstream, decoder, first


@pytest.mark.parametrize("backend", RELAY_BACKENDS)
def test_an_edge_reconnects_and_announces_again_when_its_root_restarts(
    cert: CertificatePaths, backend: str
) -> None:
    port = free_udp_port()  # the restarted root listens where the first one did
    with ExitStack() as stack:
        root = stack.enter_context(cluster_relay(cert, port=port, backend=backend))
        edge = edge_flags(root.url, cert.cert)
        a = stack.enter_context(cluster_relay(cert, *edge, backend=backend))
        b = stack.enter_context(cluster_relay(cert, *edge, backend=backend))

        async def main() -> None:
            async with Sessions(a.process, cert) as at_a, Sessions(b.process, cert) as at_b:
                publisher, upstream, decoder, first = await streaming(a, b, at_a, at_b, 2)

                root.process.process.send_signal(signal.SIGKILL)  # gone without a word
                await asyncio.to_thread(b.wait_for, "upstream_up", 0)

                async with off_the_loop(cluster_relay(cert, port=port, backend=backend)) as again:
                    for edge in (a, b):
                        await asyncio.to_thread(edge.wait_for, "upstream_sessions", 2)
                    late = await at_b.open()
                    second = late.moqt.subscribe(TRACK, filter=FROM_START)
                    late.send()
                    await late.next(RequestAccepted, lambda e: e.request_id == second)
                    # Edge A still holds its subscription to the publisher (and the groups in
                    # its cache): the new root is served from there, the rest goes on live.
                    await send_groups(publisher, upstream, groups=1, objects=3, size=2000, first=2)
                    await late.until(lambda: len(late.objects(second)) == 9)
                    assert received(late, second) == expected(3, 3, 2000)
                    # The first subscription waited through the outage and goes on.
                    await decoder.until(lambda: len(decoder.objects(first)) == 9)
                    assert received(decoder, first) == expected(3, 3, 2000)
                    assert not decoder.of(SubscriptionEnded)
                    # One subscription from the new root to edge A for both subscribers
                    # (edge B may have asked more than once: until edge A announced again,
                    # the root had no route and refused it).
                    assert again.metric("subscribes_sent") == 1
                    assert len(publisher.of(SubscribeRequested)) == 1

        run(main)


def test_subscriptions_end_when_the_root_stays_away(cert: CertificatePaths) -> None:
    """Subscribers wait for a lost root three --upstream-timeouts, then get a clear end."""
    with ExitStack() as stack:
        root = stack.enter_context(cluster_relay(cert))
        a = stack.enter_context(cluster_relay(cert, *edge_flags(root.url, cert.cert)))
        b = stack.enter_context(cluster_relay(cert, *edge_flags(root.url, cert.cert)))

        async def main() -> None:
            async with Sessions(a.process, cert) as at_a, Sessions(b.process, cert) as at_b:
                _, _, decoder, first = await streaming(a, b, at_a, at_b, 1)
                root.process.process.send_signal(signal.SIGKILL)
                ended = await decoder.next(SubscriptionEnded, lambda e: e.request_id == first)
                assert ended.message.status_code == PublishDoneStatus.GOING_AWAY
                assert ended.message.reason == "the upstream relay left"

        run(main)


def test_a_relay_counts_its_sessions_per_draft(cert: CertificatePaths) -> None:
    """An operator upgrading a cluster reads who is still on the older draft."""
    with (
        cluster_relay(cert, "--drafts", "14") as root,
        cluster_relay(cert, *edge_flags(root.url, cert.cert)) as edge,
    ):
        edge.wait_for("upstream_up", 1)

        async def main() -> None:
            async with Sessions(edge.process, cert) as at_edge:
                await at_edge.open()
                await asyncio.to_thread(edge.wait_for, "sessions_by_draft:18", 1)
                assert edge.metric("sessions_by_draft:14") == 1  # the root
                assert root.metric("sessions_by_draft:14") == 1  # the edge
                assert root.metric("sessions_by_draft:18") == 0

        run(main)
