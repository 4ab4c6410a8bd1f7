"""What this session sends the peer as objects: the tracks it publishes to the peer (a
SUBSCRIBE it accepted, or its own PUBLISH), and the subgroup streams, FETCH streams and
datagrams that carry them.

The session's data plane, reached as ``MoqtSession.objects``: the control stream decides
what may be sent (a track exists from SUBSCRIBE_OK or PUBLISH until PUBLISH_DONE or
UNSUBSCRIBE; a FETCH stream may open once FETCH_OK went out), and this writes the objects,
checking that ids rise along a stream and that arguments encode before anything is written.
Objects are written as the session's draft has them; an object whose status that draft cannot
say (draft 16 has no DOES_NOT_EXIST, and no status at all on FETCH streams) is left out: a
missing object is a gap in the ids there, and a FETCH's end says where its objects stop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .connection import QuicConnectionLike
from .data import (
    FetchHeader,
    FetchObject,
    ObjectBody,
    ObjectDatagram,
    SubgroupHeader,
    SubgroupObject,
)
from .drafts import DRAFT_14, Draft
from .errors import StreamResetCode, UsageError
from .model import FullTrackName, ObjectStatus


@contextmanager
def caller_errors() -> Iterator[None]:
    """Bad arguments found while encoding (``ValueError`` from the wire layer) are the
    caller's mistake: report them as ``UsageError``, with nothing written."""
    try:
        yield
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@dataclass(slots=True)
class LocalTrack:
    """A track we publish to the peer (its SUBSCRIBE we accepted, or our PUBLISH)."""

    request_id: int
    track: FullTrackName
    track_alias: int
    streams_opened: int = 0


@dataclass(slots=True)
class OutStream:
    request_id: int
    header: SubgroupHeader | FetchHeader
    previous_id: int | None = None
    previous_fetched: FetchObject | None = None
    """The FETCH stream's last object, which draft 16 writes the next one against."""


