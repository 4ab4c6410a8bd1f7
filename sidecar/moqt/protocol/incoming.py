"""What the peer sends this session on data streams and datagrams, and the tracks and fetches
it belongs to: our subscriptions (and tracks the peer PUBLISHed to us) and our FETCHes.

A part of ``session.MoqtSession`` kept in its own module because it is its own problem: a
peer's data streams can arrive before the control message that says what they are (a
subgroup stream before SUBSCRIBE_OK gives its alias), so they are parsed and held, under
bounds, until they can be placed; and nothing a peer sends on them may make the session
hold more than ``SessionLimits`` allows. The session feeds it QUIC stream events and tells
it what the control stream said; it reports objects and stream ends through ``emit``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from . import events as ev
from .connection import QuicConnectionLike, SessionLimits
from .data import (
    DataStreamParser,
    FetchHeader,
    FetchObject,
    SubgroupHeader,
    SubgroupObject,
    decode_datagram,
)
from .drafts import DRAFT_14, Draft
from .errors import ObjectTooLarge, ProtocolError, SessionErrorCode, StreamResetCode, UsageError
from .model import FullTrackName
from .request_ids import RequestIds

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RemoteTrack:
    """A track the peer publishes to us (our SUBSCRIBE, or its PUBLISH)."""

    request_id: int
    track: FullTrackName
    track_alias: int | None = None
    unsubscribed: bool = False
    done_at: float | None = None


@dataclass(slots=True)
class InStream:
    """An incoming data stream; objects wait in ``pending`` until the alias is known."""

    parser: DataStreamParser
    request_id: int | None = None
    since: float = 0.0
    pending: list[SubgroupObject] = field(default_factory=list)
    pending_bytes: int = 0
    buffered: int = 0  # the parser's partial object, as last counted in the session total
    fin: bool = False


def stream_is_client_initiated(stream_id: int) -> bool:
    return not stream_id & 0x1


class Incoming:
    """See the module docstring. One per session."""

    def __init__(
        self,
        quic: QuicConnectionLike,
        limits: SessionLimits,
        ids: RequestIds,
        emit: Callable[[ev.MoqtEvent], None],
        draft: Draft = DRAFT_14,
        *,
        fetch_over: Callable[[int], None],
    ) -> None:
        """`fetch_over` hears of each FETCH of ours that is over (its stream ended, or it
        was refused), as `Outgoing`'s hears of the peer's."""
        self._quic = quic
        self._draft = draft
        self._limits = limits
        self._ids = ids
        self._emit = emit
        self._fetch_ended = fetch_over
        self._tracks: dict[int, RemoteTrack] = {}
        self._by_alias: dict[int, RemoteTrack] = {}
        self._fetches: set[int] = set()  # our fetches whose stream may still come
        self._descending: set[int] = set()  # ... of which, those served newest group first
        self._streams: dict[int, InStream] = {}
        self._ignored: set[int] = set()
        self._pending_bytes = 0
        self._buffered_bytes = 0

    # ------------------------------------------------------------------------------------
    # What the control stream said.

    def subscribed(self, track: FullTrackName) -> bool:
        """Whether a subscription of ours to ``track`` is active."""
        return any(t.track == track and t.done_at is None for t in self._tracks.values())

    def has(self, request_id: int) -> bool:
        """Whether ``request_id`` is a subscription of ours (or a PUBLISH to us) still known."""
        return request_id in self._tracks

    def subscribe(self, request_id: int, track: FullTrackName) -> None:
        self._tracks[request_id] = RemoteTrack(request_id, track)

    def accepted(self, request_id: int, alias: int) -> None:
        """SUBSCRIBE_OK: the alias of our subscription. Even if we unsubscribed meanwhile:
        its streams are then dropped at once."""
        track = self._tracks.get(request_id)
        if track is not None:
            self._bind_alias(track, alias)

    def pushed(self, request_id: int, track: FullTrackName, alias: int) -> None:
        """The peer's PUBLISH: a track it sends us under ``alias``."""
        remote = self._tracks[request_id] = RemoteTrack(request_id, track)
        self._bind_alias(remote, alias)

    def unsubscribe(self, request_id: int, now: float) -> None:
        """We end the subscription; late objects are dropped."""
        track = self._tracks.get(request_id)
        if track is None or track.unsubscribed:
            raise UsageError(f"no subscription {request_id}")
        track.unsubscribed = True
        if track.done_at is None:
            track.done_at = now

    def ended(self, request_id: int, now: float) -> bool:
        """PUBLISH_DONE: whether the subscription was still known (its alias is kept a while
        for streams still on their way)."""
        track = self._tracks.get(request_id)
        if track is None:
            return False  # already forgotten after our UNSUBSCRIBE drained
        if track.done_at is None:
            track.done_at = now
        return True

    def forget(self, request_id: int) -> None:
        """A subscription refused, or a PUBLISH we refused."""
        track = self._tracks.pop(request_id, None)
        if track is not None and track.track_alias is not None:
            self._by_alias.pop(track.track_alias, None)

    def fetch(self, request_id: int, descending: bool = False) -> None:
        self._fetches.add(request_id)
        if descending:
            self._descending.add(request_id)

    def fetch_refused(self, request_id: int) -> None:
        self._fetch_over(request_id)

    def _fetch_over(self, request_id: int) -> None:
        self._forget_fetch(request_id)
        self._fetch_ended(request_id)

    def _forget_fetch(self, request_id: int) -> None:
        self._fetches.discard(request_id)
        self._descending.discard(request_id)

    def cancel_fetch(self, request_id: int) -> None:
        """We cancel our FETCH: its stream, if it came, is read no further. Withdrawing
        the request is the session's (FETCH_CANCEL, or in draft 18 a reset): not over."""
        if request_id not in self._fetches:
            raise UsageError(f"no fetch {request_id}")
        self._forget_fetch(request_id)
        for stream_id, state in list(self._streams.items()):
            if state.request_id == request_id:
                self._drop(stream_id)

    # ------------------------------------------------------------------------------------
    # Timers.

    def tick(self, now: float) -> None:
        """Expire alias-less data streams and drained subscriptions older than their timeouts."""
        limits = self._limits
        for stream_id, state in list(self._streams.items()):
            if state.request_id is None and now - state.since >= limits.pending_stream_timeout:
                self._drop(stream_id)
        for track in list(self._tracks.values()):
            if track.done_at is not None and now - track.done_at >= limits.drain_timeout:
                self.forget(track.request_id)

    def next_timer(self) -> float | None:
        times = [
            s.since + self._limits.pending_stream_timeout
            for s in self._streams.values()
            if s.request_id is None
        ]
        times += [
            t.done_at + self._limits.drain_timeout
            for t in self._tracks.values()
            if t.done_at is not None
        ]
        return min(times, default=None)

    def awaiting(self) -> bool:
        """Whether a FETCH's stream or the rest of an open data stream is still to come."""
        return bool(self._fetches or self._streams)

    # ------------------------------------------------------------------------------------
    # QUIC events of unidirectional streams, and datagrams.

    def stream_data(
        self, stream_id: int, data: bytes, end_stream: bool, *, is_client: bool, now: float
    ) -> None:
        if stream_id in self._ignored:
            if end_stream:
                self._ignored.discard(stream_id)
            return
        if stream_is_client_initiated(stream_id) == is_client:
            raise ProtocolError(f"data on our own unidirectional stream {stream_id}")
        state = self._streams.get(stream_id)
        if state is None:
            parser = DataStreamParser(
                self._limits.max_object_payload, self._draft, self._descending.__contains__
            )
            state = self._streams[stream_id] = InStream(parser, since=now)
        state.fin = end_stream
        try:
            items = state.parser.feed(data, end_stream)
        except ObjectTooLarge as exc:
            logger.warning("moqt: dropping stream %d: %s", stream_id, exc.reason)
            self._drop(stream_id)
            return
        self._buffered_bytes += state.parser.buffered - state.buffered
        state.buffered = state.parser.buffered
        if self._buffered_bytes > self._limits.max_buffered_bytes:
            logger.warning("moqt: dropping stream %d: incoming buffers are full", stream_id)
            self._drop(stream_id)
            return
        for item in items:
            if stream_id not in self._streams:
                return  # dropped while handling an earlier item
            if isinstance(item, SubgroupHeader):
                self._on_subgroup_header(stream_id, state, item)
            elif isinstance(item, FetchHeader):
                if item.request_id not in self._fetches:
                    if not self._ids.made(item.request_id):
                        raise ProtocolError(f"fetch stream for unknown fetch {item.request_id}")
                    # A fetch we cancelled: the peer may have opened its stream before our
                    # FETCH_CANCEL reached it.
                    self._drop(stream_id)
                    return
                state.request_id = item.request_id
            elif state.request_id is None:
                self._hold(stream_id, state, item)  # type: ignore[arg-type]
            else:
                self._deliver(stream_id, state, item)
        if end_stream and stream_id in self._streams and state.request_id is not None:
            self._end(stream_id, state)

    def stream_reset(self, stream_id: int, error_code: int) -> None:
        self._ignored.discard(stream_id)
        state = self._pop(stream_id)
        if state is not None and state.request_id is not None:
            self._emit(ev.DataStreamReset(stream_id, state.request_id, error_code))

    def datagram(self, data: bytes) -> None:
        datagram = decode_datagram(data, self._draft)
        track = self._by_alias.get(datagram.track_alias)
        if track is None or track.unsubscribed:
            return  # datagrams may be dropped; an unknown alias is no violation
        self._emit(
            ev.ObjectReceived(
                track.request_id,
                ev.ObjectSource.DATAGRAM,
                datagram.group_id,
                None,
                datagram.object_id,
                datagram.publisher_priority,
                datagram.body,
                None,
                datagram.track_alias,
                datagram.end_of_group,
            )
        )

    # ------------------------------------------------------------------------------------
    # Placing streams.

    def _on_subgroup_header(self, stream_id: int, state: InStream, header: SubgroupHeader) -> None:
        track = self._by_alias.get(header.track_alias)
        if track is not None and track.unsubscribed:
            self._drop(stream_id)
        elif track is not None:
            state.request_id = track.request_id
        elif (
            sum(s.request_id is None for s in self._streams.values())
            > self._limits.max_pending_streams
        ):
            self._drop(stream_id)

    def _hold(self, stream_id: int, state: InStream, obj: SubgroupObject) -> None:
        size = len(obj.body.payload) + len(obj.body.extensions)
        if self._pending_bytes + size > self._limits.max_pending_bytes:
            self._drop(stream_id)
            return
        state.pending.append(obj)
        state.pending_bytes += size
        self._pending_bytes += size

    def _deliver(self, stream_id: int, state: InStream, item: SubgroupObject | FetchObject) -> None:
        request_id = state.request_id
        assert request_id is not None
        header = state.parser.header
        if isinstance(item, FetchObject):
            event = ev.ObjectReceived(
                request_id,
                ev.ObjectSource.FETCH,
                item.group_id,
                item.subgroup_id,
                item.object_id,
                item.publisher_priority,
                item.body,
                stream_id,
            )
        else:
            assert isinstance(header, SubgroupHeader)
            event = ev.ObjectReceived(
                request_id,
                ev.ObjectSource.SUBGROUP,
                header.group_id,
                state.parser.subgroup_id,
                item.object_id,
                header.publisher_priority,
                item.body,
                stream_id,
                header.track_alias,
            )
        self._emit(event)

    def _end(self, stream_id: int, state: InStream) -> None:
        self._pop(stream_id)
        assert state.request_id is not None
        header = state.parser.header
        if isinstance(header, FetchHeader):
            self._fetch_over(state.request_id)
            self._emit(ev.DataStreamEnded(stream_id, state.request_id, ev.ObjectSource.FETCH))
        else:
            assert isinstance(header, SubgroupHeader)
            self._emit(
                ev.DataStreamEnded(
                    stream_id,
                    state.request_id,
                    ev.ObjectSource.SUBGROUP,
                    header.group_id,
                    header.end_of_group,
                )
            )

    def _bind_alias(self, track: RemoteTrack, alias: int) -> None:
        """Give a remote track its alias and release the streams that were waiting for it.

        An alias may be reused once its subscription has ended (PUBLISH_DONE, UNSUBSCRIBE);
        the ended one, kept only to place late streams, gives way.
        """
        previous = self._by_alias.get(alias)
        if previous is not None:
            if previous.done_at is None:
                raise ProtocolError(
                    f"track alias {alias} already in use", SessionErrorCode.DUPLICATE_TRACK_ALIAS
                )
            self.forget(previous.request_id)
        track.track_alias = alias
        self._by_alias[alias] = track
        for stream_id, state in list(self._streams.items()):
            header = state.parser.header
            if (
                state.request_id is None
                and isinstance(header, SubgroupHeader)
                and header.track_alias == alias
            ):
                if track.unsubscribed:
                    self._drop(stream_id)
                    continue
                state.request_id = track.request_id
                pending, state.pending = state.pending, []
                self._pending_bytes -= state.pending_bytes
                state.pending_bytes = 0
                for obj in pending:
                    self._deliver(stream_id, state, obj)
                if state.fin:
                    self._end(stream_id, state)

    def _pop(self, stream_id: int) -> InStream | None:
        """Forget an incoming stream and the bytes it held."""
        state = self._streams.pop(stream_id, None)
        if state is not None:
            self._pending_bytes -= state.pending_bytes
            self._buffered_bytes -= state.buffered
        return state

    def _drop(self, stream_id: int) -> None:
        """Stop reading a stream we will not deliver (unknown alias too long, over a limit).

        A stream that already ended needs no STOP_SENDING (and the QUIC stack may have
        discarded it, which would make ``stop_stream`` raise).
        """
        state = self._pop(stream_id)
        if state is not None and state.fin:
            return
        self._ignored.add(stream_id)
        self._quic.stop_stream(stream_id, StreamResetCode.CANCELLED)
