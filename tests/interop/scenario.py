"""A track to move through a relay, and the chain of peers that moves it.

The relay owner's tests reuse these with kvmoq's own peers: register them in
harness.PROGRAMS and pass their kind to `relay_chain`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from tests.interop.harness import Peer, PeerError, RelayPeer, StartPeer
from tests.interop.peers.pattern import expected_records


@dataclass(frozen=True)
class TrackSpec:
    """What a publisher sends and a subscriber expects: N groups of M patterned objects."""

    namespace: str = "kvtest/chain"
    track: str = "t0"
    groups: int = 3
    objects: int = 4
    sizes: list[int] = field(default_factory=lambda: [17, 3000, 64_000])
    seed: int = 7
    timeout: float = 20.0
    """Seconds each client peer may run before it gives up."""

    def params(self) -> dict[str, object]:
        """The --flags every publisher, subscriber and fetcher takes."""
        return {
            "namespace": self.namespace,
            "track": self.track,
            "groups": self.groups,
            "objects": self.objects,
            "sizes": self.sizes,
            "seed": self.seed,
            "timeout": self.timeout,
        }

    def expected(self) -> list[dict[str, int | str]]:
        return expected_records(self.seed, self.groups, self.objects, self.sizes)


def received(peer: Peer) -> list[dict[str, object]]:
    """A subscriber's objects in (group, object) order, whatever order they arrived in."""
    return sorted(peer.results(), key=lambda r: (int(str(r["group"])), int(str(r["object"]))))


def relay_chain(
    start_peer: StartPeer,
    pub: str,
    relay: str,
    sub: str,
    spec: TrackSpec,
    **pub_params: object,
) -> tuple[RelayPeer, Peer, Peer]:
    """Start relay, then publisher, then subscriber, each once the previous one is ready.

    Returns (relay, publisher, subscriber) with the subscriber still running: call
    `expect_success` on it, or `wait_exit` where failure is the expected outcome.
    """
    relay_peer = start_peer(relay, "relay")
    assert isinstance(relay_peer, RelayPeer)
    relay_peer.wait_ready()
    publisher = start_peer(pub, "pub", url=relay_peer.url, **spec.params(), **pub_params)
    publisher.wait_ready()
    subscriber = start_peer(sub, "sub", url=relay_peer.url, **spec.params())
    return relay_peer, publisher, subscriber


def discovery_chain(
    start_peer: StartPeer, publish_url: str, subscribe_url: str, spec: TrackSpec
) -> Peer:
    """draft-14 discovery with aiomoqt on both ends: a subscriber that knows only the
    namespace follows it (at ``subscribe_url``), then a publisher PUBLISHes its track (at
    ``publish_url``). Returns the subscriber, still running."""
    subscriber = start_peer("aiomoqt", "sub", url=subscribe_url, discover=True, **spec.params())
    subscriber.wait_event("following", timeout=20)
    publisher = start_peer("aiomoqt", "pub", url=publish_url, mode="publish", **spec.params())
    publisher.wait_ready()
    return subscriber


@dataclass(frozen=True)
class KnownBug:
    """A bug of a peer that a pair of peers cannot work around, documented by the error it
    causes: `pattern` (a regex) in the log of the peer named `peer`."""

    peer: str
    pattern: str
    reason: str


@contextmanager
def known_bug(bug: KnownBug | None, **peers: Peer) -> Iterator[None]:
    """Run the block; with `bug`, it must fail with exactly the documented error, and is then
    an expected failure. Any other failure fails the test, and so does success: the bug is
    fixed upstream, and the test should expect success again."""
    if bug is None:
        yield
        return
    try:
        yield
    except PeerError as failure:
        log = peers[bug.peer].log()
        if re.search(bug.pattern, log) is None:
            raise PeerError(
                f"failed, but not with the documented {bug.reason!r} "
                f"({bug.pattern!r} not in the {bug.peer}'s log):\n{log}\n{failure}"
            ) from failure
        pytest.xfail(bug.reason)
    pytest.fail(f"works now, although {bug.reason}: expect success again")
