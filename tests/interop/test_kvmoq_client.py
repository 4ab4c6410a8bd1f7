"""kvmoq's client API (`sidecar.moqt.aio.api`) through independent relays (moq-rs, aiomoqt).

Our client runs in this process; the relay and the peer on the other side are the
independent implementations, run by the interop harness. Objects carry the shared pattern
(peers/pattern.py), so each side checks the other byte for byte.
"""

from __future__ import annotations

import asyncio

import pytest

from sidecar.address import free_udp_port
from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.moqt.protocol.model import FullTrackName, Location, ObjectStatus
from tests.interop.certs import Certs
from tests.interop.conftest import StartPeer
from tests.interop.peers.pattern import object_payload, object_record, object_size
from tests.interop.scenario import TrackSpec, received

RELAYS = ("moqrs", "aiomoqt")
# moq-rs, as a relay, probes a track with SUBSCRIBE + UNSUBSCRIBE before subscribing for
# real: a subscription must stay this long before the publisher counts on it.
SETTLE_S = 0.5


def _track(spec: TrackSpec) -> FullTrackName:
    return FullTrackName(tuple(p.encode() for p in spec.namespace.split("/")), spec.track.encode())


def _run(main: object, spec: TrackSpec) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(main, spec.timeout + 20)  # type: ignore[arg-type]

    transport.run(bounded())


async def _write_pattern(track: api.PublishedTrack, spec: TrackSpec) -> None:
    """Every object of ``spec``, with the shared pattern's payloads."""
    for group in range(spec.groups):
        for obj in range(spec.objects):
            payload = object_payload(spec.seed, group, obj, object_size(spec.sizes, obj))
            await track.write(group, obj, payload, end_of_group=obj == spec.objects - 1)


async def _wait_for_audience(track: api.PublishedTrack) -> None:
    while True:
        await track.wait_subscribed()
        await asyncio.sleep(SETTLE_S)
        if track.subscribers:
            return


@pytest.mark.interop
@pytest.mark.parametrize("relay", RELAYS)
def test_kvmoq_publishes_through_an_independent_relay(
    start_peer: StartPeer, certs: Certs, relay: str
) -> None:
    spec = TrackSpec(namespace="kvtest/kvmoq-client-pub")
    relay_peer = start_peer(relay, "relay")
    relay_peer.wait_ready()
    settings = QuicSettings(ca_file=certs.ca)
    publisher = api.Publisher()
    name = _track(spec)
    track = publisher.track(name.namespace, name.name)

    async def main() -> None:
        async with api.connect(relay_peer.url, settings, publisher=publisher) as session:
            await session.publish_namespace(name.namespace)
            subscriber = start_peer("aiomoqt", "sub", url=relay_peer.url, **spec.params())
            await _wait_for_audience(track)
            await _write_pattern(track, spec)
            await asyncio.to_thread(subscriber.expect_success, spec.timeout + 10)
            assert received(subscriber) == spec.expected()

    _run(main(), spec)


@pytest.mark.interop
@pytest.mark.parametrize("relay", RELAYS)
def test_kvmoq_subscribes_through_an_independent_relay(
    start_peer: StartPeer, certs: Certs, relay: str
) -> None:
    spec = TrackSpec(namespace="kvtest/kvmoq-client-sub")
    relay_peer = start_peer(relay, "relay")
    relay_peer.wait_ready()
    start_peer("aiomoqt", "pub", url=relay_peer.url, **spec.params()).wait_ready()
    settings = QuicSettings(ca_file=certs.ca)

    async def main() -> None:
        async with api.connect(relay_peer.url, settings) as session:
            subscription = await session.subscribe(_track(spec), start=Location(0, 0))
            records = []
            async for obj in subscription:
                if obj.status == ObjectStatus.NORMAL:
                    records.append(object_record(obj.group_id, obj.object_id, obj.payload))
                if len(records) == spec.groups * spec.objects:
                    break
            assert sorted(records, key=lambda r: (r["group"], r["object"])) == spec.expected()

    _run(main(), spec)


@pytest.mark.interop
def test_an_aiomoqt_subscriber_discovers_the_tracks_of_a_kvmoq_publisher(
    start_peer: StartPeer, certs: Certs
) -> None:
    """draft-14 discovery answered by a publisher, no relay between: an aiomoqt subscriber
    that knows only the namespace sends SUBSCRIBE_NAMESPACE, hears PUBLISH_NAMESPACE and a
    PUBLISH for the track, accepts it, and receives its objects."""
    spec = TrackSpec(namespace="kvtest/kvmoq-publisher-discover")
    publisher = api.Publisher()
    name = _track(spec)
    track = publisher.track(name.namespace, name.name)
    port = free_udp_port()

    async def main() -> None:
        server = await api.serve(
            "127.0.0.1", port, QuicSettings(), cert=certs.cert, key=certs.key, publisher=publisher
        )
        try:
            url = f"moqt://127.0.0.1:{port}"
            subscriber = start_peer("aiomoqt", "sub", url=url, discover=True, **spec.params())
            await asyncio.to_thread(subscriber.wait_event, "following", 20)
            await asyncio.wait_for(track.wait_subscribed(), spec.timeout)
            await _write_pattern(track, spec)
            await asyncio.to_thread(subscriber.expect_success, spec.timeout + 10)
            assert received(subscriber) == spec.expected()
        finally:
            server.close()

    _run(main(), spec)
