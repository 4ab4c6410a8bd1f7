"""What each relay answers to a SUBSCRIBE for a track that nobody publishes."""

from __future__ import annotations

import pytest

from tests.interop.harness import RelayPeer, StartPeer

REASONS = {"moqrs": "unroutable", "aiomoqt": "track does not exist"}


@pytest.mark.interop
@pytest.mark.parametrize("relay", sorted(REASONS))
def test_unknown_track_is_track_does_not_exist(start_peer: StartPeer, relay: str) -> None:
    relay_peer = start_peer(relay, "relay")
    assert isinstance(relay_peer, RelayPeer)
    relay_peer.wait_ready()
    subscriber = start_peer(
        "aiomoqt", "sub", url=relay_peer.url, namespace="nobody/here", track="t0", timeout=10
    )

    refusal = subscriber.wait_event("refused", timeout=10)

    assert refusal["code"] == 0x4
    assert refusal["reason"] == REASONS[relay]
