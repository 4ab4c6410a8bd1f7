"""Standalone FETCH through each relay, once a subscriber has pulled the track through it.

The aiomoqt fetcher asks for all groups in one FETCH; the moq-rs fetcher asks group by group
(its API fetches single groups only). A pair that cannot work is a `KnownBug`, as in
test_relay_chains.py, or a test of the refusal itself.
"""

from __future__ import annotations

import pytest

from tests.interop.harness import StartPeer
from tests.interop.scenario import KnownBug, TrackSpec, known_bug, received, relay_chain

PAIRS = [
    pytest.param("moqrs", "moqrs", None, id="moqrs-relay-moqrs-fetch"),
    pytest.param(
        "aiomoqt",
        "moqrs",
        KnownBug(
            "fetcher",
            r"a group fetch ended before FETCH_OK's End Location",
            "aiomoqt's FETCH_OK End Location counts its END_OF_GROUP status object; "
            "moq-rs then finds the fetch ended early and fails it as a protocol violation",
        ),
        id="aiomoqt-relay-moqrs-fetch",
    ),
    pytest.param("aiomoqt", "aiomoqt", None, id="aiomoqt-relay-aiomoqt-fetch"),
]


@pytest.mark.interop
@pytest.mark.parametrize(("relay", "fetcher", "bug"), PAIRS)
def test_fetch_returns_cached_groups(
    start_peer: StartPeer, relay: str, fetcher: str, bug: KnownBug | None
) -> None:
    spec = TrackSpec(namespace="kvtest/fetch", objects=2, sizes=[100, 20_000], timeout=15.0)
    relay_peer, _, subscriber = relay_chain(start_peer, "aiomoqt", relay, "aiomoqt", spec)
    subscriber.expect_success(timeout=spec.timeout + 10)

    fetch = start_peer(fetcher, "fetch", url=relay_peer.url, **spec.params())
    with known_bug(bug, fetcher=fetch):
        fetch.expect_success(timeout=spec.timeout + 10)
    assert received(fetch) == spec.expected()


@pytest.mark.interop
def test_moqrs_relay_refuses_fetch_of_several_groups(start_peer: StartPeer) -> None:
    """moq-rs serves FETCH one group at a time: a range over groups is NOT_SUPPORTED (0x3)."""
    spec = TrackSpec(namespace="kvtest/fetch", objects=2, sizes=[100], timeout=15.0)
    relay_peer, _, subscriber = relay_chain(start_peer, "aiomoqt", "moqrs", "aiomoqt", spec)
    subscriber.expect_success(timeout=spec.timeout + 10)

    fetch = start_peer("aiomoqt", "fetch", url=relay_peer.url, **spec.params())

    assert fetch.wait_exit(timeout=spec.timeout + 10) == 2, fetch.log()
    refusal = fetch.wait_event("fetch_error", timeout=1)
    assert refusal["code"] == 0x3
    assert "several groups" in refusal["reason"]
