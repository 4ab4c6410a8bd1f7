"""moq-rs ``fetch_group`` through the kvmoq relay (moq-ffi 0.4.18, draft-14).

Two things made it fail, neither of them in how the relay serves a FETCH from its cache:

1. ``Broadcast.fetch_group`` subscribes to the track for the length of the call only. It
   returns the group as soon as the relay accepts the FETCH, drops that subscription ("subscribe
   cancelled" in its log), and the group, whose FETCH stream is still arriving, goes with it
   ("group::Producer dropped without finish() or abort()"; reading it raises "dropped"). Whether
   the stream landed before the cancellation decided each run, and it lost 2 of 3. A fetcher
   that holds a subscription to the track while it fetches (this module, run as a peer: ``python
   -m tests.interop.test_moqrs_fetch_via_relay``) gets every group, every run.
2. FETCH_OK's End Location: kvmoq writes the last object of the range; moq-rs (like aiomoqt)
   reads it as the last object plus one, the encoding of FETCH's own End Location. A group of
   objects 0..n-1 then "continued past FETCH_OK's End Location" and moq-rs fails the fetch as a
   protocol violation. aiomoqt publishers end each group with an END_OF_GROUP status object,
   which the relay caches and counts, so their End lands where moq-rs expects it; a moq-rs
   publisher's groups have no such object (xfail below, until the encoding is changed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import pytest

from tests.interop import test_kvmoq_relay  # noqa: F401  (registers the kvmoq relay peer)
from tests.interop.conftest import StartPeer
from tests.interop.harness import PEERS_DIR, PROGRAMS, PeerError, Program
from tests.interop.scenario import TrackSpec, received, relay_chain

PROGRAMS[("moqrs", "fetch-holding")] = Program(
    Path(sys.executable), ("-m", "tests.interop.test_moqrs_fetch_via_relay")
)

SPEC = TrackSpec(namespace="kvtest/kvmoq-moqrs-fetch", objects=2, sizes=[100, 20_000], timeout=15.0)


def _fetch_through_the_relay(start_peer: StartPeer, publisher_kind: str) -> None:
    relay, _, subscriber = relay_chain(start_peer, publisher_kind, "kvmoq", "aiomoqt", SPEC)
    subscriber.expect_success(timeout=SPEC.timeout + 10)  # the relay has cached every group
    fetch = start_peer("moqrs", "fetch-holding", url=relay.url, **SPEC.params())
    fetch.expect_success(timeout=SPEC.timeout + 10)
    assert received(fetch) == SPEC.expected()
    assert str(fetch.version).startswith("moq-transport-14")


@pytest.mark.interop
def test_moqrs_fetches_every_group_from_the_kvmoq_cache(start_peer: StartPeer) -> None:
    _fetch_through_the_relay(start_peer, "aiomoqt")


@pytest.mark.interop
@pytest.mark.xfail(
    raises=PeerError,
    strict=True,
    reason="kvmoq's FETCH_OK End Location is the last object; moq-rs reads last + 1 and fails "
    "a group without a trailing END_OF_GROUP status object as a protocol violation",
)
def test_moqrs_fetches_groups_of_a_moqrs_publisher(start_peer: StartPeer) -> None:
    _fetch_through_the_relay(start_peer, "moqrs")


async def _fetch_holding_the_track(args: argparse.Namespace) -> None:
    """Fetch groups 0..N-1 one by one while subscribed to the track (see point 1 above)."""
    import moq
    from pattern import object_record
    from peer_io import emit, fail

    client = moq.Client(
        args.url, tls_roots=[os.path.abspath(args.ca)], websocket_enabled=False, reconnect=False
    )
    received = 0
    async with client:
        broadcast = await client.announced_broadcast(args.namespace)
        async with await broadcast.subscribe_track(args.track):
            emit("ready")
            for sequence in range(args.groups):
                try:
                    group = await broadcast.fetch_group(args.track, sequence)
                except moq.Error as error:
                    fail(f"fetch of group {sequence} refused: {error!r}")
                obj = 0
                async for frame in group:
                    emit("object", **object_record(sequence, obj, frame.payload))
                    obj += 1
                received += obj
    emit("done", objects=received)
    if received != args.groups * args.objects:
        fail(f"fetched {received} of {args.groups * args.objects} objects")


def _main() -> None:
    sys.path.insert(0, str(PEERS_DIR))  # the peers' shared modules, as their scripts see them
    from moqrs_log import watch_versions
    from peer_io import client_parser, emit, fail

    args = client_parser(__doc__ or "").parse_args()
    watch_versions(lambda version: emit("session", version=version))
    try:
        asyncio.run(asyncio.wait_for(_fetch_holding_the_track(args), args.timeout))
    except TimeoutError:
        fail(f"timed out after {args.timeout} s")


if __name__ == "__main__":
    _main()