class Outgoing:
    """See the module docstring. ``closed`` says whether the session is closed (nothing may
    be written then); ``fetch_accepted`` whether a FETCH of the peer's was answered with
    FETCH_OK and is not over (its stream may open); ``fetch_over`` is told when a FETCH's
    stream ended, which ends the peer's request."""

    def __init__(
        self,
        quic: QuicConnectionLike,
        *,
        closed: Callable[[], bool],
        fetch_accepted: Callable[[int], bool],
        fetch_over: Callable[[int], None],
        draft: Draft = DRAFT_14,
    ) -> None:
        self._quic = quic
        self._draft = draft
        self._closed = closed
        self._fetch_accepted = fetch_accepted
        self._fetch_over = fetch_over
        self._tracks: dict[int, LocalTrack] = {}
        self._next_alias = 0
        self._streams: dict[int, OutStream] = {}

    # ------------------------------------------------------------------------------------
    # What the control stream decided.

    def add_track(self, request_id: int, track: FullTrackName) -> int:
        """A track we now publish under ``request_id``; returns the alias chosen for it."""
        if any(t.track == track for t in self._tracks.values()):
            raise UsageError(f"{track} is already published on this session")
        alias = self._next_alias
        self._next_alias += 1
        self._tracks[request_id] = LocalTrack(request_id, track, alias)
        return alias

    def has_track(self, request_id: int) -> bool:
        return request_id in self._tracks

    def drop_track(self, request_id: int) -> LocalTrack | None:
        return self._tracks.pop(request_id, None)

    def fetch_cancelled(self, request_id: int) -> None:
        """The peer cancelled a FETCH: its stream, if open, is reset."""
        for stream_id, stream in list(self._streams.items()):
            if stream.request_id == request_id:
                self.reset_stream(stream_id, StreamResetCode.CANCELLED)

    def stop_sending(self, stream_id: int, error_code: int) -> int | None:
        """The peer's STOP_SENDING: the stream is reset; the request it served, if known."""
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return None
        self._quic.reset_stream(stream_id, error_code)
        self._closed_stream(stream)
        return stream.request_id

    # ------------------------------------------------------------------------------------
    # Objects.

    def track_alias(self, request_id: int) -> int:
        """The alias of a track we publish (chosen in ``subscribe_ok`` or ``publish``)."""
        return self.track(request_id).track_alias

    def track(self, request_id: int) -> LocalTrack:
        track = self._tracks.get(request_id)
        if track is None:
            raise UsageError(f"no published track {request_id}")
        return track

    def open_subgroup(
        self,
        request_id: int,
        group_id: int,
        subgroup_id: int = 0,
        publisher_priority: int = 128,
        *,
        extensions: bool = False,
        end_of_group: bool = False,
    ) -> int:
        """Open a subgroup stream of a track we publish; returns its stream id.

        ``extensions`` must be set for objects on it to carry extension headers;
        ``end_of_group`` declares that the stream's last object ends the group.
        """
        track = self.track(request_id)
        header = SubgroupHeader.for_subgroup(
            track.track_alias, group_id, subgroup_id, publisher_priority, extensions, end_of_group
        )
        stream_id = self._open(request_id, header)
        track.streams_opened += 1
        return stream_id

    def send_object(
        self,
        stream_id: int,
        object_id: int,
        payload: bytes = b"",
        *,
        status: ObjectStatus = ObjectStatus.NORMAL,
        extensions: bytes = b"",
        end_stream: bool = False,
    ) -> None:
        """Write one object on a subgroup stream; ids must increase along the stream."""
        stream = self._stream(stream_id, SubgroupHeader)
        with caller_errors():
            body = ObjectBody(payload, status, extensions)
            if status not in self._draft.object_statuses:
                data = b""  # a gap in the ids says it
            else:
                previous = stream.previous_id
                data = SubgroupObject(object_id, body).encode(stream.header, previous, self._draft)  # type: ignore[arg-type]
                stream.previous_id = object_id
        self._write(stream_id, data, end_stream)

    def open_fetch_stream(self, request_id: int) -> int:
        """Open the response stream of a FETCH we accepted."""
        if not self._fetch_accepted(request_id):
            raise UsageError(f"no accepted fetch {request_id}")
        return self._open(request_id, FetchHeader(request_id))

    def send_fetch_object(
        self,
        stream_id: int,
        group_id: int,
        subgroup_id: int,
        object_id: int,
        payload: bytes = b"",
        *,
        publisher_priority: int = 128,
        status: ObjectStatus = ObjectStatus.NORMAL,
        extensions: bytes = b"",
        end_stream: bool = False,
    ) -> None:
        stream = self._stream(stream_id, FetchHeader)
        with caller_errors():
            body = ObjectBody(payload, status, extensions)
            obj = FetchObject(group_id, subgroup_id, object_id, publisher_priority, body)
            if self._draft.fetch_flags and status != ObjectStatus.NORMAL:
                data = b""  # no status on draft 16's FETCH streams
            else:
                data = obj.encode(stream.previous_fetched, self._draft)
                stream.previous_fetched = obj
        self._write(stream_id, data, end_stream)

    def end_stream(self, stream_id: int) -> None:
        """FIN a data stream after its last object."""
        self._stream(stream_id, object)
        self._write(stream_id, b"", True)

    def reset_stream(self, stream_id: int, error_code: int = StreamResetCode.CANCELLED) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            raise UsageError(f"no open data stream {stream_id}")
        self._quic.reset_stream(stream_id, error_code)
        self._closed_stream(stream)

    def send_datagram(
        self,
        request_id: int,
        group_id: int,
        object_id: int,
        payload: bytes = b"",
        *,
        publisher_priority: int = 128,
        status: ObjectStatus = ObjectStatus.NORMAL,
        extensions: bytes = b"",
        end_of_group: bool = False,
    ) -> None:
        """Send a small object as a QUIC datagram (dropped by QUIC if it does not fit)."""
        track = self.track(request_id)
        if status not in self._draft.object_statuses:
            return
        with caller_errors():
            body = ObjectBody(payload, status, extensions)
            data = ObjectDatagram(
                track.track_alias, group_id, object_id, publisher_priority, body, end_of_group
            ).encode(self._draft)
        self._quic.send_datagram_frame(data)

    # ------------------------------------------------------------------------------------

    def _open(self, request_id: int, header: SubgroupHeader | FetchHeader) -> int:
        if self._closed():
            raise UsageError("session is closed")
        with caller_errors():
            data = header.encode(self._draft)
        stream_id = self._quic.get_next_available_stream_id(True)
        self._quic.send_stream_data(stream_id, data, False)
        self._streams[stream_id] = OutStream(request_id, header)
        return stream_id

    def _stream(self, stream_id: int, header_type: type) -> OutStream:
        stream = self._streams.get(stream_id)
        if stream is None or not isinstance(stream.header, header_type):
            raise UsageError(f"no open {header_type.__name__} stream {stream_id}")
        return stream

    def _write(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        if self._closed():
            raise UsageError("session is closed")
        self._quic.send_stream_data(stream_id, data, end_stream)
        if end_stream:
            self._closed_stream(self._streams.pop(stream_id))

    def _closed_stream(self, stream: OutStream) -> None:
        """A FETCH is over once its stream is; the peer's request ends with it."""
        if isinstance(stream.header, FetchHeader):
            self._fetch_over(stream.request_id)
