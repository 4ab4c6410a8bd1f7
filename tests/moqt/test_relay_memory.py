"""The sans-I/O relay's own rules, in memory: one upstream request per track or range
whatever the number of subscribers, FETCH from the cache when it holds the range,
authorization at SETUP, and draft 18's rendezvous. Real sessions over real QUIC, no process or socket (the relay
process is tested for what needs one: tests/moqt/test_relay*.py)."""

from __future__ import annotations

import base64

import jwt

from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol.drafts import DRAFT_18
from sidecar.moqt.protocol.errors import (
    PublishNamespaceErrorCode,
    SessionErrorCode,
    SubscribeErrorCode,
)
from sidecar.moqt.protocol.messages import Parameters, StandaloneFetch
from sidecar.moqt.protocol.model import FullTrackName, Location
from sidecar.moqt.relay.auth import Authorizer
from sidecar.moqt.relay.core import Relay
from sidecar.moqt.relay.records import RelayLimits
from sidecar.moqt.relay.rendezvous import LONGEST_WAIT_S
from tests.support.memory import Served, of

NAMESPACE = (b"kvcache.moq.arpa/v1", b"smollm2", b"abc123")
TRACK = FullTrackName(NAMESPACE, b"int8")


def payload(group: int, object_id: int) -> bytes:
    return f"{group}/{object_id}".encode() * 20


def objects(events: list[ev.MoqtEvent]) -> list[tuple[int, int, bytes]]:
    return [(e.group_id, e.object_id, e.body.payload) for e in of(events, ev.ObjectReceived)]


def with_publisher(clients: int) -> Served:
    """A relay with ``clients`` sessions; the first published NAMESPACE."""
    served = Served(Relay(), clients=clients)
    served.client(0).publish_namespace(NAMESPACE)
    assert len(of(served.run(0), ev.RequestAccepted)) == 1
    return served


def test_subscribers_of_a_track_share_one_upstream_subscription() -> None:
    served = with_publisher(clients=3)
    relay, publisher = served.origin, served.client(0)
    assert isinstance(relay, Relay)
    for n in (1, 2):
        served.client(n).subscribe(TRACK)
    asked = of(served.run(0), ev.SubscribeRequested)
    assert [r.message.track for r in asked] == [TRACK]  # once, for both
    upstream = asked[0].message.request_id
    publisher.subscribe_ok(upstream)
    served.run(0)
    stream = publisher.objects.open_subgroup(upstream, 0)
    for object_id in range(3):
        publisher.objects.send_object(
            stream, object_id, payload(0, object_id), end_stream=object_id == 2
        )
    served.run(0)
    for n in (1, 2):
        events = served.run(n)
        assert len(of(events, ev.RequestAccepted)) == 1
        assert objects(events) == [(0, o, payload(0, o)) for o in range(3)]
    assert (relay.counters.subscribes_received, relay.counters.subscribes_sent) == (2, 1)


def test_a_fetch_goes_upstream_once_per_range_and_not_at_all_for_what_is_cached() -> None:
    served = with_publisher(clients=3)
    publisher = served.client(0)
    wanted = StandaloneFetch(TRACK, Location(5, 0), 5, None)  # all of group 5
    fetches = {n: served.client(n).fetch(wanted) for n in (1, 2)}
    asked = of(served.run(0), ev.FetchRequested)
    assert len(asked) == 1  # the second FETCH of the range follows the first
    upstream = asked[0].message.request_id
    publisher.fetch_ok(upstream, Location(5, 2))
    stream = publisher.objects.open_fetch_stream(upstream)
    for object_id in range(2):
        publisher.objects.send_fetch_object(
            stream, 5, 0, object_id, payload(5, object_id), end_stream=object_id == 1
        )
    served.run(0)
    whole = [(5, o, payload(5, o)) for o in range(2)]
    for n in (1, 2):
        events = served.run(n)
        assert [a.request_id for a in of(events, ev.RequestAccepted)] == [fetches[n]]
        assert objects(events) == whole
    served.client(1).fetch(wanted)  # the cache holds group 5 whole now
    assert of(served.run(0), ev.FetchRequested) == []
    assert objects(served.run(1)) == whole


