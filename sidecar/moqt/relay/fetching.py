"""FETCH through the relay: from the cache when it holds the whole range, else from upstream.

A FETCH the cache cannot answer whole goes to the publisher (or the upstream relay) once per
range: a second FETCH of a range already in flight follows the first and is served from the
cache the first fills, once it is whole (decoders below an edge ask for a chunk at once).
Upstream's objects travel on their own stream and may overtake its FETCH_OK: until that
has gone down they wait on the fetch (``DownstreamFetch.early``), bounded like an outbox.
``core.Relay`` decides whether a peer may fetch and whom to ask, and hands the FETCH's
events from upstream here; ``protocol.serving.Serving`` answers from the cache and writes
what goes down.
"""

from __future__ import annotations

from collections.abc import Set

from ..protocol import events as ev
from ..protocol.cache import ObjectCache
from ..protocol.errors import FetchErrorCode, UsageError
from ..protocol.messages import FetchOk, StandaloneFetch
from ..protocol.model import FullTrackName, Location, TrackObject, known_order
from ..protocol.outbox import FetchEnd, FetchSend
from ..protocol.records import DownstreamFetch, Peer
from ..protocol.serving import Serving
from ..protocol.windows import end_object, whole_groups
from .records import RelayCounters, RelayPeer


class Fetching:
    """See the module docstring. One per ``core.Relay``."""

    def __init__(
        self,
        cache: ObjectCache,
        counters: RelayCounters,
        serving: Serving,
        peers: Set[RelayPeer],
        max_queued_bytes: int,
    ) -> None:
        self.cache = cache
        self.counters = counters
        self.serving = serving
        self._peers = peers  # the relay's sessions: a cancelled FETCH may be upstream on any
        self.max_queued_bytes = max_queued_bytes
        # FETCHes sent upstream, by range, so a second FETCH of a range waits for the first.
        self._inflight: dict[tuple[FullTrackName, Location, Location], DownstreamFetch] = {}

    # ------------------------------------------------------------------------------------
    # Requests from downstream.

    def request(
        self, fetch: DownstreamFetch, group_order: int, publisher: RelayPeer | None
    ) -> None:
        """A FETCH the peer may make: from the cache, or through ``publisher`` (None: no
        one to ask)."""
        if publisher is None or self.serving.cached_range(fetch):
            self.serving.fetch_from_cache(fetch)
            return
        peer = fetch.peer
        leader = self._inflight.get(fetch.range)
        if leader is not None:
            leader.followers.append(fetch)
            peer.fetches[fetch.request_id] = fetch
            return
        target = StandaloneFetch(fetch.track, fetch.start, fetch.end.group, end_object(fetch.end))
        try:
            request_id = self.serving.session(publisher).fetch(target, group_order=group_order)
        except UsageError:
            self.serving.fetch_from_cache(fetch)
            return
        fetch.early = []
        self.counters.fetches_sent += 1
        publisher.upstream_fetches[request_id] = fetch
        peer.fetches[fetch.request_id] = fetch
        self._inflight[fetch.range] = fetch

    def cancelled(self, peer: Peer, request_id: int) -> None:
        fetch = peer.fetches.pop(request_id, None)
        if fetch is None:
            return
        peer.outbox.purge(fetch)
        for leader in self._inflight.values():
            if fetch in leader.followers:
                leader.followers.remove(fetch)
        if fetch.followers:
            return  # its upstream FETCH goes on for them
        for upstream in self._peers:
            for upstream_id, pending in list(upstream.upstream_fetches.items()):
                if pending is fetch:
                    del upstream.upstream_fetches[upstream_id]
                    self._upstream_over(fetch, whole=False, reason="cancelled")
                    if not upstream.gone:
                        self.serving.session(upstream).fetch_cancel(upstream_id)

    # ------------------------------------------------------------------------------------
    # What upstream sends for a FETCH sent to it.

    def accepted(self, upstream: RelayPeer, request_id: int, message: FetchOk) -> None:
        fetch = upstream.upstream_fetches.get(request_id)
        if fetch is None or fetch.early is None:
            return
        early, fetch.early = fetch.early, None
        if early and isinstance(early[-1], FetchEnd):  # upstream's stream is over
            del upstream.upstream_fetches[request_id]
        if fetch.peer.gone or fetch.peer.fetches.get(fetch.request_id) is not fetch:
            return  # cancelled, or its session left: it went on for its followers only
        self.serving.session(fetch.peer).fetch_ok(
            fetch.request_id,
            message.end,
            end_of_track=message.end_of_track,
            group_order=known_order(message.group_order),
        )
        for item in early:
            self.serving.enqueue(fetch.peer, item)

    def rejected(self, upstream: RelayPeer, request_id: int, code: int, reason: str) -> None:
        fetch = upstream.upstream_fetches.pop(request_id, None)
        if fetch is None:
            return
        self._upstream_over(fetch, whole=False, reason=reason)
        if not fetch.peer.gone:
            fetch.peer.fetches.pop(fetch.request_id, None)
            self.serving.session(fetch.peer).reject(fetch.request_id, code, reason)

    def object(self, upstream: RelayPeer, event: ev.ObjectReceived, obj: TrackObject) -> None:
        fetch = upstream.upstream_fetches.get(event.request_id)
        if fetch is not None:
            self.cache.add(fetch.track, event.group_id, obj, refill=True)
            self._forward(upstream, event.request_id, FetchSend(fetch, event.group_id, obj))

    def stream_ended(self, upstream: RelayPeer, request_id: int, reset: bool) -> bool:
        """Upstream's fetch stream ended; whether ``request_id`` was a FETCH at all."""
        fetch = upstream.upstream_fetches.get(request_id)
        if fetch is None:
            return False
        if not reset:
            self._whole_groups(fetch)
        if fetch.early is None:
            del upstream.upstream_fetches[request_id]
        self._forward(upstream, request_id, FetchEnd(fetch, reset))
        self._upstream_over(fetch, whole=not reset, reason="upstream reset the fetch")
        return True

    def upstream_left(self, upstream: RelayPeer, reason: str) -> None:
        """``upstream`` left with FETCHes of ours unanswered or under way."""
        for fetch in upstream.upstream_fetches.values():
            self._upstream_over(fetch, whole=False, reason=reason)
            if fetch.early is None:
                self.serving.enqueue(fetch.peer, FetchEnd(fetch, reset=True))
            else:
                self._refuse(fetch, reason)

    # ------------------------------------------------------------------------------------
    # Helpers.

    def _upstream_over(self, fetch: DownstreamFetch, whole: bool, reason: str) -> None:
        """The FETCH ``fetch`` sent upstream is over: its followers get the range from the
        cache it filled, or (``whole`` False) FETCH_ERROR with ``reason``."""
        if self._inflight.get(fetch.range) is fetch:
            del self._inflight[fetch.range]
        followers, fetch.followers = fetch.followers, []
        for follower in followers:
            if follower.peer.gone or follower.peer.fetches.get(follower.request_id) is not follower:
                continue
            if whole:
                del follower.peer.fetches[follower.request_id]
                self.serving.fetch_from_cache(follower)
            else:
                self._refuse(follower, reason)

    def _forward(self, upstream: RelayPeer, request_id: int, item: FetchSend | FetchEnd) -> None:
        """Pass on what upstream sent for a FETCH, or hold it until FETCH_OK (bounded like
        an outbox: past ``max_queued_bytes`` the FETCH fails both ways)."""
        fetch = item.fetch
        if fetch.early is None:
            self.serving.enqueue(fetch.peer, item)
            return
        fetch.early.append(item)
        fetch.early_bytes += item.size
        if fetch.early_bytes > self.max_queued_bytes:
            del upstream.upstream_fetches[request_id]
            self.serving.session(upstream).fetch_cancel(request_id)
            reason = "upstream sent too much before FETCH_OK"
            self._upstream_over(fetch, whole=False, reason=reason)
            self._refuse(fetch, reason)

    def _refuse(self, fetch: DownstreamFetch, reason: str) -> None:
        """FETCH_ERROR for a forwarded FETCH that was never answered."""
        if fetch.peer.fetches.pop(fetch.request_id, None) is fetch:
            self.serving.session(fetch.peer).reject(
                fetch.request_id, FetchErrorCode.INTERNAL_ERROR, reason
            )

    def _whole_groups(self, fetch: DownstreamFetch) -> None:
        """A FETCH answered in full holds every object of the groups its range covers."""
        groups = whole_groups(fetch.start, fetch.end)
        if groups:
            for group_id in self.cache.group_ids(fetch.track, groups.start, groups.stop - 1):
                self.cache.mark_complete(fetch.track, group_id)
