"""Publisher -> relay -> subscriber through every combination of moq-rs and aiomoqt.

These prove the harness and map what the two independent implementations agree on; the
README records every chain that cannot work and why.
"""

from __future__ import annotations

import pytest

from tests.interop.conftest import StartPeer
from tests.interop.peers.pattern import expected_records

NAMESPACE = "kvtest/chain"
TRACK = "t0"
GROUPS = 3
OBJECTS = 4
SIZES = [17, 3000, 64_000]
SEED = 7
PEER_TIMEOUT_S = 20

KINDS = ("moqrs", "aiomoqt")
CHAINS = [(pub, relay, sub) for pub in KINDS for relay in KINDS for sub in KINDS]


def expected_version(client: str, relay: str) -> str:
    """moq-rs prefers moq-lite when both ends are moq-rs; every other pair lands on draft-14."""
    return "moq-lite" if client == relay == "moqrs" else "moq-transport-14"


def by_location(record: dict[str, object]) -> tuple[int, int]:
    return int(str(record["group"])), int(str(record["object"]))


@pytest.mark.interop
@pytest.mark.parametrize(("pub", "relay", "sub"), CHAINS, ids=["-".join(c) for c in CHAINS])
def test_every_object_arrives_intact(start_peer: StartPeer, pub: str, relay: str, sub: str) -> None:
    track = {
        "namespace": NAMESPACE,
        "track": TRACK,
        "groups": GROUPS,
        "objects": OBJECTS,
        "sizes": SIZES,
        "seed": SEED,
        "timeout": PEER_TIMEOUT_S,
    }
    relay_peer = start_peer(relay, "relay")
    relay_peer.wait_ready()
    publisher = start_peer(pub, "pub", url=relay_peer.url, **track)
    publisher.wait_ready()
    subscriber = start_peer(sub, "sub", url=relay_peer.url, **track)
    subscriber.expect_success(timeout=PEER_TIMEOUT_S + 10)

    received = sorted(subscriber.results(), key=by_location)
    assert received == expected_records(SEED, GROUPS, OBJECTS, SIZES)
    assert str(publisher.version).startswith(expected_version(pub, relay))
    assert str(subscriber.version).startswith(expected_version(sub, relay))
