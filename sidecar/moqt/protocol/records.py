"""What an origin keeps: its limits and counters, and the records of its tracks, the peers it
serves, and their subscriptions and fetches. ``origin.Origin`` decides what happens to them;
``serving.Serving`` writes what goes down to the peers. A relay keeps the same records, with
a little more on each (``relay.records``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Protocol

from .errors import PublishDoneStatus
from .messages import Subscribe
from .model import FullTrackName, GroupOrder, Location
from .outbox import FetchEnd, FetchSend, Outbox
from .session import MoqtSession

Namespace = tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class OriginLimits:
    """Bounds on what peers can make an origin hold."""

    cache_bytes: int = 1 << 30
    # Bytes of live objects waiting for one slow downstream connection.
    max_queued_bytes: int = 64 << 20
    max_tracks: int = 10_000
    max_subscribers_per_track: int = 1_000
    max_prefixes_per_peer: int = 64


@dataclass(slots=True)
class OriginCounters:
    """What the origin has done since it started, for /metrics and the benchmarks: requests
    taken from peers, object bytes in and out (payloads, every delivery counted)."""

    subscribes_received: int = 0
    fetches_received: int = 0
    object_bytes_received: int = 0
    object_bytes_sent: int = 0


class Access(Protocol):
    """What one peer may do (a relay reads it from the peer's token: ``relay.auth.Grant``)."""

    def may_publish(self, namespace: Namespace) -> bool: ...
    def may_subscribe(self, namespace: Namespace) -> bool: ...
    def may_follow(self, prefix: Namespace) -> bool: ...


class Open:
    """Everything allowed: an origin with no authorization."""

    def may_publish(self, namespace: Namespace) -> bool:
        return True

    def may_subscribe(self, namespace: Namespace) -> bool:
        return True

    def may_follow(self, prefix: Namespace) -> bool:
        return True


class PeerLink(Protocol):
    """What the origin needs of one peer's connection."""

    def backlogged(self) -> bool: ...
    def closing(self) -> bool:
        """The connection is closing: nothing more can be written (qh3 raises on writes,
        aioquic drops them), though the session has not reported it closed yet."""

    def transmit(self) -> None: ...
    def wake_when_drained(self) -> None:
        """Call ``Origin.resume(peer)`` once the backlog is under its limit."""


@dataclass(eq=False)
class SubgroupStream:
    """One downstream subgroup stream: objects on it must have increasing ids."""

    stream_id: int
    last_object: int = -1
    stopped: bool = False


class Feed(Enum):
    """Where a downstream subscription's objects come from."""

    LIVE = auto()
    """The live path: objects as they arrive."""
    CATCHING_UP = auto()
    """A replay of cached groups toward the live edge (an absolute start, a PUBLISH)."""
    BEHIND = auto()
    """It fell behind the live edge: a replay that must not miss a group."""


@dataclass(eq=False)
class Downstream:
    """A SUBSCRIBE the origin accepted: what it covers, where its objects come from
    (``feed``), and its open streams. ``ending`` is orthogonal to the feed: once its
    PUBLISH_DONE is queued it takes no more objects, and how its streams close still
    depends on whether it was live (a live one FINs them, a replay cut short resets them)."""

    peer: Peer
    request_id: int
    track: Track
    start: Location
    end_group: int | None
    forward: bool
    feed: Feed = Feed.LIVE
    ending: bool = False
    streams: dict[tuple[int, int], SubgroupStream] = field(default_factory=dict)
    # Subgroups finished while catching up, so the replay does not send them again.
    finished: set[tuple[int, int]] = field(default_factory=set)
    # It starts mid-group and its peer needs that group ended (quirks.closes_joined_groups).
    joined_open: bool = False

    @property
    def live(self) -> bool:
        return self.feed is Feed.LIVE

    def replay(self) -> None:
        """Start from the cache: every group from ``start`` on is read there first."""
        self.feed = Feed.CATCHING_UP

    def fall_behind(self) -> None:
        self.feed = Feed.BEHIND

    def catch_up(self) -> None:
        """The replay reached the live edge: objects come as they arrive from now on."""
        self.feed = Feed.LIVE
        self.finished.clear()

    def end(self) -> bool:
        """Take no more objects; whether it was not ending already."""
        first, self.ending = not self.ending, True
        return first

    def wants(self, location: Location) -> bool:
        return (
            self.forward
            and not self.ending
            and location >= self.start
            and (self.end_group is None or location.group <= self.end_group)
        )


@dataclass(eq=False)
class DownstreamFetch:
    """A FETCH the origin accepted. One a relay forwarded upstream is answered when upstream
    answers, but upstream's objects travel on their own stream and may come first: until
    FETCH_OK has gone down they wait in ``early`` (None once it has)."""

    peer: Peer
    request_id: int
    track: FullTrackName
    start: Location
    end: Location
    descending: bool
    stream_id: int | None = None
    early: list[FetchSend | FetchEnd] | None = None
    early_bytes: int = 0
    # FETCHes of the same range that came while this one was upstream (decoders below an
    # edge ask for a chunk at once): served from the cache this one fills, once it is whole.
    followers: list[DownstreamFetch] = field(default_factory=list)

    @property
    def range(self) -> tuple[FullTrackName, Location, Location]:
        """What a second FETCH must ask for to follow this one."""
        return self.track, self.start, self.end


class UpstreamState(Enum):
    SUBSCRIBING = auto()  # our SUBSCRIBE is on its way: subscribers wait for SUBSCRIBE_OK
    LIVE = auto()  # objects flow
    ENDING = auto()  # PUBLISH_DONE came or the publisher left: over once its streams end
    LOST = auto()  # the upstream relay left: subscribers wait for it (Relay.attach_upstream)


LOCAL_STREAM = -1
"""The key of a local track's open group among ``Track.live_streams`` (QUIC stream ids are
never negative): this process writes one group at a time."""


@dataclass(eq=False)
class Upstream:
    """Where a track's objects come from: a SUBSCRIBE a relay sent, a PUBLISH, or (``peer``
    None) this process (``Origin.open_local``)."""

    peer: Peer | None
    request_id: int
    state: UpstreamState
    pushed: bool = False  # the publisher sent PUBLISH: it keeps the track until it ends it
    # What subscribers are told when it is over (PUBLISH_DONE's status and reason).
    done: tuple[int, str] = (PublishDoneStatus.TRACK_ENDED, "")

    def end(self, status: int, reason: str) -> None:
        if self.state is not UpstreamState.ENDING:
            self.state, self.done = UpstreamState.ENDING, (status, reason)


@dataclass(eq=False)
class Track:
    """A track the origin serves: its upstream (if any) and its downstream subscriptions."""

    name: FullTrackName
    upstream: Upstream | None = None
    largest: Location | None = None
    group_order: GroupOrder = GroupOrder.ASCENDING
    subscribers: list[Downstream] = field(default_factory=list)
    waiting: list[tuple[Peer, Subscribe]] = field(default_factory=list)
    live_streams: dict[int, tuple[int, int]] = field(default_factory=dict)  # upstream stream

    def upstream_in(self, state: UpstreamState) -> bool:
        return self.upstream is not None and self.upstream.state is state

    @property
    def local(self) -> bool:
        """Whether this process writes the track (``Origin.open_local``) and has not ended it."""
        return self.upstream is not None and self.upstream.peer is None

    def attach(self, upstream: Upstream) -> None:
        self.upstream = upstream
        if upstream.peer is not None:
            upstream.peer.upstreams[upstream.request_id] = self

    def detach(self) -> Upstream | None:
        """Forget the upstream (its peer forgets the track too); the one it had, if any."""
        upstream, self.upstream = self.upstream, None
        if upstream is not None and upstream.peer is not None:
            upstream.peer.upstreams.pop(upstream.request_id, None)
        return upstream


class PeerPhase(Enum):
    OPEN = auto()
    """Its outbox is written while its connection has room."""
    DRAINING = auto()
    """Its connection's backlog was full with items still queued: a wake-up
    (``Origin.resume``) is on its way."""
    GONE = auto()
    """It left: nothing more is queued, written or transmitted to it."""


@dataclass(eq=False)
class Peer:
    """One session the origin serves, in whatever roles it plays."""

    moqt: MoqtSession
    link: PeerLink
    name: str
    access: Access = field(default_factory=Open)
    outbox: Outbox = field(default_factory=Outbox)
    phase: PeerPhase = PeerPhase.OPEN
    flushing: bool = False  # its outbox is being written (items written may queue more)
    downstreams: dict[int, Downstream] = field(default_factory=dict)
    fetches: dict[int, DownstreamFetch] = field(default_factory=dict)
    upstreams: dict[int, Track] = field(default_factory=dict)  # our SUBSCRIBE / their PUBLISH
    announced: set[Namespace] = field(default_factory=set)  # namespaces we told it of
    offers: dict[int, Offer] = field(default_factory=dict)  # our PUBLISHes awaiting PUBLISH_OK

    @property
    def gone(self) -> bool:
        return self.phase is PeerPhase.GONE

    def wait_for_drain(self) -> bool:
        """Its backlog is full: whether to ask for a wake-up (none is on its way yet)."""
        if self.phase is not PeerPhase.OPEN:
            return False
        self.phase = PeerPhase.DRAINING
        return True

    def drained(self) -> None:
        if self.phase is PeerPhase.DRAINING:
            self.phase = PeerPhase.OPEN

    def leave(self) -> bool:
        """It left; whether it had not already."""
        if self.gone:
            return False
        self.phase = PeerPhase.GONE
        return True


@dataclass(frozen=True, slots=True)
class Offer:
    """A PUBLISH the origin sent a namespace subscriber: the track, and the largest location
    the PUBLISH named (a Largest Object filter in the PUBLISH_OK counts from there)."""

    track: Track
    largest: Location | None
