"""moq-rs ``fetch_group`` through the kvmoq relay (moq-ffi 0.4.18, draft-14).

Three things made it fail:

1. ``Broadcast.fetch_group`` subscribes to the track for the length of the call only. It
   returns the group as soon as the relay accepts the FETCH, drops that subscription ("subscribe
   cancelled" in its log), and the group, whose FETCH stream is still arriving, goes with it
   ("group::Producer dropped without finish() or abort()"; reading it raises "dropped"). Whether
   the stream landed before the cancellation decided each run, and it lost 2 of 3. Our moq-rs
   fetch peer (peers/moqrs_fetch.py) holds a subscription to the track while it fetches and
   gets every group, every run.
2. FETCH_OK's End Location: kvmoq wrote the last object of the range; moq-rs (like aiomoqt)
   reads it as the last object plus one, the encoding of FETCH's own End Location, and failed
   a group of objects 0..n-1 that "continued past FETCH_OK's End Location" as a protocol
   violation (aiomoqt publishers' groups passed only because each ends with an END_OF_GROUP
   status object, which the relay caches and counts). kvmoq now writes last + 1
   (`messages.fetch_end`).
3. The newest group: the fetcher's own SUBSCRIBE (Largest Object, quirk 8) starts right after
   the group's last object, and its joining FETCH brings the group's objects; moq-rs then waits
   for the rest of the group on the subscription, and ``fetch_group`` of that group sends no
   FETCH but returns the group it holds. A moq-rs publisher's group ends with no END_OF_GROUP
   status object (quirk 15), so nothing came on the subscription and the group ended only when
   the publisher left (the runs that passed did so by beating the fetcher's timeout). The
   relay now sends an END_OF_GROUP status object at the subscription's start when it holds that
   group whole (`Relay._end_joined_group`), and every group of either publisher arrives whole.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.interop import test_kvmoq_relay  # noqa: F401  (registers the kvmoq relay peer)
from tests.interop.conftest import StartPeer
from tests.interop.harness import KVMOQ_RELAY_DRAFT
from tests.interop.scenario import TrackSpec, received, relay_chain

SPEC = TrackSpec(namespace="kvtest/kvmoq-moqrs-fetch", objects=2, sizes=[100, 20_000], timeout=15.0)


def _fetch_through_the_relay(start_peer: StartPeer, publisher_kind: str, groups: int) -> None:
    relay, _, subscriber = relay_chain(start_peer, publisher_kind, "kvmoq", "aiomoqt", SPEC)
    subscriber.expect_success(timeout=SPEC.timeout + 10)  # the relay has cached every group
    fetched = dataclasses.replace(SPEC, groups=groups)
    fetch = start_peer("moqrs", "fetch", url=relay.url, **fetched.params())
    fetch.expect_success(timeout=SPEC.timeout + 10)
    assert received(fetch) == fetched.expected()
    assert str(fetch.version).startswith(KVMOQ_RELAY_DRAFT["moqrs"])


@pytest.mark.interop
def test_moqrs_fetches_every_group_from_the_kvmoq_cache(start_peer: StartPeer) -> None:
    _fetch_through_the_relay(start_peer, "aiomoqt", SPEC.groups)


@pytest.mark.interop
def test_moqrs_fetches_groups_of_a_moqrs_publisher(start_peer: StartPeer) -> None:
    _fetch_through_the_relay(start_peer, "moqrs", SPEC.groups)
