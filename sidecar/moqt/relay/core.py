"""The relay: an origin (``protocol.origin``) that also fills its cache from publishers,
routes requests to them, and checks who may do what.

Sans-I/O like the origin it extends; everything answered from what is held (a publisher's
tracks, the cache, FETCH from the cache, namespace subscribers told and offered tracks) is
the origin's code. What this module adds: authorization (``auth``: a grant per session from
its token at SETUP), namespaces and routing (``routing``: who publishes what; the newest
publisher of the longest prefix is asked), one upstream subscription per track, PUBLISH
from publishers, FETCH upstream (``fetching``), an edge's upstream relay, how long a
gone publisher's tracks are still served from the cache (``retention``), and SUBSCRIBEs
held until their track has a publisher (``rendezvous``: draft 18).

Why one upstream request per track or range: the relay is a point of fan-out, and in a
cluster (an edge's ``upstream`` is the relay above it) every request an edge sends up costs
the root. A track has at most one upstream subscription whatever the number of subscribers,
and a FETCH of a range already in flight upstream waits for that one and is served from
the cache it fills. An edge is otherwise an ordinary peer of its upstream: it announces,
follows prefixes and PUBLISHes pushed tracks there as any publisher or subscriber would, so
the root can be any draft-14 relay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import ClassVar

from ..protocol import events as ev
from ..protocol.errors import (
    PublishDoneStatus,
    PublishErrorCode,
    PublishNamespaceErrorCode,
    SessionErrorCode,
    SubscribeErrorCode,
    UsageError,
)
from ..protocol.messages import (
    Fetch,
    FetchOk,
    FilterType,
    Subscribe,
    SubscribeOk,
    SubscriptionFilter,
    TrackStatusOk,
)
from ..protocol.model import FullTrackName, TrackObject, known_order
from ..protocol.origin import Origin
from ..protocol.outbox import EndStream
from ..protocol.records import (
    DownstreamFetch,
    Namespace,
    Peer,
    PeerLink,
    Track,
    Upstream,
    UpstreamState,
)
from ..protocol.session import MoqtSession
from ..protocol.windows import after
from .auth import AuthError, Authorizer, Grant
from .fetching import Fetching
from .records import RelayCounters, RelayLimits, RelayPeer
from .rendezvous import Rendezvous
from .routing import NamespaceTable, RoutingLimitExceeded

logger = logging.getLogger(__name__)


class Relay(Origin):
    """See the module docstring. One instance serves every session of a relay process."""

    limits: RelayLimits
    counters: RelayCounters
    peers: set[RelayPeer]  # type: ignore[assignment]

    def __init__(
        self,
        limits: RelayLimits | None = None,
        authorizer: Authorizer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` times held SUBSCRIBEs: `tick` must be given its time."""
        limits = limits or RelayLimits()
        super().__init__(limits, RelayCounters())
        # Checks each session's token at SETUP (``auth``); None: everyone may do anything.
        self.authorizer = authorizer
        self.namespaces: NamespaceTable[RelayPeer] = NamespaceTable(limits.max_namespaces)
        # The relay this one is an edge of, while connected (see ``attach_upstream``).
        self.upstream: RelayPeer | None = None
        self._upstream_prefixes: set[Namespace] = set()  # SUBSCRIBE_NAMESPACEs sent to it
        # Cached tracks nobody can send any more, and since when (``expire_orphans``).
        self._orphaned: dict[FullTrackName, float] = {}
        self.fetching = Fetching(
            self.cache, self.counters, self.serving, self.peers, limits.max_queued_bytes
        )
        self._clock = clock
        self.rendezvous = Rendezvous(limits.max_held_subscribes)

    # ------------------------------------------------------------------------------------
    # Sessions and what they may do.

    def add_peer(self, moqt: MoqtSession, link: PeerLink, name: str = "") -> RelayPeer:
        grant = Grant.everything() if self.authorizer is None else Grant.nothing()
        peer = RelayPeer(moqt, link, name, access=grant)
        self.peers.add(peer)
        return peer

    def expire_grants(self, now: float) -> None:
        """End the sessions whose token expired by ``now`` (Unix seconds). Never raises."""
        for peer in [p for p in self.peers if p.access.expired(now)]:
            self._refuse_session(peer, AuthError(SessionErrorCode.EXPIRED_AUTH_TOKEN, "expired"))
        self.serving.transmit()

    def next_timer(self) -> float | None:
        """When `tick` has work next (on `clock`), or None."""
        return self.rendezvous.next_deadline()

    def tick(self, now: float) -> None:
        """Refuse the held SUBSCRIBEs whose wait is over (TIMEOUT). Never raises."""
        for held in self.rendezvous.due(now):
            try:
                self.serving.session(held.peer).reject(
                    held.message.request_id, SubscribeErrorCode.TIMEOUT, "no publisher came"
                )
            except UsageError:  # the request or the session ended meanwhile
                continue
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

    def _on_setup(self, peer: RelayPeer, event: ev.SetupCompleted) -> None:
        """A client's SETUP: what its token grants it. A session this relay opened itself
        (to its upstream relay, where it is the client) is granted everything."""
        if peer.moqt.is_client:
            peer.access = Grant.everything()  # a session this relay opened: to its upstream
            return
        if self.authorizer is None:
            return
        try:
            peer.access = self.authorizer.grant(event.parameters, event.draft)
        except AuthError as exc:
            self._refuse_session(peer, exc)

    def _refuse_session(self, peer: RelayPeer, error: AuthError) -> None:
        logger.warning("relay: session %s refused: %s", peer.name, error.reason)
        if not peer.moqt.closed:
            peer.moqt.close(error.code, error.reason)
            peer.link.transmit()
        self._peer_left(peer)

    # ------------------------------------------------------------------------------------
    # An edge's upstream relay.

    def attach_upstream(self, peer: RelayPeer) -> None:
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
        for prefix in self.followers.followed():
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

    # ------------------------------------------------------------------------------------
    # Namespaces: who publishes what, and following prefixes upstream.

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

    def _on_namespace_announced(self, peer: Peer, event: ev.NamespaceAnnounced) -> None:
        """The upstream relay (draft 16) told us of a namespace: no answer, no refusal."""
        if not peer.access.may_publish(event.namespace):
            logger.warning("relay: %s may not publish %r", peer.name, event.namespace)
            return
        try:
            self._publish_namespace(peer, event.namespace)
        except RoutingLimitExceeded as exc:
            logger.warning("relay: %r not routed: %s", event.namespace, exc)

    def _publish_namespace(self, peer: Peer, namespace: Namespace) -> None:
        """Route ``namespace`` to ``peer``; followers hear of it if it is new, and the
        SUBSCRIBEs held for a track under it go on."""
        if self.namespaces.add_publisher(namespace, peer):
            for follower in self.followers.of(namespace):
                self._announce(follower, namespace)
            if self.upstream is not None:
                self._announce(self.upstream, namespace)
        for held in self.rendezvous.met(namespace):
            self._subscribe(held.peer, held.message)

    def _on_namespace_done(self, peer: Peer, event: ev.NamespacePublishDone) -> None:
        if self.namespaces.remove_publisher(event.namespace, peer):
            self._withdraw(event.namespace)

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

    def _published_under(self, prefix: Namespace) -> set[Namespace]:
        return set(self.namespaces.published_under(prefix))

    def _publishes(self, peer: Peer, namespace: Namespace) -> bool:
        return peer in self.namespaces.publishers(namespace)

    def _following(self, peer: Peer, prefix: Namespace) -> None:
        if peer is not self.upstream:
            self._follow_upstream(prefix)

    # ------------------------------------------------------------------------------------
    # SUBSCRIBE through an upstream subscription, one per track.

    def _subscribe_upstream_for(self, peer: Peer, message: Subscribe) -> bool:
        publisher = self._route(message.track, peer)
        if publisher is None:  # hold it for a publisher, where it asked and none is cached
            held = not self.cache.has_track(message.track)
            return held and self.rendezvous.hold(peer, message, self._clock())
        track = self._track(message.track)
        if track is None:
            self.serving.session(peer).reject(
                message.request_id, SubscribeErrorCode.INTERNAL_ERROR, "too many tracks"
            )
            return True
        if self._subscribe_upstream(publisher, track, message.filter):
            track.waiting.append((peer, message))
            return True
        return False

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

    def _on_accepted(self, peer: RelayPeer, event: ev.RequestAccepted) -> None:
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
        elif isinstance(message, TrackStatusOk):
            asker = peer.status_requests.pop(event.request_id, None)
            if asker is not None and not asker[0].gone:
                self.serving.session(asker[0]).track_status_ok(
                    asker[1], largest=message.largest, group_order=message.group_order
                )
        else:
            super()._on_accepted(peer, event)

    def _on_rejected(self, peer: RelayPeer, event: ev.RequestRejected) -> None:
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
        super()._on_rejected(peer, event)

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
        for follower in self.followers.of(message.track.namespace, tracks=True):
            self._offer(follower, track)
        if self.upstream is not None:  # an edge pushes it on: the root offers it to others
            self._offer(self.upstream, track)

    # ------------------------------------------------------------------------------------
    # TRACK_STATUS and FETCH upstream.

    def _track_status_upstream(self, peer: Peer, request_id: int, name: FullTrackName) -> bool:
        publisher = self._route(name, peer)
        if publisher is None:
            return False
        try:
            upstream_id = self.serving.session(publisher).track_status(name)
        except UsageError:
            return False
        publisher.status_requests[upstream_id] = (peer, request_id)
        return True

    def _fetch(self, fetch: DownstreamFetch, message: Fetch) -> None:
        publisher = self._route(fetch.track, fetch.peer)
        self.fetching.request(fetch, message.group_order, publisher)

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

    def _on_stream_ended(self, peer: Peer, event: ev.DataStreamEnded | ev.DataStreamReset) -> None:
        reset = isinstance(event, ev.DataStreamReset)
        if self.fetching.stream_ended(peer, event.request_id, reset):
            return
        track = peer.upstreams.get(event.request_id)
        if track is not None:
            self._stream_over(track, event.stream_id, reset)

    # ------------------------------------------------------------------------------------
    # Peers leaving.

    def _on_unsubscribed(self, peer: Peer, event: ev.Unsubscribed) -> None:
        self.rendezvous.drop(peer, event.request_id)
        super()._on_unsubscribed(peer, event)

    def _left(self, peer: RelayPeer) -> None:
        self.rendezvous.drop(peer)
        left = "the publisher left"
        lost_upstream = peer is self.upstream
        if lost_upstream:
            self.upstream, left = None, "the upstream relay left"
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

    def _make_room(self) -> None:
        """End a lingering upstream subscription nobody reads any more."""
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

    def _route(self, name: FullTrackName, asker: Peer) -> RelayPeer | None:
        """Who to ask for a track: its live upstream, else the newest publisher of its longest
        published namespace prefix, else the upstream relay (on an edge); never the asker."""
        track = self.tracks.get(name)
        if (
            track is not None
            and track.upstream is not None
            and track.upstream_in(UpstreamState.LIVE)
        ):
            publisher: RelayPeer | None = track.upstream.peer  # type: ignore[assignment]
        else:
            publisher = self.namespaces.route(name.namespace) or self.upstream
        return None if publisher is asker else publisher

    _HANDLERS: ClassVar[dict[type[ev.MoqtEvent], str]] = {
        **Origin._HANDLERS,
        ev.SetupCompleted: "_on_setup",
        ev.NamespacePublished: "_on_namespace_published",
        ev.NamespaceAnnounced: "_on_namespace_announced",
        ev.NamespacePublishDone: "_on_namespace_done",
        ev.PublishRequested: "_on_publish",
        ev.SubscriptionEnded: "_on_publish_ended",
        ev.ObjectReceived: "_on_object",
        ev.DataStreamEnded: "_on_stream_ended",
        ev.DataStreamReset: "_on_stream_ended",
    }
