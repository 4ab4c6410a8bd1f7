"""Serving: everything an origin sends down to its peers.

A downstream subscription or FETCH is served from the origin's cache and the live path
alike, through each peer's outbox (see ``origin``'s docstring for why the outbox, and why
the cache is the real buffer). This module owns the writing: starting a subscription,
passing live objects on, replays of cached groups, FETCH from the cache, falling behind and
catching up, ending subscriptions and fetches with what their streams truthfully carried.
``origin.Origin`` (and the relay built on it) decides *what* is served and calls in here;
it hears back through two callbacks: a peer whose writing failed, and a track that lost a
subscriber (it may drop the track).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from . import events as ev
from .cache import ObjectCache
from .errors import FetchErrorCode, PublishDoneStatus, StreamResetCode
from .messages import JoiningFetch, PublishOk, StandaloneFetch, Subscribe, fetch_end
from .model import FullTrackName, GroupOrder, Location, ObjectStatus, TrackObject
from .outbox import Done, EndStream, FetchEnd, FetchReplay, FetchSend, Item, Replay, Send
from .quirks import PeerQuirks
from .records import (
    Downstream,
    DownstreamFetch,
    Feed,
    OriginCounters,
    Peer,
    SubgroupStream,
    Track,
)
from .session import MoqtSession
from .windows import START, joining_range, standalone_range, subscription_window


class Serving:
    """See the module docstring. One per ``origin.Origin``."""

    def __init__(
        self,
        cache: ObjectCache,
        counters: OriginCounters,
        max_queued_bytes: int,
        *,
        failed: Callable[[Peer], None],
        released: Callable[[FullTrackName], None],
    ) -> None:
        self.cache = cache
        self.counters = counters
        self.max_queued_bytes = max_queued_bytes
        self._failed = failed  # writing to this peer raised: the origin closes its session
        self._released = released  # this track lost a subscriber: the origin may drop it
        self._dirty: set[Peer] = set()

    # ------------------------------------------------------------------------------------
    # Sessions written to during one event, transmitted after it.

    def session(self, peer: Peer) -> MoqtSession:
        """The peer's session, noted as written to (transmitted after this event)."""
        self._dirty.add(peer)
        return peer.moqt

    def transmit(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for peer in dirty:
            if not peer.gone:
                peer.link.transmit()

    def forget(self, peer: Peer) -> None:
        """The peer left: nothing is transmitted to it any more."""
        self._dirty.discard(peer)

    def largest(self, track: Track) -> Location | None:
        cached = self.cache.largest(track.name)
        if track.largest is None or (cached is not None and cached > track.largest):
            return cached
        return track.largest

    # ------------------------------------------------------------------------------------
    # Subscriptions starting, and objects on the live path.

    def serve(
        self,
        peer: Peer,
        request_id: int,
        track: Track,
        wants: Subscribe | PublishOk,
        largest: Location | None,
        *,
        replay: bool,
    ) -> None:
        """Start a downstream subscription (a SUBSCRIBE accepted, or a PUBLISH the peer
        accepted) on ``wants``' filter: through the cache first with ``replay``, else live."""
        start, end_group = subscription_window(wants.filter, largest)
        quirks = PeerQuirks.of(peer.moqt.peer_parameters)
        if quirks.replays_history:
            start, end_group, replay = START, None, True
        sub = Downstream(peer, request_id, track, start, end_group, wants.forward)
        sub.joined_open = start.object > 0 and quirks.closes_joined_groups
        track.subscribers.append(sub)
        peer.downstreams[request_id] = sub
        if replay:
            sub.replay()
            self.enqueue(peer, Replay(sub, start.group))
            return
        self._end_joined_group(sub)
        if track.upstream is None:
            self.end(sub, PublishDoneStatus.TRACK_ENDED, "the publisher is gone")

    def _end_joined_group(self, sub: Downstream) -> None:
        """Tell a subscriber that joined mid-group that the group has already ended.

        A Largest Object subscription starts right after the newest object; the subscriber
        gets the group's head by a joining FETCH and waits for the tail on the subscription.
        When the cache holds that group whole (its stream ended), no tail will come, and
        nothing says so unless the publisher ended the group with an END_OF_GROUP status
        object (aiomoqt does; moq-rs flags the stream type instead). moq-rs keeps such a group
        open until the subscription ends, so its ``fetch_group`` of the newest group never
        finished. An END_OF_GROUP status object at the start location closes it, and says no
        more than the cache knows.
        """
        group = self.cache.group(sub.track.name, sub.start.group, touch=False)
        if group is None or not group.complete or not sub.wants(sub.start):
            return
        last = group.ordered()[-1]
        if last.status != ObjectStatus.NORMAL or last.object_id >= sub.start.object:
            return
        sub.joined_open = False
        marker = group_end(sub.start.object, last.subgroup_id, last.publisher_priority)
        self.enqueue(sub.peer, Send(sub, sub.start.group, marker))
        self.enqueue(sub.peer, EndStream(sub, (sub.start.group, last.subgroup_id), False))

    def arrived(self, track: Track, group_id: int, obj: TrackObject) -> None:
        """A new object on one of the track's live group streams (cached already): pass it
        on to the live subscribers that want it; end those whose range it passed."""
        location = Location(group_id, obj.object_id)
        for sub in list(track.subscribers):
            if sub.live and sub.wants(location):
                self.enqueue(sub.peer, Send(sub, group_id, obj))
            elif sub.live and sub.end_group is not None and group_id > sub.end_group:
                self.end(sub, PublishDoneStatus.SUBSCRIPTION_ENDED, "end of the range")

    def forward_datagram(self, track: Track, event: ev.ObjectReceived) -> None:
        """Datagrams may be lost anyway: a backlogged subscriber simply misses them."""
        location = Location(event.group_id, event.object_id)
        for sub in track.subscribers:
            if sub.live and sub.wants(location) and not sub.peer.link.backlogged():
                self.counters.object_bytes_sent += len(event.body.payload)
                self.session(sub.peer).objects.send_datagram(
                    sub.request_id,
                    event.group_id,
                    event.object_id,
                    event.body.payload,
                    publisher_priority=event.publisher_priority,
                    status=event.body.status,
                    extensions=event.body.extensions,
                    end_of_group=event.end_of_group,
                )

    # ------------------------------------------------------------------------------------
    # FETCH from the cache.

    @staticmethod
    def fetch_window(
        peer: Peer, target: StandaloneFetch | JoiningFetch
    ) -> tuple[Location, Location] | None:
        """The range a FETCH asks for; None for a joining FETCH that joins nothing here."""
        if isinstance(target, StandaloneFetch):
            return standalone_range(target)
        sub = peer.downstreams.get(target.joining_request_id)
        return None if sub is None else joining_range(target, sub.start)

    def cached_range(self, fetch: DownstreamFetch) -> bool:
        """Whether the cache holds every group of the range that the track has."""
        largest = self.cache.largest(fetch.track)
        if largest is None or fetch.start.group > largest.group:
            return False  # past what is cached: only the publisher knows whether it exists
        last = min(fetch.end.group, largest.group)
        cached = self.cache.group_ids(fetch.track, fetch.start.group, last)
        if len(cached) != last - fetch.start.group + 1:  # ids are distinct: none missing
            return False
        groups = [self.cache.group(fetch.track, g) for g in cached]
        return all(group is not None and group.complete for group in groups)

    def fetch_from_cache(self, fetch: DownstreamFetch) -> None:
        """Answer a FETCH with what the cache holds of its range (FETCH_ERROR if nothing)."""
        objects = list(self.cache.objects(fetch.track, fetch.start, fetch.end))
        session = self.session(fetch.peer)
        if not objects and not self.cache.has_track(fetch.track):
            code, reason = FetchErrorCode.TRACK_DOES_NOT_EXIST, "no such track"
            session.reject(fetch.request_id, code, reason)
            return
        if not objects:
            session.reject(fetch.request_id, FetchErrorCode.NO_OBJECTS, "nothing in range")
            return
        session.fetch_ok(
            fetch.request_id,
            fetch_end(objects),
            group_order=GroupOrder.DESCENDING if fetch.descending else GroupOrder.ASCENDING,
        )
        groups = deque(dict.fromkeys(g for g, _ in objects))
        if fetch.descending:
            groups.reverse()
        fetch.peer.fetches[fetch.request_id] = fetch
        self.enqueue(fetch.peer, FetchReplay(fetch, groups))

    # ------------------------------------------------------------------------------------
    # The outbox.

    def enqueue(self, peer: Peer, item: Item) -> None:
        if peer.gone:
            return
        outbox = peer.outbox
        over = item.size and outbox and outbox.queued_bytes + item.size > self.max_queued_bytes
        if over and isinstance(item, Send):
            self._fall_behind(item.sub, item.group_id)
            return
        if over and isinstance(item, FetchSend):
            outbox.purge(item.fetch)
            self._end_fetch(item.fetch, reset=True)
            return
        outbox.append(item)
        self.flush(peer)

    def _fall_behind(self, sub: Downstream, group_id: int) -> None:
        """Too much live data waits for this subscriber: it reads the cache instead, at its
        own pace, and only if the cache loses a group it has not read is it TOO_FAR_BEHIND."""
        peer = sub.peer
        queued = [send.group_id for send in peer.outbox.take_sends(sub)]
        sub.fall_behind()
        self.enqueue(peer, Replay(sub, min(queued, default=group_id)))

    def flush(self, peer: Peer) -> None:
        """Write queued items while the connection has room; items may queue more.

        A failure to write fails this peer only, never the one whose event is being handled
        (a publisher must not pay for a subscriber whose connection just died).
        """
        if peer.flushing:
            return
        if peer.link.closing():
            peer.outbox.clear()  # its SessionClosed event follows and cleans up
            return
        peer.flushing = True
        try:
            while peer.outbox and not peer.link.backlogged() and not peer.gone:
                item = peer.outbox.front()
                if self._RUNNERS[type(item)](self, item):
                    peer.outbox.done(item)
                self._dirty.add(peer)
        except Exception:
            self._failed(peer)
        finally:
            peer.flushing = False
        if peer.outbox and peer.wait_for_drain():
            peer.link.wake_when_drained()

    # What writing each kind of item means; each returns True once the item is done.

    def _run_send(self, item: Send) -> bool:
        if item.sub.peer.downstreams.get(item.sub.request_id) is item.sub:
            self._write(item.sub, item.group_id, item.obj)
        return True

    def _run_end_stream(self, item: EndStream) -> bool:
        sub, key = item.sub, item.key
        if item.reset:
            self._end_stream(sub, key, reset=True)
        elif sub.live or key in sub.streams:  # a replay that has not got here FINs it itself
            self._write_group(sub, key[0], key[1])
        return True

    def _run_done(self, item: Done) -> bool:
        self._send_done(item.sub, item.status, item.reason)
        return True

    def _run_fetch_send(self, item: FetchSend) -> bool:
        self._write_fetch(item.fetch, item.group_id, item.obj)
        return True

    def _run_fetch_end(self, item: FetchEnd) -> bool:
        self._end_fetch(item.fetch, item.reset)
        return True

    def _write(self, sub: Downstream, group_id: int, obj: TrackObject) -> None:
        if sub.joined_open:
            sub.joined_open = False
            if group_id > sub.start.group:  # the joined group got no tail: say it ended
                marker = group_end(sub.start.object, 0, obj.publisher_priority)
                self._write(sub, sub.start.group, marker)
                self._end_stream(sub, (sub.start.group, 0), reset=False)
        key = (group_id, obj.subgroup_id)
        stream = sub.streams.get(key)
        session = self.session(sub.peer)
        if stream is None and key in sub.finished:
            return
        if stream is None:
            stream_id = session.objects.open_subgroup(
                sub.request_id,
                group_id,
                obj.subgroup_id,
                obj.publisher_priority,
                extensions=True,
            )
            stream = sub.streams[key] = SubgroupStream(stream_id)
        elif stream.stopped or obj.object_id <= stream.last_object:
            return
        self.counters.object_bytes_sent += len(obj.payload)
        session.objects.send_object(
            stream.stream_id,
            obj.object_id,
            obj.payload,
            status=obj.status,
            extensions=obj.extensions,
        )
        stream.last_object = obj.object_id

    def _write_group(self, sub: Downstream, group_id: int, subgroup: int | None = None) -> None:
        """Cached objects of a group the subscriber wants and lacks; FIN what upstream ended."""
        # A live subscriber got every object on the live path: reading the group only closes
        # its stream, which is no use of the cache and must not keep the group over newer ones.
        group = self.cache.group(sub.track.name, group_id, touch=not sub.live)
        if group is not None:
            for obj in group.ordered():
                if (subgroup is None or obj.subgroup_id == subgroup) and sub.wants(
                    Location(group_id, obj.object_id)
                ):
                    self._write(sub, group_id, obj)
        # Off the live path the objects a stream lacks come from the cache alone: with the
        # group evicted they are gone, and once the subscription is ending (too far behind)
        # none are written; a FIN would then pass the cut-short group off as whole.
        lost = not sub.live and (group is None or sub.ending)
        live = set(sub.track.live_streams.values())
        for key in [k for k in sub.streams if k[0] == group_id and k not in live]:
            if subgroup is None or key[1] == subgroup:
                self._end_stream(sub, key, reset=lost)

    def _end_stream(self, sub: Downstream, key: tuple[int, int], reset: bool) -> None:
        if not sub.live:
            sub.finished.add(key)
        stream = sub.streams.pop(key, None)
        if stream is None or stream.stopped:
            return
        session = self.session(sub.peer)
        if reset:
            session.objects.reset_stream(stream.stream_id, StreamResetCode.INTERNAL_ERROR)
        else:
            session.objects.end_stream(stream.stream_id)

    def _replay_step(self, item: Replay) -> bool:
        sub = item.sub
        if sub.peer.downstreams.get(sub.request_id) is not sub or sub.ending:
            return True
        if sub.feed is Feed.BEHIND and self.cache.evicted_from(sub.track.name, item.cursor):
            self.end(sub, PublishDoneStatus.TOO_FAR_BEHIND, "the cache lost what it had not read")
            return True
        if not item.groups:
            item.groups.extend(self.cache.group_ids(sub.track.name, item.cursor, sub.end_group))
            if not item.groups:
                self._caught_up(sub)
                return True
        group_id = item.groups.popleft()
        item.cursor = group_id + 1
        self._write_group(sub, group_id)
        return False

    def _caught_up(self, sub: Downstream) -> None:
        """A replay reached the live edge: top up the groups still in flight, then go live."""
        for group_id in sorted({g for g, _ in sub.track.live_streams.values()}):
            self._write_group(sub, group_id)
        sub.catch_up()
        largest = self.largest(sub.track)
        if sub.end_group is not None and largest is not None and largest.group > sub.end_group:
            self.end(sub, PublishDoneStatus.SUBSCRIPTION_ENDED, "end of the range")
        elif sub.track.upstream is None:
            self.end(sub, PublishDoneStatus.TRACK_ENDED, "served from the cache")

    def end(self, sub: Downstream, status: int, reason: str) -> None:
        """End a subscription once what is queued before it has gone out."""
        if sub.end():
            self.enqueue(sub.peer, Done(sub, status, reason))

    def _send_done(self, sub: Downstream, status: int, reason: str) -> None:
        if sub.peer.downstreams.pop(sub.request_id, None) is not sub:
            return
        too_far_behind = status == PublishDoneStatus.TOO_FAR_BEHIND
        for key, stream in list(sub.streams.items()):
            self._end_stream(sub, key, too_far_behind or not self._wrote_whole(sub, key, stream))
        self.session(sub.peer).publish_done(sub.request_id, status, reason)
        self._detach(sub)

    def _wrote_whole(self, sub: Downstream, key: tuple[int, int], stream: SubgroupStream) -> bool:
        """Whether a stream carries its whole subgroup, so a FIN tells the truth. A range that
        ends when the next group begins may find its last group still arriving (a publisher
        interleaves group streams), and a replay stops where the subscription ends."""
        group = self.cache.group(sub.track.name, key[0], touch=False)
        if group is None or not group.complete:
            return False
        ids = [obj.object_id for obj in group.ordered() if obj.subgroup_id == key[1]]
        return stream.last_object == max(ids, default=-1)

    def cancel(self, sub: Downstream, *, reset_streams: bool) -> None:
        """The subscriber left or unsubscribed: forget it and stop its streams."""
        peer = sub.peer
        peer.downstreams.pop(sub.request_id, None)
        if not peer.gone:
            peer.outbox.purge(sub)
            if reset_streams:
                for stream in sub.streams.values():
                    if not stream.stopped:
                        self.session(peer).objects.reset_stream(
                            stream.stream_id, StreamResetCode.CANCELLED
                        )
        sub.streams.clear()
        self._detach(sub)

    def _detach(self, sub: Downstream) -> None:
        """Forget a subscription. The upstream one lingers: it keeps filling the cache for
        decoders that come later (see ``_track`` for when it goes)."""
        track = sub.track
        if sub in track.subscribers:
            track.subscribers.remove(sub)
        self._released(track.name)

    def _write_fetch(self, fetch: DownstreamFetch, group_id: int, obj: TrackObject) -> None:
        if fetch.peer.fetches.get(fetch.request_id) is not fetch:
            return
        session = self.session(fetch.peer)
        if fetch.stream_id is None:
            fetch.stream_id = session.objects.open_fetch_stream(fetch.request_id)
        self.counters.object_bytes_sent += len(obj.payload)
        session.objects.send_fetch_object(
            fetch.stream_id,
            group_id,
            obj.subgroup_id,
            obj.object_id,
            obj.payload,
            publisher_priority=obj.publisher_priority,
            status=obj.status,
            extensions=obj.extensions,
        )

    def _fetch_replay_step(self, item: FetchReplay) -> bool:
        fetch = item.fetch
        if not item.groups:
            self._end_fetch(fetch, reset=False)
            return True
        group_id = item.groups.popleft()
        group = self.cache.group(fetch.track, group_id)
        for obj in group.ordered() if group is not None else ():
            if fetch.start <= Location(group_id, obj.object_id) <= fetch.end:
                self._write_fetch(fetch, group_id, obj)
        return False

    def _end_fetch(self, fetch: DownstreamFetch, reset: bool) -> None:
        if fetch.peer.fetches.pop(fetch.request_id, None) is not fetch:
            return
        session = self.session(fetch.peer)
        if fetch.stream_id is None and not reset:
            fetch.stream_id = session.objects.open_fetch_stream(fetch.request_id)
        if fetch.stream_id is None:
            return
        if reset:
            session.objects.reset_stream(fetch.stream_id, StreamResetCode.INTERNAL_ERROR)
        else:
            session.objects.end_stream(fetch.stream_id)

    _RUNNERS: ClassVar[dict[type[Item], Callable[[Serving, Any], bool]]] = {
        Send: _run_send,
        EndStream: _run_end_stream,
        Replay: _replay_step,
        Done: _run_done,
        FetchReplay: _fetch_replay_step,
        FetchSend: _run_fetch_send,
        FetchEnd: _run_fetch_end,
    }


def group_end(object_id: int, subgroup: int, priority: int) -> TrackObject:
    """An END_OF_GROUP status object: the group has no object from ``object_id`` on."""
    return TrackObject(
        object_id, b"", ObjectStatus.END_OF_GROUP, subgroup_id=subgroup, publisher_priority=priority
    )
