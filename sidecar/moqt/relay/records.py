"""What a relay keeps beyond an origin's records (``protocol.records``): bounds and counters
of what only a relay does, and per peer the requests it sent that peer for others."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..protocol.records import DownstreamFetch, OriginCounters, OriginLimits, Peer
from .auth import Grant


@dataclass(frozen=True, slots=True)
class RelayLimits(OriginLimits):
    """Bounds on what peers can make the relay hold."""

    max_namespaces: int = 10_000
    # SUBSCRIBEs held at once for a track with no publisher yet (draft 18's rendezvous).
    max_held_subscribes: int = 1000
    # Seconds the cache keeps serving a track that nobody can send any more (its publisher
    # withdrew it or left, and there is no upstream relay): None, until evicted.
    retention: float | None = None


@dataclass(slots=True)
class RelayCounters(OriginCounters):
    """An origin's counters, and the requests the relay sent on to publishers (or the
    upstream relay), its sessions to an upstream relay, and tracks its retention dropped."""

    subscribes_sent: int = 0
    fetches_sent: int = 0
    upstream_sessions: int = 0
    tracks_expired: int = 0


@dataclass(eq=False)
class RelayPeer(Peer):
    """A session through the relay: what its token allows, and the FETCHes and
    TRACK_STATUSes the relay sent it for other peers."""

    access: Grant = field(default_factory=Grant.everything)
    upstream_fetches: dict[int, DownstreamFetch] = field(default_factory=dict)
    status_requests: dict[int, tuple[Peer, int]] = field(default_factory=dict)