def test_sessions_get_only_what_their_token_allows() -> None:
    secret = base64.urlsafe_b64encode(b"k" * 32).rstrip(b"=").decode()
    key = jwt.PyJWK({"kty": "oct", "k": secret, "alg": "HS256"})
    public = "kvcache.moq.arpa/v1/open"
    served = Served(Relay(authorizer=Authorizer(key, public=public)))
    session = served.client()
    subscribe = session.subscribe(TRACK)
    announce = session.publish_namespace(NAMESPACE)
    allowed = session.subscribe(FullTrackName((b"kvcache.moq.arpa/v1", b"open"), b"fp16"))
    codes = {r.request_id: r.message.error_code for r in of(served.run(), ev.RequestRejected)}
    assert codes == {
        subscribe: SubscribeErrorCode.UNAUTHORIZED,
        announce: PublishNamespaceErrorCode.UNAUTHORIZED,
        allowed: SubscribeErrorCode.TRACK_DOES_NOT_EXIST,  # allowed, and not there
    }
    guarded = Served(Relay(authorizer=Authorizer(key)))  # no public path: tokens only
    guarded.pairs[0].advance(1.0)  # the close's draining period
    closed = of(guarded.run(), ev.SessionClosed)
    assert [c.error_code for c in closed] == [SessionErrorCode.UNAUTHORIZED]


# Draft 18's rendezvous: a SUBSCRIBE may ask the relay to wait for its track's publisher.


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rendezvous() -> tuple[Served, Relay, Clock]:
    """A draft-18 relay on a clock of its own; client 0 will publish, client 1 subscribes."""
    clock = Clock()
    relay = Relay(clock=clock)
    served = Served(relay, clients=2, draft=DRAFT_18)
    for client in (0, 1):
        served.run(client)  # its SETUP
    return served, relay, clock


def waiting(ms: int) -> Parameters:
    return Parameters(rendezvous_timeout=ms)


def test_a_subscribe_that_asks_waits_for_its_track_to_have_a_publisher() -> None:
    served, relay, clock = rendezvous()
    request_id = served.client(1).subscribe(TRACK, parameters=waiting(2000))
    assert served.run(1) == []  # no answer yet: held
    assert relay.next_timer() == clock.now + 2.0
    clock.now += 1.0
    served.client(0).publish_namespace(NAMESPACE)
    (asked,) = of(served.run(0), ev.SubscribeRequested)  # it went on once a publisher came
    served.client(0).subscribe_ok(asked.message.request_id)
    (accepted,) = of(served.run(1), ev.RequestAccepted)
    assert accepted.request_id == request_id
    assert relay.next_timer() is None
    relay.tick(clock.now + 5)
    assert of(served.run(1), ev.RequestRejected) == []


def test_a_subscribe_held_past_its_wait_is_refused_with_timeout() -> None:
    served, relay, clock = rendezvous()
    request_id = served.client(1).subscribe(TRACK, parameters=waiting(500))
    served.run(1)
    relay.tick(clock.now + 0.4)
    assert served.run(1) == []
    relay.tick(clock.now + 0.5)
    (refused,) = of(served.run(1), ev.RequestRejected)
    assert refused.request_id == request_id
    assert refused.message.error_code == SubscribeErrorCode.TIMEOUT


def test_without_a_wait_a_track_nobody_publishes_is_refused_at_once() -> None:
    served, relay, _ = rendezvous()
    served.client(1).subscribe(TRACK)
    (refused,) = of(served.run(1), ev.RequestRejected)
    assert refused.message.error_code == SubscribeErrorCode.TRACK_DOES_NOT_EXIST  # 0x10
    assert relay.next_timer() is None


def test_the_wait_is_bounded_and_so_is_what_is_held() -> None:
    clock = Clock()
    relay = Relay(RelayLimits(max_held_subscribes=1), clock=clock)
    served = Served(relay, clients=2, draft=DRAFT_18)
    served.client(1).subscribe(TRACK, parameters=waiting(10**9))
    other = FullTrackName(NAMESPACE, b"fp16")
    served.client(1).subscribe(other, parameters=waiting(1000))
    (refused,) = of(served.run(1), ev.RequestRejected)  # no room: refused at once
    assert refused.message.error_code == SubscribeErrorCode.TRACK_DOES_NOT_EXIST
    assert relay.next_timer() == clock.now + LONGEST_WAIT_S


def test_a_held_subscribe_withdrawn_or_whose_session_left_is_forgotten() -> None:
    served, relay, _ = rendezvous()
    subscriber = served.client(1)
    request_id = subscriber.subscribe(TRACK, parameters=waiting(5000))
    served.run(1)
    subscriber.unsubscribe(request_id)  # draft 18: its stream is reset
    served.run(1)
    assert relay.next_timer() is None
    subscriber.subscribe(FullTrackName(NAMESPACE, b"fp16"), parameters=waiting(5000))
    served.run(1)
    assert relay.next_timer() is not None
    served.origin.handle(served.peers[1], ev.SessionClosed(0, "gone", True))
    assert relay.next_timer() is None
