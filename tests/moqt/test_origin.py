"""The sans-I/O origin serving a real session in memory: an application's tracks answered
from what it holds, by the code a relay answers with (no process, no socket)."""

from __future__ import annotations

import pytest

from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol.errors import (
    FetchErrorCode,
    PublishDoneStatus,
    SubscribeErrorCode,
    UsageError,
)
from sidecar.moqt.protocol.messages import FilterType, StandaloneFetch, SubscriptionFilter
from sidecar.moqt.protocol.model import FullTrackName, Location, ObjectStatus, TrackObject
from sidecar.moqt.protocol.origin import Origin
from sidecar.moqt.protocol.records import OriginLimits, Track
from tests.support.memory import Served, of

NAMESPACE = (b"kvcache.moq.arpa/v1", b"smollm2", b"abc123")
TRACK = FullTrackName(NAMESPACE, b"fp16")
FROM_START = SubscriptionFilter(FilterType.ABSOLUTE_START, Location(0, 0))


def write(origin: Origin, track: Track, group: int, count: int) -> None:
    for object_id in range(count):
        obj = TrackObject(object_id, payload(group, object_id))
        origin.write_local(track, group, obj, end_of_group=object_id == count - 1)


def payload(group: int, object_id: int) -> bytes:
    return f"{group}/{object_id}".encode() * 10


def objects(events: list[ev.MoqtEvent]) -> list[tuple[int, int, bytes]]:
    return [(e.group_id, e.object_id, e.body.payload) for e in of(events, ev.ObjectReceived)]


def expected(groups: range, count: int) -> list[tuple[int, int, bytes]]:
    return [(g, o, payload(g, o)) for g in groups for o in range(count)]


def test_a_local_track_is_replayed_from_its_cache_then_served_live() -> None:
    served = Served(Origin())
    track = served.origin.open_local(TRACK, 1 << 20)
    write(served.origin, track, 0, 3)
    request_id = served.client().subscribe(TRACK, filter=FROM_START)
    events = served.run()
    accepted = of(events, ev.RequestAccepted)
    assert [a.request_id for a in accepted] == [request_id]
    assert accepted[0].message.largest == Location(0, 2)
    assert objects(events) == expected(range(1), 3)  # group 0 from the pinned cache
    write(served.origin, track, 1, 3)
    assert objects(served.run()) == expected(range(1, 2), 3)  # group 1 as it is written
    served.origin.end_local(track)
    ended = of(served.run(), ev.SubscriptionEnded)
    assert [e.message.status_code for e in ended] == [PublishDoneStatus.TRACK_ENDED]


def test_a_subscriber_from_the_next_object_gets_only_what_is_written_after() -> None:
    """It joins after group 0 ended: it is told so (an END_OF_GROUP status object where it
    starts, as serving._end_joined_group says why), then gets group 1 as it is written."""
    served = Served(Origin())
    track = served.origin.open_local(TRACK, 1 << 20)
    write(served.origin, track, 0, 2)
    served.client().subscribe(TRACK)
    events = of(served.run(), ev.ObjectReceived)
    assert [(e.group_id, e.object_id, e.body.status) for e in events] == [
        (0, 2, ObjectStatus.END_OF_GROUP)
    ]
    write(served.origin, track, 1, 2)
    assert objects(served.run()) == expected(range(1, 2), 2)


def test_fetch_and_track_status_are_answered_from_what_it_holds() -> None:
    served = Served(Origin())
    track = served.origin.open_local(TRACK, 1 << 20)
    for group in range(3):
        write(served.origin, track, group, 4)
    status_id = served.client().track_status(TRACK)
    fetch_id = served.client().fetch(StandaloneFetch(TRACK, Location(1, 2), 2, 1))
    events = served.run()
    replies = {a.request_id: a.message for a in of(events, ev.RequestAccepted)}
    assert replies[status_id].largest == Location(2, 3)
    assert replies[fetch_id].end == Location(2, 2)  # one past its last object (fetch_end)
    wanted = [(1, 2), (1, 3), (2, 0), (2, 1)]
    assert objects(events) == [(g, o, payload(g, o)) for g, o in wanted]
    assert [e.request_id for e in of(events, ev.DataStreamEnded)] == [fetch_id]


def test_a_track_it_does_not_hold_is_refused() -> None:
    served = Served(Origin())
    subscribe_id = served.client().subscribe(TRACK)
    fetch_id = served.client().fetch(StandaloneFetch(TRACK, Location(0, 0), 1, None))
    codes = {r.request_id: r.message.error_code for r in of(served.run(), ev.RequestRejected)}
    assert codes == {
        subscribe_id: SubscribeErrorCode.TRACK_DOES_NOT_EXIST,
        fetch_id: FetchErrorCode.TRACK_DOES_NOT_EXIST,
    }
    assert served.origin.tracks == {}  # nothing kept for a refused request


def test_namespace_followers_are_told_of_local_tracks_and_their_withdrawal() -> None:
    served = Served(Origin())
    served.client().subscribe_namespace(NAMESPACE[:2])
    assert len(of(served.run(), ev.RequestAccepted)) == 1
    served.origin.open_local(TRACK, 1 << 20)
    events = served.run()
    assert [e.message.namespace for e in of(events, ev.NamespacePublished)] == [NAMESPACE]
    assert [e.message.track for e in of(events, ev.PublishRequested)] == [TRACK]
    served.origin.close_local(TRACK)
    assert [e.namespace for e in of(served.run(), ev.NamespacePublishDone)] == [NAMESPACE]


def test_its_bounds_hold() -> None:
    served = Served(Origin(OriginLimits(max_tracks=1, max_subscribers_per_track=1)), clients=2)
    track = served.origin.open_local(TRACK, 1 << 10)
    with pytest.raises(UsageError, match="holds 1 tracks"):
        served.origin.open_local(FullTrackName(NAMESPACE, b"int8"), 1 << 10)
    with pytest.raises(UsageError, match="already has a publisher"):
        served.origin.open_local(TRACK, 1 << 10)
    with pytest.raises(ValueError):  # one object over the track's whole bound
        served.origin.write_local(track, 0, TrackObject(0, b"x" * (1 << 11)), end_of_group=True)
    first = served.client().subscribe(TRACK)
    served.run()
    second = served.client(1).subscribe(TRACK)
    refused = of(served.run(client=1), ev.RequestRejected)
    assert [(r.request_id, r.message.reason) for r in refused] == [(second, "too many subscribers")]
    assert [sub.request_id for sub in track.subscribers] == [first]
