"""The relay's protocol core: routing, upstream subscriptions, fan-out, cache and FETCH.

Sans-I/O like the session it drives: ``Relay.handle(peer, event)`` takes one session's event
and answers by calling methods of the ``MoqtSession`` objects of the peers involved. What it
needs of the I/O layer is three things per peer (``PeerLink``): whether its connection's send
backlog is full, a nudge to transmit, and a wake-up (``Relay.resume``) once it drained.

The work is split by job: ``records`` holds what the relay keeps (tracks, peers, downstream
subscriptions and fetches), ``serving`` writes what goes down to peers (the outbox below),
``fetching`` answers FETCH, and this module decides the rest: who may do what, whom to ask
upstream, namespaces, local tracks, and what a peer's leaving ends.

Why the per-peer outbox: a relay must not buffer without bound for a subscriber slower than
its publisher, and it cannot slow the publisher down either (aioquic and qh3 grant flow
control as data arrives, not as it is consumed). Everything bound for a peer goes through one
FIFO of small items that refer to cached payloads (no copies); it is written into QUIC while
the connection's backlog allows, and waits otherwise. The cache is the real buffer: when live
objects for a subscription would push its peer's FIFO past ``max_queued_bytes``, the
subscription stops taking live objects and reads the cache at its own pace instead, and only
if the cache evicts a group it has not read yet does it end with PUBLISH_DONE TOO_FAR_BEHIND.
Replays of cached groups (such catch-ups, late SUBSCRIBEs with an absolute start, FETCH) are
one queued item that reads the cache a group at a time, so a subscriber that loads a
thousand past groups holds no more than one group in flight, and takes nothing from the live
path until it has caught up with the live edge.

Why one upstream request per track or range: the relay is a point of fan-out, and in a
cluster (an edge's ``upstream`` is the relay above it) every request an edge sends up costs
the root. A track has at most one upstream subscription whatever the number of subscribers,
and a FETCH of a range already in flight upstream waits for that one and is served from
the cache it fills. An edge is otherwise an ordinary peer of its upstream: it announces,
follows prefixes and PUBLISHes pushed tracks there as any publisher or subscriber would, so
the root can be any draft-14 relay.

Why a publisher runs this too: serving a track is the same work wherever its objects come
from, so a process that writes tracks itself (``aio.api.Publisher``) keeps them here as
*local* tracks (``open_local``, ``write_local``, ``end_local``, ``close_local``): an upstream
that is this process, always live, kept in a pinned part of the cache (``RelayCache.pin``).
Its sessions' SUBSCRIBE, FETCH, TRACK_STATUS and SUBSCRIBE_NAMESPACE get exactly the answers a
relay gives, by the same code, and a subscriber slower than the writer reads the pinned cache
at its own pace instead of holding the writer back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from ..protocol import events as ev
from ..protocol.errors import (
    FetchErrorCode,
    PublishDoneStatus,
    PublishErrorCode,
    PublishNamespaceErrorCode,
    SessionErrorCode,
    SubscribeErrorCode,
    SubscribeNamespaceErrorCode,
    UsageError,
)
from ..protocol.messages import (
    FetchOk,
    FilterType,
    PublishOk,
    Subscribe,
    SubscribeOk,
    SubscriptionFilter,
    TrackStatusOk,
)
from ..protocol.model import (
    FullTrackName,
    Location,
    TrackObject,
    has_prefix,
    known_order,
)
from ..protocol.session import MoqtSession
from ..protocol.windows import (
    after,
)
from .auth import AuthError, Authorizer, Grant
from .cache import RelayCache
from .fetching import Fetching
from .outbox import EndStream
from .records import (
    LOCAL_STREAM,
    Offer,
    Peer,
    PeerLink,
    RelayCounters,
    RelayLimits,
    Track,
    Upstream,
    UpstreamState,
)
from .routing import Namespace, NamespaceTable, RoutingLimitExceeded
from .serving import Serving

logger = logging.getLogger(__name__)


class Relay:
    """See the module docstring. One instance serves every session of a relay process."""

    def __init__(
        self, limits: RelayLimits | None = None, authorizer: Authorizer | None = None
    ) -> None:
        self.limits = limits or RelayLimits()
        # Checks each session's token at SETUP (``auth``); None: everyone may do anything.
        self.authorizer = authorizer
        self.cache = RelayCache(self.limits.cache_bytes)
        self.namespaces: NamespaceTable[Peer] = NamespaceTable(
            self.limits.max_namespaces, self.limits.max_prefixes_per_peer
        )
        self.tracks: dict[FullTrackName, Track] = {}
        self.peers: set[Peer] = set()
        self.counters = RelayCounters()
        # The relay this one is an edge of, while connected (see ``attach_upstream``).
        self.upstream: Peer | None = None
        self._upstream_prefixes: set[Namespace] = set()  # SUBSCRIBE_NAMESPACEs sent to it
        self._local: set[FullTrackName] = set()  # opened here and not closed
        # Cached tracks nobody can send any more, and since when (``expire_orphans``).
        self._orphaned: dict[FullTrackName, float] = {}
        self.serving = Serving(
            self.cache,
            self.counters,
            self.limits.max_queued_bytes,
            failed=self._fail,
            released=self._drop_idle,
        )
        self.fetching = Fetching(
            self.cache, self.counters, self.serving, self.peers, self.limits.max_queued_bytes
        )

    # ------------------------------------------------------------------------------------
    # Driving the relay.

    def add_peer(self, moqt: MoqtSession, link: PeerLink, name: str = "") -> Peer:
        grant = Grant.everything() if self.authorizer is None else Grant.nothing()
        peer = Peer(moqt, link, name, grant=grant)
        self.peers.add(peer)
        return peer

    def expire_grants(self, now: float) -> None:
        """End the sessions whose token expired by ``now`` (Unix seconds). Never raises."""
        for peer in [p for p in self.peers if p.grant.expired(now)]:
            self._refuse_session(peer, AuthError(SessionErrorCode.EXPIRED_AUTH_TOKEN, "expired"))
        self.serving.transmit()

    def expire_orphans(self, now: float) -> None:
        """Drop from the cache the tracks nobody could send for ``limits.retention`` seconds
        (``now`` on any steady clock; called about once a second). A track with subscribers
        reading it stays until they leave."""
        retention = self.limits.retention
        if retention is None:
            return
        cached = set(self.cache.tracks())
        for name in cached:
            track = self.tracks.get(name)
            live = track is not None and track.upstream is not None
            if live or self.namespaces.route(name.namespace) or self.upstream is not None:
                self._orphaned.pop(name, None)
                continue
            since = self._orphaned.setdefault(name, now)
            if now - since >= retention and (track is None or not track.subscribers):
                self.cache.drop(name)
                del self._orphaned[name]
                self.counters.tracks_expired += 1
        for name in [n for n in self._orphaned if n not in cached]:
            del self._orphaned[name]

    def _on_setup(self, peer: Peer, event: ev.SetupCompleted) -> None:
        """A client's SETUP: what its token grants it. A session this relay opened itself
        (to its upstream relay, where it is the client) is granted everything."""
        if peer.moqt.is_client:
            peer.grant = Grant.everything()  # a session this relay opened: to its upstream
            return
        if self.authorizer is None:
            return
        try:
            peer.grant = self.authorizer.grant(event.parameters)
        except AuthError as exc:
            self._refuse_session(peer, exc)

    def _refuse_session(self, peer: Peer, error: AuthError) -> None:
        logger.warning("relay: session %s refused: %s", peer.name, error.reason)
        if not peer.moqt.closed:
            peer.moqt.close(error.code, error.reason)
            peer.link.transmit()
        self._peer_left(peer)

    def _unauthorized(
        self, peer: Peer, request_id: int, namespace: Namespace, *, publish: bool, code: int
    ) -> bool:
        """Refuse a request outside the session's grant (``code``, the request type's
        UNAUTHORIZED, and a log line); whether it was refused."""
        grant = peer.grant
        if grant.may_publish(namespace) if publish else grant.may_subscribe(namespace):
            return False
        action = "publish" if publish else "subscribe to"
        logger.warning("relay: %s may not %s %r", peer.name, action, namespace)
        self.serving.session(peer).reject(request_id, code, "not authorized")
        return True

    def attach_upstream(self, peer: Peer) -> None:
        """Make ``peer`` (a session this relay opened, set up) the relay it is an edge of.

        The edge tells it of every namespace published here, PUBLISHes to it every track
        pushed here, follows upstream every prefix followed here, and sends it whatever
        SUBSCRIBE, FETCH or TRACK_STATUS neither
        a publisher here nor the cache can answer: one upstream subscription per track
        whatever the number of subscribers here, as for any publisher.
        """
        self.upstream = peer
        self.counters.upstream_sessions += 1
        self._upstream_prefixes = set()
        self._guarded(peer, self._tell_upstream)

    def _tell_upstream(self, upstream: Peer) -> None:
        for namespace in self.namespaces.published_under(()):
            self._announce(upstream, namespace)
        for prefix in self.namespaces.followed():
            self._follow_upstream(prefix)
        for track in list(self.tracks.values()):
            self._offer(upstream, track)  # the pushed ones
            if track.upstream_in(UpstreamState.LOST):
                self._resume(upstream, track)

    def resume_lost(self) -> bool:
        """Subscribe again upstream for every track whose subscribers wait for the upstream
        relay (when it is back); whether any still wait. Never raises."""
        waiting = False
        for track in list(self.tracks.values()):
            if track.upstream_in(UpstreamState.LOST):
                waiting = True
                if self.upstream is not None:
                    self._guarded(self.upstream, lambda up, t=track: self._resume(up, t))
        return waiting

    def _resume(self, upstream: Peer, track: Track) -> None:
        """Subscribe again, right after the last object that came, for subscribers that
        waited while the upstream relay was away; they go on as if it never left."""
        wanted = SubscriptionFilter(FilterType.ABSOLUTE_START, after(track.largest))
        if not self._subscribe_upstream(upstream, track, wanted):
            assert track.upstream is not None
            track.upstream.end(PublishDoneStatus.GOING_AWAY, "cannot subscribe upstream again")
            self._upstream_over(track)

    def handle(self, peer: Peer, event: ev.MoqtEvent) -> None:
        """Act on one event of ``peer``'s session. Never raises."""
        handler = self._HANDLERS.get(type(event))
        if handler is not None:
            self._guarded(peer, lambda p: handler(self, p, event))

    def resume(self, peer: Peer) -> None:
        """The peer's connection drained: write what waits for it. Never raises."""
        peer.drained()
        self._guarded(peer, self.serving.flush)

    def _guarded(self, peer: Peer, action: Callable[[Peer], None]) -> None:
        """Run ``action``; a bug closes the peer's session, never the relay."""
        try:
            if not peer.gone:
                action(peer)
        except Exception:
            self._fail(peer)
        self.serving.transmit()

    def _fail(self, peer: Peer) -> None:
        logger.exception("relay: internal error serving %s", peer.name)
        if not peer.moqt.closed:
            peer.moqt.close(SessionErrorCode.INTERNAL_ERROR, "relay internal error")
            peer.link.transmit()
        self._peer_left(peer)

    # ------------------------------------------------------------------------------------
    # Tracks this process writes (see the module docstring).

    def open_local(self, name: FullTrackName, max_bytes: int) -> Track:
        """Start a track this process writes, held in at most ``max_bytes`` of pinned cache
        (its oldest groups go past that); namespace subscribers hear of it. UsageError when
        the relay holds as many tracks as it may, or the track has a publisher already."""
        track = self._track(name)
        if track is None:
            raise UsageError(f"{name}: the relay holds {self.limits.max_tracks} tracks")
        if track.upstream is not None:
            raise UsageError(f"{name} already has a publisher")
        self.cache.pin(name, max_bytes)
        self._local.add(name)
        track.attach(Upstream(None, 0, UpstreamState.LIVE, pushed=True))
        for follower in self.namespaces.interested_in(name.namespace):
            self._guarded(follower, lambda peer: self._tell_local(peer, track))
        return track

    def _tell_local(self, peer: Peer, track: Track) -> None:
        self._announce(peer, track.name.namespace)
        self._offer(peer, track)

    def write_local(
        self, track: Track, group_id: int, obj: TrackObject, *, end_of_group: bool
    ) -> None:
        """Cache one object of a local track and send it on to its subscribers; its group
        ends with ``end_of_group`` or when a later group begins. The caller keeps locations
        increasing; ValueError for an object larger than the track's bound."""
        open_group = track.live_streams.get(LOCAL_STREAM)
        if open_group is not None and open_group[0] != group_id:
            self._stream_over(track, LOCAL_STREAM, reset=False)
        self._arrived(track, LOCAL_STREAM, group_id, obj)
        if end_of_group:
            self._stream_over(track, LOCAL_STREAM, reset=False)
        self.serving.transmit()

    def end_local(self, track: Track) -> None:
        """End a local track: subscribers get PUBLISH_DONE (TRACK_ENDED) once they have what
        it holds, and later requests are served from the pinned cache until ``close_local``."""
        if not track.local:
            return  # ended already
        assert track.upstream is not None
        track.upstream.end(PublishDoneStatus.TRACK_ENDED, "track ended")
        if LOCAL_STREAM in track.live_streams:
            self._stream_over(track, LOCAL_STREAM, reset=False)  # ends the track too
        else:
            self._upstream_over(track)
        self.serving.transmit()

    def close_local(self, name: FullTrackName) -> None:
        """End a local track and forget what it holds; a namespace with no local track left
        is withdrawn (PUBLISH_NAMESPACE_DONE) from the peers that were told of it."""
        track = self.tracks.get(name)
        if track is not None:
            self.end_local(track)
        self.cache.unpin(name)
        self._local.discard(name)
        if not self._local_namespaces(name.namespace):
            self._withdraw(name.namespace)
        self.serving.transmit()

    def queued_bytes(self, track: Track) -> int:
        """The most object bytes waiting for one subscriber of ``track`` (in its peer's
        outbox): what a writer that paces itself to its slowest subscriber watches."""
        return max((sub.peer.outbox.queued_bytes for sub in track.subscribers), default=0)

    def local_bytes(self, namespace: Namespace) -> int:
        """Object bytes the local tracks of ``namespace`` hold."""
        return sum(self.cache.track_bytes(n) for n in self._local if n.namespace == namespace)

    def _local_namespaces(self, prefix: Namespace) -> set[Namespace]:
        return {n.namespace for n in self._local if has_prefix(n.namespace, prefix)}

    # ------------------------------------------------------------------------------------
    # Namespaces.

    def _on_namespace_published(self, peer: Peer, event: ev.NamespacePublished) -> None:
        message = event.message
        unauthorized = PublishNamespaceErrorCode.UNAUTHORIZED
        if self._unauthorized(
            peer, message.request_id, message.namespace, publish=True, code=unauthorized
        ):
            return
        try:
            self._publish_namespace(peer, message.namespace)
        except RoutingLimitExceeded as exc:
            self.serving.session(peer).reject(
                message.request_id, PublishNamespaceErrorCode.INTERNAL_ERROR, str(exc)
            )
            return
        self.serving.session(peer).publish_namespace_ok(message.request_id)

    def _publish_namespace(self, peer: Peer, namespace: Namespace) -> None:
        """Route ``namespace`` to ``peer``; followers hear of it if it is new."""
        if self.namespaces.add_publisher(namespace, peer):
            for follower in self.namespaces.interested_in(namespace):
                self._announce(follower, namespace)
            if self.upstream is not None:
                self._announce(self.upstream, namespace)

    def _on_namespace_done(self, peer: Peer, event: ev.NamespacePublishDone) -> None:
        if self.namespaces.remove_publisher(event.namespace, peer):
            self._withdraw(event.namespace)

    def _on_namespace_subscribe(self, peer: Peer, event: ev.NamespaceSubscribeRequested) -> None:
        message = event.message
        if not peer.grant.may_follow(message.namespace):
            logger.warning("relay: %s may not follow %r", peer.name, message.namespace)
            self.serving.session(peer).reject(
                message.request_id, SubscribeNamespaceErrorCode.UNAUTHORIZED, "not authorized"
            )
            return
        try:
            self.namespaces.add_prefix(peer, message.namespace)
        except RoutingLimitExceeded as exc:
            self.serving.session(peer).reject(
                message.request_id, SubscribeNamespaceErrorCode.INTERNAL_ERROR, str(exc)
            )
            return
        self.serving.session(peer).subscribe_namespace_ok(message.request_id)
        published = self.namespaces.published_under(message.namespace)
        for namespace in sorted({*published, *self._local_namespaces(message.namespace)}):
            self._announce(peer, namespace)
        for track in list(self.tracks.values()):
            if has_prefix(track.name.namespace, message.namespace):
                self._offer(peer, track)
        if peer is not self.upstream:
            self._follow_upstream(message.namespace)

    def _follow_upstream(self, prefix: Namespace) -> None:
        """Ask the upstream relay, once per prefix, to announce what it knows under it."""
        upstream = self.upstream
        if upstream is None or prefix in self._upstream_prefixes:
            return
        try:
            self.serving.session(upstream).subscribe_namespace(prefix)
        except UsageError as exc:  # upstream gave us no request ids left
            logger.info("relay: cannot follow %r upstream: %s", prefix, exc)
            return
        self._upstream_prefixes.add(prefix)

    def _on_namespace_unsubscribed(self, peer: Peer, event: ev.NamespaceUnsubscribed) -> None:
        self.namespaces.remove_prefix(peer, event.prefix)

    def _on_namespace_cancelled(self, peer: Peer, event: ev.NamespacePublishCancelled) -> None:
        peer.announced.discard(event.message.namespace)

    def _announce(self, peer: Peer, namespace: Namespace) -> None:
        """Tell a namespace subscriber of a namespace (never its own, nor one it may not read)."""
        if (
            namespace in peer.announced
            or peer in self.namespaces.publishers(namespace)
            or not peer.grant.may_subscribe(namespace)
        ):
            return
        try:
            self.serving.session(peer).publish_namespace(namespace)
        except UsageError as exc:  # the follower gave us no request ids left: it misses this one
            logger.info("relay: cannot announce %r to %s: %s", namespace, peer.name, exc)
            return
        peer.announced.add(namespace)

    def _withdraw(self, namespace: Namespace) -> None:
        for peer in self.peers:
            if namespace in peer.announced and not peer.gone:
                peer.announced.discard(namespace)
                self.serving.session(peer).publish_namespace_done(namespace)

    # ------------------------------------------------------------------------------------
    # SUBSCRIBE: from the cache, through an upstream subscription, or both.

    def _on_subscribe(self, peer: Peer, event: ev.SubscribeRequested) -> None:
        message = event.message
        self.counters.subscribes_received += 1
        unauthorized = SubscribeErrorCode.UNAUTHORIZED
        if self._unauthorized(
            peer, message.request_id, message.track.namespace, publish=False, code=unauthorized
        ):
            return
        track = self.tracks.get(message.track)
        if (
            track is not None
            and len(track.subscribers) + len(track.waiting) >= self.limits.max_subscribers_per_track
        ):
            self.serving.session(peer).reject(
                message.request_id, SubscribeErrorCode.INTERNAL_ERROR, "too many subscribers"
            )
            return
        if track is not None and track.upstream is not None:
            if not track.upstream_in(UpstreamState.SUBSCRIBING):  # live, or ending: answer now
                self._accept(peer, track, message)
            else:
                track.waiting.append((peer, message))
            return
        publisher = self._route(message.track, peer)
        if publisher is not None:
            track = self._track(message.track)
            if track is None:
                self.serving.session(peer).reject(
                    message.request_id, SubscribeErrorCode.INTERNAL_ERROR, "too many tracks"
                )
                return
            if self._subscribe_upstream(publisher, track, message.filter):
                track.waiting.append((peer, message))
                return
        if self.cache.has_track(message.track):
            track = self._track(message.track)
            if track is not None:
                self._accept(peer, track, message)
                return
        self.serving.session(peer).reject(
            message.request_id, SubscribeErrorCode.TRACK_DOES_NOT_EXIST, "no such track"
        )
        self._drop_idle(message.track)

    def _subscribe_upstream(
        self, publisher: Peer, track: Track, wanted: SubscriptionFilter
    ) -> bool:
        """Subscribe upstream with the first subscriber's filter, open-ended for later ones."""
        if wanted.filter_type == FilterType.ABSOLUTE_RANGE:
            wanted = SubscriptionFilter(FilterType.ABSOLUTE_START, wanted.start)
        try:
            request_id = self.serving.session(publisher).subscribe(track.name, filter=wanted)
        except UsageError as exc:
            logger.info("relay: cannot subscribe upstream to %s: %s", track.name, exc)
            return False
        track.attach(Upstream(publisher, request_id, UpstreamState.SUBSCRIBING))
        self.counters.subscribes_sent += 1
        return True

    def _accept(self, peer: Peer, track: Track, message: Subscribe) -> None:
        largest = self.serving.largest(track)
        self.serving.session(peer).subscribe_ok(
            message.request_id, group_order=track.group_order, largest=largest
        )
        absolute = message.filter.filter_type in (
            FilterType.ABSOLUTE_START,
            FilterType.ABSOLUTE_RANGE,
        )
        self.serving.serve(peer, message.request_id, track, message, largest, replay=absolute)

    def _on_upstream_accepted(self, peer: Peer, event: ev.RequestAccepted) -> None:
        message = event.message
        if isinstance(message, SubscribeOk):
            track = peer.upstreams.get(event.request_id)
            if track is None or not track.upstream_in(UpstreamState.SUBSCRIBING):
                return
            assert track.upstream is not None
            track.upstream.state = UpstreamState.LIVE
            track.group_order = known_order(message.group_order)
            if message.largest is not None and (
                track.largest is None or message.largest > track.largest
            ):
                track.largest = message.largest
            waiting, track.waiting = track.waiting, []
            for subscriber, subscribe in waiting:
                if not subscriber.gone:
                    self._accept(subscriber, track, subscribe)
        elif isinstance(message, FetchOk):
            self.fetching.accepted(peer, event.request_id, message)
        elif isinstance(message, PublishOk):
            offer = peer.offers.pop(event.request_id, None)
            if offer is None:
                return
            if offer.track.upstream is None or self.tracks.get(offer.track.name) is not offer.track:
                self.serving.session(peer).publish_done(
                    event.request_id, PublishDoneStatus.TRACK_ENDED, "the publisher is gone"
                )
                return
            # From the cache first: what arrived since the PUBLISH went out is there.
            self.serving.serve(
                peer, event.request_id, offer.track, message, offer.largest, replay=True
            )
        elif isinstance(message, TrackStatusOk):
            asker = peer.status_requests.pop(event.request_id, None)
            if asker is not None and not asker[0].gone:
                self.serving.session(asker[0]).track_status_ok(
                    asker[1], largest=message.largest, group_order=message.group_order
                )

    def _on_upstream_rejected(self, peer: Peer, event: ev.RequestRejected) -> None:
        request_id = event.request_id
        code, reason = event.message.error_code, event.message.reason
        track = peer.upstreams.get(request_id)
        if track is not None:
            track.detach()
            self._settle_waiting(track, code, reason)
            if peer is self.upstream and track.subscribers:
                # A resumed subscription the upstream relay cannot route yet (the edge with
                # the publisher has not announced again): wait on, and try again.
                track.upstream = Upstream(peer, request_id, UpstreamState.LOST)
            self._drop_idle(track.name)
        self.fetching.rejected(peer, request_id, code, reason)
        asker = peer.status_requests.pop(request_id, None)
        if asker is not None and not asker[0].gone:
            self.serving.session(asker[0]).reject(asker[1], code, reason)
        peer.offers.pop(request_id, None)

    def _on_subscribe_updated(self, peer: Peer, event: ev.SubscribeUpdated) -> None:
        message = event.message
        sub = peer.downstreams.get(message.subscription_request_id)
        if sub is not None:  # an update only narrows
            sub.start = max(sub.start, message.start)
            if message.end_group is not None:
                sub.end_group = min(message.end_group, sub.end_group or message.end_group)
            sub.forward = message.forward

    def _on_unsubscribed(self, peer: Peer, event: ev.Unsubscribed) -> None:
        sub = peer.downstreams.pop(event.request_id, None)
        if sub is not None:
            self.serving.cancel(sub, reset_streams=True)
            return
        for track in self.tracks.values():
            track.waiting = [
                (p, m)
                for p, m in track.waiting
                if p is not peer or m.request_id != event.request_id
            ]

    def _on_publish_ended(self, peer: Peer, event: ev.SubscriptionEnded) -> None:
        track = peer.upstreams.get(event.request_id)
        if track is not None and track.upstream is not None:
            track.upstream.end(event.message.status_code, event.message.reason)
            self._upstream_over(track)

    # ------------------------------------------------------------------------------------
    # PUBLISH: a track pushed by its publisher.

    def _on_publish(self, peer: Peer, event: ev.PublishRequested) -> None:
        message = event.message
        unauthorized = PublishErrorCode.UNAUTHORIZED
        if self._unauthorized(
            peer, message.request_id, message.track.namespace, publish=True, code=unauthorized
        ):
            return
        track = self._track(message.track)
        if track is None or track.upstream is not None:
            reason = "too many tracks" if track is None else "the track already has a publisher"
            self.serving.session(peer).reject(
                message.request_id, PublishErrorCode.NOT_SUPPORTED, reason
            )
            return
        self.serving.session(peer).publish_ok(message.request_id, group_order=message.group_order)
        track.attach(Upstream(peer, message.request_id, UpstreamState.LIVE, pushed=True))
        track.group_order = known_order(message.group_order)
        track.largest = message.largest
        try:
            self._publish_namespace(peer, message.track.namespace)  # PUBLISH implies it
        except RoutingLimitExceeded as exc:  # the track itself is still relayed
            logger.info("relay: %s: %s", message.track, exc)
        for follower in self.namespaces.interested_in(message.track.namespace):
            self._offer(follower, track)
        if self.upstream is not None:  # an edge pushes it on: the root offers it to others
            self._offer(self.upstream, track)

    def _offer(self, peer: Peer, track: Track) -> None:
        """PUBLISH a pushed track to a namespace subscriber (draft-14: the recipient of
        SUBSCRIBE_NAMESPACE sends PUBLISH for the matching tracks), once per track."""
        upstream = track.upstream
        if (
            upstream is None
            or not upstream.pushed
            or upstream.state is not UpstreamState.LIVE
            or upstream.peer is peer
            or not peer.grant.may_subscribe(track.name.namespace)
            or any(offer.track is track for offer in peer.offers.values())
            or any(sub.track is track for sub in peer.downstreams.values())
        ):
            return
        largest = self.serving.largest(track)
        try:
            request_id = self.serving.session(peer).publish(
                track.name, group_order=track.group_order, largest=largest
            )
        except UsageError as exc:  # no request ids left, or it already gets the track
            logger.info("relay: cannot offer %s to %s: %s", track.name, peer.name, exc)
            return
        peer.offers[request_id] = Offer(track, largest)

    # ------------------------------------------------------------------------------------
    # TRACK_STATUS.

    def _on_track_status(self, peer: Peer, event: ev.TrackStatusRequested) -> None:
        message = event.message
        unauthorized = SubscribeErrorCode.UNAUTHORIZED
        if self._unauthorized(
            peer, message.request_id, message.track.namespace, publish=False, code=unauthorized
        ):
            return
        track = self.tracks.get(message.track)
        if track is not None and track.upstream_in(UpstreamState.LIVE):
            self.serving.session(peer).track_status_ok(
                message.request_id,
                largest=self.serving.largest(track),
                group_order=track.group_order,
            )
            return
        publisher = self._route(message.track, peer)
        if publisher is not None:
            try:
                request_id = self.serving.session(publisher).track_status(message.track)
            except UsageError:
                pass
            else:
                publisher.status_requests[request_id] = (peer, message.request_id)
                return
        largest = self.cache.largest(message.track)
        if largest is not None:
            self.serving.session(peer).track_status_ok(message.request_id, largest=largest)
        else:
            self.serving.session(peer).reject(
                message.request_id, SubscribeErrorCode.TRACK_DOES_NOT_EXIST, "no such track"
            )

    # ------------------------------------------------------------------------------------
    # FETCH: from the cache when it holds the whole range, else from the publisher.

    def _on_fetch(self, peer: Peer, event: ev.FetchRequested) -> None:
        message = event.message
        self.counters.fetches_received += 1
        unauthorized = FetchErrorCode.UNAUTHORIZED
        if self._unauthorized(
            peer, message.request_id, event.track.namespace, publish=False, code=unauthorized
        ):
            return
        self.fetching.request(peer, message, event.track, self._route(event.track, peer))

    def _on_fetch_cancelled(self, peer: Peer, event: ev.FetchCancelled) -> None:
        self.fetching.cancelled(peer, event.request_id)

    # ------------------------------------------------------------------------------------
    # Objects from upstream.

    def _on_object(self, peer: Peer, event: ev.ObjectReceived) -> None:
        subgroup = event.subgroup_id if event.subgroup_id is not None else event.object_id
        obj = TrackObject(
            event.object_id,
            event.body.payload,
            event.body.status,
            event.body.extensions,
            subgroup,
            event.publisher_priority,
        )
        self.counters.object_bytes_received += len(obj.payload)
        if event.source == ev.ObjectSource.FETCH:
            self.fetching.object(peer, event, obj)
            return
        track = peer.upstreams.get(event.request_id)
        if track is None:
            return
        if event.source == ev.ObjectSource.DATAGRAM:
            if self._cache_new(track, event.group_id, obj):
                self.serving.forward_datagram(track, event)
            return
        assert event.stream_id is not None
        self._arrived(track, event.stream_id, event.group_id, obj)

    def _cache_new(self, track: Track, group_id: int, obj: TrackObject) -> bool:
        """Cache an object from upstream; False if the group was whole here already."""
        location = Location(group_id, obj.object_id)
        if track.largest is None or location > track.largest:
            track.largest = location
        cached = self.cache.group(track.name, group_id, touch=False)
        if cached is not None and cached.complete:
            # Sent again: an upstream relay replays what this edge already holds whole for a
            # later subscriber. Whoever here wants the group read it from the cache already.
            return False
        self.cache.add(track.name, group_id, obj)
        return True

    def _arrived(self, track: Track, stream: int, group_id: int, obj: TrackObject) -> None:
        """An object on one of the track's live group streams: cache it, pass it on."""
        if not self._cache_new(track, group_id, obj):
            return
        track.live_streams[stream] = (group_id, obj.subgroup_id)
        self.serving.arrived(track, group_id, obj)

    def _on_stream_ended(self, peer: Peer, event: ev.DataStreamEnded | ev.DataStreamReset) -> None:
        reset = isinstance(event, ev.DataStreamReset)
        if self.fetching.stream_ended(peer, event.request_id, reset):
            return
        track = peer.upstreams.get(event.request_id)
        if track is not None:
            self._stream_over(track, event.stream_id, reset)

    def _stream_over(self, track: Track, stream: int, reset: bool) -> None:
        """One of the track's live group streams ended: its group is whole unless ``reset``,
        or unless the stream joined the group mid-way. A subscription that starts after the
        newest object gets the rest of that group, and when there is none, only an
        END_OF_GROUP status object: a group without its object 0 is not whole here, however
        its stream ended (a FETCH of it goes upstream)."""
        key = track.live_streams.pop(stream, None)
        if key is None:
            return
        group = self.cache.group(track.name, key[0], touch=False)
        if not reset and group is not None and 0 in group.objects:
            self.cache.mark_complete(track.name, key[0])
        for sub in track.subscribers:
            self.serving.enqueue(sub.peer, EndStream(sub, key, reset))
        if track.upstream_in(UpstreamState.ENDING):
            self._upstream_over(track)

    def _on_stream_stopped(self, peer: Peer, event: ev.DataStreamStopped) -> None:
        sub = peer.downstreams.get(event.request_id)
        if sub is not None:
            for stream in sub.streams.values():
                if stream.stream_id == event.stream_id:
                    stream.stopped = True
            return
        fetch = peer.fetches.pop(event.request_id, None)
        if fetch is not None:
            fetch.stream_id = None
            peer.outbox.purge(fetch)

    # ------------------------------------------------------------------------------------
    # Peers leaving.

    def _on_closed(self, peer: Peer, event: ev.SessionClosed) -> None:
        self._peer_left(peer)

    def _peer_left(self, peer: Peer) -> None:
        if not peer.leave():
            return
        self.peers.discard(peer)
        left = "the publisher left"
        lost_upstream = peer is self.upstream
        if lost_upstream:
            self.upstream, left = None, "the upstream relay left"
        self.serving.forget(peer)
        peer.outbox.clear()
        for namespace in self.namespaces.remove_peer(peer):
            self._withdraw(namespace)
        for track in list(peer.upstreams.values()):
            for sub in track.subscribers:
                for key in track.live_streams.values():
                    self.serving.enqueue(sub.peer, EndStream(sub, key, reset=True))
            track.live_streams.clear()
            upstream = track.upstream
            if upstream is None:
                continue
            if lost_upstream and track.subscribers and not upstream.pushed:
                upstream.state = UpstreamState.LOST  # until the upstream relay is back
                self._settle_waiting(track, SubscribeErrorCode.INTERNAL_ERROR, left)
                continue
            upstream.end(PublishDoneStatus.GOING_AWAY, left)
            self._upstream_over(track)
        self.fetching.upstream_left(peer, left)
        for sub in list(peer.downstreams.values()):
            self.serving.cancel(sub, reset_streams=False)
        for track in list(self.tracks.values()):
            track.waiting = [(p, m) for p, m in track.waiting if p is not peer]
            self._drop_idle(track.name)

    def _upstream_over(self, track: Track) -> None:
        """The upstream ended or left; subscriptions end once its streams have."""
        if track.live_streams:
            return
        upstream = track.detach()
        status, reason = (
            upstream.done if upstream is not None else (PublishDoneStatus.TRACK_ENDED, "")
        )
        for sub in list(track.subscribers):
            if sub.live:
                self.serving.end(sub, status, reason)
        self._settle_waiting(track, SubscribeErrorCode.INTERNAL_ERROR, "the publisher left")
        self._drop_idle(track.name)

    def _settle_waiting(self, track: Track, code: int, reason: str) -> None:
        """SUBSCRIBEs that waited for an upstream that will not answer them: served from the
        cache if it holds the track (a publisher that left, or refused, does not take what
        the relay holds with it: decoders still load a restarted prefill pod's prompts),
        else refused with ``code``."""
        waiting, track.waiting = track.waiting, []
        cached = self.cache.has_track(track.name)
        for subscriber, subscribe in waiting:
            if subscriber.gone:
                continue
            if cached:
                self._accept(subscriber, track, subscribe)
            else:
                self.serving.session(subscriber).reject(subscribe.request_id, code, reason)

    def give_up_upstream(self) -> None:
        """The upstream relay has stayed away too long: end the subscriptions that waited
        for it (PUBLISH_DONE GOING_AWAY). Never raises."""
        for track in list(self.tracks.values()):
            if track.upstream is not None and track.upstream_in(UpstreamState.LOST):
                track.upstream.end(PublishDoneStatus.GOING_AWAY, "the upstream relay left")
                try:
                    self._upstream_over(track)
                except Exception:
                    logger.exception("relay: ending %s", track.name)
        self.serving.transmit()

    # ------------------------------------------------------------------------------------
    # Helpers.

    def _track(self, name: FullTrackName) -> Track | None:
        """The relay's track ``name``, created if there is room (made by ending a lingering
        upstream subscription nobody reads any more, if need be)."""
        track = self.tracks.get(name)
        if track is None and len(self.tracks) >= self.limits.max_tracks:
            self._end_one_lingering()
        if track is None and len(self.tracks) < self.limits.max_tracks:
            track = self.tracks[name] = Track(name)
        return track

    def _end_one_lingering(self) -> None:
        for track in self.tracks.values():
            upstream = track.upstream
            if (
                upstream is not None
                and upstream.state is UpstreamState.LIVE
                and not upstream.pushed
                and not track.subscribers
                and not track.waiting
            ):
                track.detach()
                assert upstream.peer is not None  # pushed=False: a SUBSCRIBE we sent
                self.serving.session(upstream.peer).unsubscribe(upstream.request_id)
                track.live_streams.clear()
                self._drop_idle(track.name)
                return

    def _drop_idle(self, name: FullTrackName) -> None:
        track = self.tracks.get(name)
        if (
            track is not None
            and (track.upstream is None or track.upstream_in(UpstreamState.LOST))
            and not track.subscribers
            and not track.waiting
            and not track.live_streams
        ):
            del self.tracks[name]

    def _route(self, name: FullTrackName, asker: Peer) -> Peer | None:
        """Who to ask for a track: its live upstream, else the newest publisher of its longest
        published namespace prefix, else the upstream relay (on an edge); never the asker."""
        track = self.tracks.get(name)
        if (
            track is not None
            and track.upstream is not None
            and track.upstream_in(UpstreamState.LIVE)
        ):
            publisher: Peer | None = track.upstream.peer
        else:
            publisher = self.namespaces.route(name.namespace) or self.upstream
        return None if publisher is asker else publisher

    _HANDLERS: ClassVar[dict[type[ev.MoqtEvent], Callable[[Relay, Peer, Any], None]]] = {
        ev.SetupCompleted: _on_setup,
        ev.NamespacePublished: _on_namespace_published,
        ev.NamespacePublishDone: _on_namespace_done,
        ev.NamespacePublishCancelled: _on_namespace_cancelled,
        ev.NamespaceSubscribeRequested: _on_namespace_subscribe,
        ev.NamespaceUnsubscribed: _on_namespace_unsubscribed,
        ev.SubscribeRequested: _on_subscribe,
        ev.SubscribeUpdated: _on_subscribe_updated,
        ev.Unsubscribed: _on_unsubscribed,
        ev.PublishRequested: _on_publish,
        ev.TrackStatusRequested: _on_track_status,
        ev.FetchRequested: _on_fetch,
        ev.FetchCancelled: _on_fetch_cancelled,
        ev.RequestAccepted: _on_upstream_accepted,
        ev.RequestRejected: _on_upstream_rejected,
        ev.SubscriptionEnded: _on_publish_ended,
        ev.ObjectReceived: _on_object,
        ev.DataStreamEnded: _on_stream_ended,
        ev.DataStreamReset: _on_stream_ended,
        ev.DataStreamStopped: _on_stream_stopped,
        ev.SessionClosed: _on_closed,
    }
