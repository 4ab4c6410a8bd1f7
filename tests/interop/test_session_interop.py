"""The session against independent draft-14 implementations, through their relays.

moq-rs and aiomoqt relays run as processes (tests/interop's harness); our side is the bare
``MoqtSession`` on a UDP socket (udp_client), so what is checked is the protocol core itself:
setup with their parameters, their SUBSCRIBE_NAMESPACE / PUBLISH_NAMESPACE traffic, their
stream types and extensions, and objects byte for byte in both directions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol.events import MoqtEvent
from sidecar.moqt.protocol.messages import StandaloneFetch
from sidecar.moqt.protocol.model import FullTrackName, Location, ObjectStatus
from tests.interop.certs import Certs
from tests.interop.harness import RelayPeer, StartPeer
from tests.interop.peers.pattern import object_payload, object_size
from tests.interop.scenario import TrackSpec, received
from tests.support.udp_client import UdpClient

RELAYS = ("moqrs", "aiomoqt")
pytestmark = [pytest.mark.interop, pytest.mark.slow]


@pytest.fixture
def peer_relay(request: pytest.FixtureRequest, start_peer: StartPeer) -> RelayPeer:
    peer = start_peer(request.param, "relay")
    assert isinstance(peer, RelayPeer)
    peer.wait_ready()
    return peer


@pytest.fixture
def client(peer_relay: RelayPeer, certs: Certs) -> Iterator[UdpClient]:
    client = UdpClient("127.0.0.1", peer_relay.port, certs.ca)
    client.run_until(lambda events: any(isinstance(e, ev.SetupCompleted) for e in events), 10)
    yield client
    client.close()


class Answerer:
    """Accepts whatever the relay asks of us; serves the pattern track on every SUBSCRIBE.

    One group per ``GROUP_INTERVAL``, as a live publisher would: relays start a new downstream
    subscriber at the group in progress, so a track sent in one burst would reach the relay
    before the subscriber that caused the SUBSCRIBE is attached.
    """

    GROUP_INTERVAL = 0.1

    def __init__(self, client: UdpClient, spec: TrackSpec) -> None:
        self.client = client
        self.spec = spec
        self.seen = 0
        self.served = 0
        self._runs: dict[int, tuple[int, float]] = {}  # request id -> (next group, when)

    def __call__(self, events: list[MoqtEvent]) -> None:
        session = self.client.session
        for event in events[self.seen :]:
            if isinstance(event, ev.NamespaceSubscribeRequested):
                session.subscribe_namespace_ok(event.message.request_id)
            elif isinstance(event, ev.NamespacePublished):
                session.publish_namespace_ok(event.message.request_id)
            elif isinstance(event, ev.SubscribeRequested):
                session.subscribe_ok(event.message.request_id)
                self._runs[event.message.request_id] = (0, time.monotonic() + self.GROUP_INTERVAL)
            elif isinstance(event, ev.Unsubscribed):
                self._runs.pop(event.request_id, None)
            assert not isinstance(event, ev.SessionClosed), event
        self.seen = len(events)
        for request_id, (group, when) in list(self._runs.items()):
            if time.monotonic() >= when:
                self._send_group(request_id, group)

    def _send_group(self, request_id: int, group: int) -> None:
        session, spec = self.client.session, self.spec
        stream = session.objects.open_subgroup(request_id, group, end_of_group=True)
        for obj in range(spec.objects):
            payload = object_payload(spec.seed, group, obj, object_size(spec.sizes, obj))
            session.objects.send_object(stream, obj, payload, end_stream=obj == spec.objects - 1)
        if group + 1 < spec.groups:
            self._runs[request_id] = (group + 1, time.monotonic() + self.GROUP_INTERVAL)
        else:
            del self._runs[request_id]
            self.served += 1


def until_last_object(answer: Answerer) -> Callable[[list[MoqtEvent]], bool]:
    """A `run_until` condition: the track's last object has arrived (answering meanwhile)."""
    last = (answer.spec.groups - 1, answer.spec.objects - 1)

    def done(events: list[MoqtEvent]) -> bool:
        answer(events)
        return any(
            isinstance(e, ev.ObjectReceived) and (e.group_id, e.object_id) == last for e in events
        )

    return done


