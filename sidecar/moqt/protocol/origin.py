"""An origin: tracks served to MoQT sessions, wherever their objects come from.

Sans-I/O like the session it drives: ``Origin.handle(peer, event)`` takes one session's event
and answers by calling methods of the ``MoqtSession`` objects of the peers involved. What it
needs of the I/O layer is three things per peer (``PeerLink``): whether its connection's send
backlog is full, a nudge to transmit, and a wake-up (``Origin.resume``) once it drained.

An application that publishes writes its tracks into an origin (``open_local``,
``write_local``, ``end_local``, ``close_local``): an upstream that is this process, always
live, kept in a pinned part of the cache (``ObjectCache.pin``). Its sessions' SUBSCRIBE,
FETCH, TRACK_STATUS and SUBSCRIBE_NAMESPACE are answered here from what it holds. A relay
(``relay.core.Relay``) is an origin too, one that also fills its cache from upstream
publishers and routes requests to them: it adds to the hooks below, and every answer from
what is held (a publisher's own tracks, a relay's cache) is this code.

Why the per-peer outbox: an origin must not buffer without bound for a subscriber slower
than its source, and it cannot slow a remote publisher down either (aioquic and qh3 grant
flow control as data arrives, not as it is consumed). Everything bound for a peer goes
through one FIFO of small items that refer to cached payloads (no copies); it is written
into QUIC while the connection's backlog allows, and waits otherwise. The cache is the real
buffer: when live objects for a subscription would push its peer's FIFO past
``max_queued_bytes``, the subscription stops taking live objects and reads the cache at its
own pace instead, and only if the cache evicts a group it has not read yet does it end with
PUBLISH_DONE TOO_FAR_BEHIND. Replays of cached groups (such catch-ups, late SUBSCRIBEs with
an absolute start, FETCH) are one queued item that reads the cache a group at a time, so a
subscriber that loads a thousand past groups holds no more than one group in flight, and
takes nothing from the live path until it has caught up with the live edge.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ClassVar

from . import events as ev
from .cache import ObjectCache
from .errors import (
    FetchErrorCode,
    PublishDoneStatus,
    SessionErrorCode,
    SubscribeErrorCode,
    SubscribeNamespaceErrorCode,
    UsageError,
)
from .messages import Fetch, FilterType, NamespaceOptions, PublishOk, Subscribe
from .model import FullTrackName, GroupOrder, Location, TrackObject, has_prefix
from .outbox import EndStream
from .records import (
    LOCAL_STREAM,
    DownstreamFetch,
    Namespace,
    Offer,
    OriginCounters,
    OriginLimits,
    Peer,
    PeerLink,
    Track,
    Upstream,
    UpstreamState,
)
from .serving import Serving
from .session import MoqtSession

logger = logging.getLogger(__name__)


class TooManyPrefixes(Exception):
    """A peer asked to follow more namespace prefixes than the origin allows."""


class Followers:
    """Which peers asked (SUBSCRIBE_NAMESPACE) to hear of which namespace prefixes, and
    whether each wants the tracks under it offered (draft 16 lets it ask for namespaces
    alone; a draft-14 follower always gets both; draft 18 asks for each apart, and the
    tracks of a prefix once asked for stay wanted until it is unfollowed)."""

    def __init__(self, max_prefixes_per_peer: int) -> None:
        self.max_prefixes_per_peer = max_prefixes_per_peer
        self._prefixes: dict[Peer, dict[Namespace, bool]] = {}

    def add(self, peer: Peer, prefix: Namespace, tracks: bool = True) -> None:
        prefixes = self._prefixes.setdefault(peer, {})
        if prefix not in prefixes and len(prefixes) >= self.max_prefixes_per_peer:
            raise TooManyPrefixes(f"a peer may follow {self.max_prefixes_per_peer} prefixes")
        prefixes[prefix] = prefixes.get(prefix, False) or tracks

    def remove(self, peer: Peer, prefix: Namespace) -> None:
        prefixes = self._prefixes.get(peer)
        if prefixes is not None:
            prefixes.pop(prefix, None)
            if not prefixes:
                del self._prefixes[peer]

    def forget(self, peer: Peer) -> None:
        self._prefixes.pop(peer, None)

    def followed(self) -> set[Namespace]:
        """Every prefix some peer follows."""
        return set().union(*self._prefixes.values())

    def offered(self, peer: Peer, namespace: Namespace) -> bool:
        """Whether `peer` follows a prefix of `namespace` and asked to be offered tracks."""
        return _follows(self._prefixes.get(peer, {}), namespace, tracks=True)

    def of(self, namespace: Namespace, tracks: bool = False) -> list[Peer]:
        """Peers following a prefix of ``namespace`` (where `tracks`: to be offered its
        tracks)."""
        return [
            peer
            for peer, prefixes in self._prefixes.items()
            if _follows(prefixes, namespace, tracks)
        ]


def _follows(prefixes: dict[Namespace, bool], namespace: Namespace, tracks: bool) -> bool:
    return any(
        has_prefix(namespace, prefix) and (wants or not tracks)
        for prefix, wants in prefixes.items()
    )


class Origin:
    """See the module docstring. One instance serves every session of a process."""

    def __init__(
        self, limits: OriginLimits | None = None, counters: OriginCounters | None = None
    ) -> None:
        self.limits = limits or OriginLimits()
        self.counters = counters or OriginCounters()
        self.cache = ObjectCache(self.limits.cache_bytes)
        self.tracks: dict[FullTrackName, Track] = {}
        self.peers: set[Peer] = set()
        self.followers = Followers(self.limits.max_prefixes_per_peer)
        self._local: set[FullTrackName] = set()  # opened here and not closed
        self.serving = Serving(
            self.cache,
            self.counters,
            self.limits.max_queued_bytes,
            failed=self._fail,
            released=self._drop_idle,
        )
        self._handlers = {kind: getattr(self, name) for kind, name in self._HANDLERS.items()}

    # ------------------------------------------------------------------------------------
    # Driving the origin.

    def add_peer(self, moqt: MoqtSession, link: PeerLink, name: str = "") -> Peer:
        peer = Peer(moqt, link, name)
        self.peers.add(peer)
        return peer

    def handle(self, peer: Peer, event: ev.MoqtEvent) -> None:
        """Act on one event of ``peer``'s session. Never raises."""
        handler = self._handlers.get(type(event))
        if handler is not None:
            self._guarded(peer, lambda p: handler(p, event))

    def resume(self, peer: Peer) -> None:
        """The peer's connection drained: write what waits for it. Never raises."""
        peer.drained()
        self._guarded(peer, self.serving.flush)

    def _guarded(self, peer: Peer, action: Callable[[Peer], None]) -> None:
        """Run ``action``; a bug closes the peer's session, never the origin."""
        try:
            if not peer.gone:
                action(peer)
        except Exception:
            self._fail(peer)
        self.serving.transmit()

    def _fail(self, peer: Peer) -> None:
        logger.exception("moqt origin: internal error serving %s", peer.name)
        if not peer.moqt.closed:
            peer.moqt.close(SessionErrorCode.INTERNAL_ERROR, "internal error")
            peer.link.transmit()
        self._peer_left(peer)

    def _unauthorized(
        self, peer: Peer, request_id: int, namespace: Namespace, *, publish: bool, code: int
    ) -> bool:
        """Refuse a request outside what the peer may do (``code``, the request type's
        UNAUTHORIZED, and a log line); whether it was refused."""
        access = peer.access
        if access.may_publish(namespace) if publish else access.may_subscribe(namespace):
            return False
        action = "publish" if publish else "subscribe to"
        logger.warning("moqt origin: %s may not %s %r", peer.name, action, namespace)
        self.serving.session(peer).reject(request_id, code, "not authorized")
        return True

    # ------------------------------------------------------------------------------------
    # Tracks this process writes (see the module docstring).

    def open_local(self, name: FullTrackName, max_bytes: int) -> Track:
        """Start a track this process writes, held in at most ``max_bytes`` of pinned cache
        (its oldest groups go past that); namespace subscribers hear of it. UsageError when
        the origin holds as many tracks as it may, or the track has a publisher already."""
        track = self._track(name)
        if track is None:
            raise UsageError(f"{name}: the origin holds {self.limits.max_tracks} tracks")
        if track.upstream is not None:
            raise UsageError(f"{name} already has a publisher")
        self.cache.pin(name, max_bytes)
        self._local.add(name)
        track.attach(Upstream(None, 0, UpstreamState.LIVE, pushed=True))
        for follower in self.followers.of(name.namespace):
            self._guarded(follower, lambda peer: self._tell_local(peer, track))
        return track

    def _tell_local(self, peer: Peer, track: Track) -> None:
        self._announce(peer, track.name.namespace)
        if self.followers.offered(peer, track.name.namespace):
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
    # Namespace subscribers: told of namespaces, offered pushed tracks.

    def _on_namespace_subscribe(self, peer: Peer, event: ev.NamespaceSubscribeRequested) -> None:
        message = event.message
        if not peer.access.may_follow(message.namespace):
            logger.warning("moqt origin: %s may not follow %r", peer.name, message.namespace)
            self.serving.session(peer).reject(
                message.request_id, SubscribeNamespaceErrorCode.UNAUTHORIZED, "not authorized"
            )
            return
        tracks = message.options != NamespaceOptions.NAMESPACE
        namespaces = message.options != NamespaceOptions.PUBLISH
        try:
            self.followers.add(peer, message.namespace, tracks)
        except TooManyPrefixes as exc:
            self.serving.session(peer).reject(
                message.request_id, SubscribeNamespaceErrorCode.INTERNAL_ERROR, str(exc)
            )
            return
        self.serving.session(peer).subscribe_namespace_ok(message.request_id)
        held = {
            *self._published_under(message.namespace),
            *self._local_namespaces(message.namespace),
        }
        for namespace in sorted(held) if namespaces else ():
            self._announce(peer, namespace)
        for track in list(self.tracks.values()) if tracks else ():
            if has_prefix(track.name.namespace, message.namespace):
                self._offer(peer, track)
        self._following(peer, message.namespace)

    def _on_namespace_unsubscribed(self, peer: Peer, event: ev.NamespaceUnsubscribed) -> None:
        self.followers.remove(peer, event.prefix)

    def _on_namespace_cancelled(self, peer: Peer, event: ev.NamespacePublishCancelled) -> None:
        peer.announced.discard(event.message.namespace)

    def _announce(self, peer: Peer, namespace: Namespace) -> None:
        """Tell a namespace subscriber of a namespace (never its own, nor one it may not read)."""
        if (
            namespace in peer.announced
            or self._publishes(peer, namespace)
            or not peer.access.may_subscribe(namespace)
        ):
            return
        try:
            self.serving.session(peer).tell_namespace(namespace)
        except UsageError as exc:  # the follower gave us no request ids left: it misses this one
            logger.info("moqt origin: cannot announce %r to %s: %s", namespace, peer.name, exc)
            return
        peer.announced.add(namespace)

    def _withdraw(self, namespace: Namespace) -> None:
        for peer in self.peers:
            if namespace in peer.announced and not peer.gone:
                peer.announced.discard(namespace)
                self.serving.session(peer).tell_namespace_done(namespace)

    def _offer(self, peer: Peer, track: Track) -> None:
        """PUBLISH a pushed track to a namespace subscriber (draft-14: the recipient of
        SUBSCRIBE_NAMESPACE sends PUBLISH for the matching tracks), once per track."""
        upstream = track.upstream
        if (
            upstream is None
            or not upstream.pushed
            or upstream.state is not UpstreamState.LIVE
            or upstream.peer is peer
            or not peer.access.may_subscribe(track.name.namespace)
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
            logger.info("moqt origin: cannot offer %s to %s: %s", track.name, peer.name, exc)
            return
        peer.offers[request_id] = Offer(track, largest)

    def _on_offer_accepted(self, peer: Peer, request_id: int, message: PublishOk) -> None:
        offer = peer.offers.pop(request_id, None)
        if offer is None:
            return
        if offer.track.upstream is None or self.tracks.get(offer.track.name) is not offer.track:
            self.serving.session(peer).publish_done(
                request_id, PublishDoneStatus.TRACK_ENDED, "the publisher is gone"
            )
            return
        # From the cache first: what arrived since the PUBLISH went out is there.
        self.serving.serve(peer, request_id, offer.track, message, offer.largest, replay=True)

    def _on_accepted(self, peer: Peer, event: ev.RequestAccepted) -> None:
        if isinstance(event.message, PublishOk):
            self._on_offer_accepted(peer, event.request_id, event.message)

    def _on_rejected(self, peer: Peer, event: ev.RequestRejected) -> None:
        peer.offers.pop(event.request_id, None)

    # ------------------------------------------------------------------------------------
    # SUBSCRIBE.

    def _on_subscribe(self, peer: Peer, event: ev.SubscribeRequested) -> None:
        self.counters.subscribes_received += 1
        self._subscribe(peer, event.message)

    def _subscribe(self, peer: Peer, message: Subscribe) -> None:
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
        if self._subscribe_upstream_for(peer, message):
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

    # ------------------------------------------------------------------------------------
    # TRACK_STATUS and FETCH.

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
        if self._track_status_upstream(peer, message.request_id, message.track):
            return
        largest = self.cache.largest(message.track)
        if largest is not None:
            self.serving.session(peer).track_status_ok(message.request_id, largest=largest)
        else:
            self.serving.session(peer).reject(
                message.request_id, SubscribeErrorCode.TRACK_DOES_NOT_EXIST, "no such track"
            )

    def _on_fetch(self, peer: Peer, event: ev.FetchRequested) -> None:
        message = event.message
        self.counters.fetches_received += 1
        unauthorized = FetchErrorCode.UNAUTHORIZED
        if self._unauthorized(
            peer, message.request_id, event.track.namespace, publish=False, code=unauthorized
        ):
            return
        window = self.serving.fetch_window(peer, message.target)
        if window is None:
            self.serving.session(peer).reject(
                message.request_id, FetchErrorCode.INVALID_RANGE, "nothing to join"
            )
            return
        descending = message.group_order == GroupOrder.DESCENDING
        fetch = DownstreamFetch(peer, message.request_id, event.track, *window, descending)
        self._fetch(fetch, message)

    def _fetch(self, fetch: DownstreamFetch, message: Fetch) -> None:
        """Answer a FETCH: here, from the cache (a relay may ask upstream instead)."""
        self.serving.fetch_from_cache(fetch)

    def _on_fetch_cancelled(self, peer: Peer, event: ev.FetchCancelled) -> None:
        fetch = peer.fetches.pop(event.request_id, None)
        if fetch is not None:
            peer.outbox.purge(fetch)

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
    # Objects arriving (written here, or from upstream).

    def _cache_new(self, track: Track, group_id: int, obj: TrackObject) -> bool:
        """Cache an arriving object; False if the group was whole here already."""
        location = Location(group_id, obj.object_id)
        cached = self.cache.group(track.name, group_id, touch=False)
        if cached is None or not cached.complete:
            self.cache.add(track.name, group_id, obj)  # ValueError: over the track's bound
        if track.largest is None or location > track.largest:
            track.largest = location
        # Else sent again: an upstream relay replays what this edge already holds whole for
        # a later subscriber. Whoever here wants the group read it from the cache already.
        return cached is None or not cached.complete

    def _arrived(self, track: Track, stream: int, group_id: int, obj: TrackObject) -> None:
        """An object on one of the track's live group streams: cache it, pass it on."""
        if not self._cache_new(track, group_id, obj):
            return
        track.live_streams[stream] = (group_id, obj.subgroup_id)
        self.serving.arrived(track, group_id, obj)

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

    def _upstream_over(self, track: Track) -> None:
        """The track's source ended or left; subscriptions end once its streams have."""
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

    # ------------------------------------------------------------------------------------
    # Peers leaving.

    def _on_closed(self, peer: Peer, event: ev.SessionClosed) -> None:
        self._peer_left(peer)

    def _peer_left(self, peer: Peer) -> None:
        if not peer.leave():
            return
        self.peers.discard(peer)
        self.serving.forget(peer)
        peer.outbox.clear()
        self.followers.forget(peer)
        self._left(peer)
        for sub in list(peer.downstreams.values()):
            self.serving.cancel(sub, reset_streams=False)
        for track in list(self.tracks.values()):
            track.waiting = [(p, m) for p, m in track.waiting if p is not peer]
            self._drop_idle(track.name)

    # ------------------------------------------------------------------------------------
    # Tracks held.

    def _track(self, name: FullTrackName) -> Track | None:
        """The track ``name``, created if there is room (``_make_room`` may make some)."""
        track = self.tracks.get(name)
        if track is None and len(self.tracks) >= self.limits.max_tracks:
            self._make_room()
        if track is None and len(self.tracks) < self.limits.max_tracks:
            track = self.tracks[name] = Track(name)
        return track

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

    # ------------------------------------------------------------------------------------
    # What a relay adds (``relay.core.Relay``): an origin has no upstream to ask.

    def _subscribe_upstream_for(self, peer: Peer, message: Subscribe) -> bool:
        """Ask a publisher for a track not held here; whether the SUBSCRIBE now waits."""
        return False

    def _track_status_upstream(self, peer: Peer, request_id: int, name: FullTrackName) -> bool:
        """Ask a publisher for a track's status; whether the request now waits."""
        return False

    def _published_under(self, prefix: Namespace) -> set[Namespace]:
        """Namespaces published here by peers under ``prefix``."""
        return set()

    def _publishes(self, peer: Peer, namespace: Namespace) -> bool:
        """Whether ``peer`` published ``namespace`` here."""
        return False

    def _following(self, peer: Peer, prefix: Namespace) -> None:
        """``peer`` follows ``prefix`` now."""

    def _left(self, peer: Peer) -> None:
        """``peer`` left: what it published here, and what was asked of it, are over."""

    def _make_room(self) -> None:
        """The origin holds ``max_tracks`` tracks: end one nobody needs, if any."""

    _HANDLERS: ClassVar[dict[type[ev.MoqtEvent], str]] = {
        ev.NamespacePublishCancelled: "_on_namespace_cancelled",
        ev.NamespaceSubscribeRequested: "_on_namespace_subscribe",
        ev.NamespaceUnsubscribed: "_on_namespace_unsubscribed",
        ev.SubscribeRequested: "_on_subscribe",
        ev.SubscribeUpdated: "_on_subscribe_updated",
        ev.Unsubscribed: "_on_unsubscribed",
        ev.TrackStatusRequested: "_on_track_status",
        ev.FetchRequested: "_on_fetch",
        ev.FetchCancelled: "_on_fetch_cancelled",
        ev.RequestAccepted: "_on_accepted",
        ev.RequestRejected: "_on_rejected",
        ev.DataStreamStopped: "_on_stream_stopped",
        ev.SessionClosed: "_on_closed",
    }
    """Which method handles which event (by name: a relay overrides some and adds others)."""