@pytest.mark.parametrize("peer_relay", RELAYS, indirect=True)
def test_subscribe_through_relay_to_aiomoqt_publisher(
    peer_relay: RelayPeer,
    client: UdpClient,
    start_peer: StartPeer,
) -> None:
    spec = TrackSpec(namespace="kvtest/sub")
    start_peer("aiomoqt", "pub", url=peer_relay.url, **spec.params()).wait_ready()
    answer = Answerer(client, spec)
    request_id = client.session.subscribe(FullTrackName((b"kvtest", b"sub"), b"t0"))
    client.run_until(until_last_object(answer), spec.timeout)
    objects = [
        e
        for e in client.events
        if isinstance(e, ev.ObjectReceived) and e.status == ObjectStatus.NORMAL
    ]
    assert objects and all(o.request_id == request_id for o in objects)
    for o in objects:
        size = object_size(spec.sizes, o.object_id)
        assert o.payload == object_payload(spec.seed, o.group_id, o.object_id, size)
    # A live subscription starts where the track is when it arrives: a gapless suffix.
    locations = sorted(Location(o.group_id, o.object_id) for o in objects)
    expected = [Location(g, o) for g in range(spec.groups) for o in range(spec.objects)]
    assert locations == expected[expected.index(locations[0]) :]


# moq-rs to moq-rs negotiates moq-lite, not draft-14, so that pair has nothing to show here.
PUBLISH_PAIRS = [("moqrs", "aiomoqt"), ("aiomoqt", "moqrs"), ("aiomoqt", "aiomoqt")]


@pytest.mark.parametrize(("peer_relay", "subscriber"), PUBLISH_PAIRS, indirect=["peer_relay"])
def test_publish_through_relay_to_independent_subscriber(
    peer_relay: RelayPeer,
    client: UdpClient,
    start_peer: StartPeer,
    subscriber: str,
) -> None:
    spec = TrackSpec(namespace="kvtest/pub")
    answer = Answerer(client, spec)
    client.session.publish_namespace((b"kvtest", b"pub"))

    def accepted(events: list[MoqtEvent]) -> bool:
        answer(events)
        return any(isinstance(e, ev.RequestAccepted) for e in events)

    client.run_until(accepted, 10)
    peer = start_peer(subscriber, "sub", url=peer_relay.url, **spec.params())

    def subscriber_done(events: list[MoqtEvent]) -> bool:
        answer(events)
        return peer.returncode is not None

    client.run_until(subscriber_done, spec.timeout + 10)
    peer.expect_success(timeout=1)
    assert answer.served >= 1
    assert received(peer) == spec.expected()


@pytest.mark.parametrize("peer_relay", RELAYS, indirect=True)
def test_fetch_cached_groups_from_relay(
    peer_relay: RelayPeer,
    client: UdpClient,
    start_peer: StartPeer,
) -> None:
    """While our subscription holds the track at the relay, FETCH returns its groups.

    The subscription stays open through the FETCHes because moq-rs drops a track's groups
    once its last subscriber leaves (a FETCH after that goes upstream, to a publisher that
    keeps no past groups). moq-rs serves one group per FETCH, so groups are fetched one at
    a time."""
    spec = TrackSpec(namespace="kvtest/fetch", objects=2, sizes=[100, 20_000], timeout=15.0)
    start_peer("aiomoqt", "pub", url=peer_relay.url, **spec.params()).wait_ready()
    answer = Answerer(client, spec)
    track = FullTrackName((b"kvtest", b"fetch"), b"t0")
    client.session.subscribe(track)
    client.run_until(until_last_object(answer), spec.timeout)
    objects: list[ev.ObjectReceived] = []
    for group in range(spec.groups):
        request_id = client.session.fetch(StandaloneFetch(track, Location(group, 0), group))

        def fetched(events: list[MoqtEvent], request_id: int = request_id) -> bool:
            answer(events)
            rejected = [
                e
                for e in events
                if isinstance(e, ev.RequestRejected) and e.request_id == request_id
            ]
            assert not rejected, rejected
            return any(
                isinstance(e, ev.DataStreamEnded) and e.request_id == request_id for e in events
            )

        client.run_until(fetched, spec.timeout)
        objects += [
            e
            for e in client.events
            if isinstance(e, ev.ObjectReceived)
            and e.request_id == request_id
            and e.status == ObjectStatus.NORMAL
        ]
    assert [(o.group_id, o.object_id) for o in objects] == [
        (g, o) for g in range(spec.groups) for o in range(spec.objects)
    ]
    for o in objects:
        size = object_size(spec.sizes, o.object_id)
        assert o.source == ev.ObjectSource.FETCH
        assert o.payload == object_payload(spec.seed, o.group_id, o.object_id, size)
