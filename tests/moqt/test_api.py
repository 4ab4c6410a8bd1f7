"""The application API end to end: a publisher and a subscriber over real QUIC on 127.0.0.1."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sidecar.moqt.aio import api
from sidecar.moqt.aio.quic_backend import MiB, QuicSettings
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.protocol.errors import (
    FetchErrorCode,
    PublishDoneStatus,
    SubscribeErrorCode,
    UsageError,
)
from sidecar.moqt.protocol.model import FullTrackName, Location
from sidecar.moqt.protocol.origin import Origin
from sidecar.moqt.protocol.records import OriginLimits
from tests.support.aio import run
from tests.support.relay import STACKS, publisher_server

HOST = "127.0.0.1"
NAMESPACE = (b"kvcache.moq.arpa/v1", b"smollm2-135m", b"0123abcd")
TRACK = FullTrackName(NAMESPACE, b"int8")


@pytest.fixture
def settings(cert: CertificatePaths) -> QuicSettings:
    return QuicSettings.loopback(ca_file=cert.cert)


def payload(group: int, obj: int, size: int = 100) -> bytes:
    seed = hashlib.sha256(f"{group}/{obj}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


async def write_groups(
    track: api.PublishedTrack, groups: range, objects: int, size: int = 100
) -> None:
    for group in groups:
        for obj in range(objects):
            await track.write(
                group, obj, payload(group, obj, size), end_of_group=obj == objects - 1
            )


async def read_all(objects: AsyncIterator[api.Object]) -> list[api.Object]:
    return [obj async for obj in objects]


def assert_objects(
    received: list[api.Object], expected: list[tuple[int, int]], size: int = 100
) -> None:
    assert [o.location for o in received] == [Location(g, o) for g, o in expected]
    for obj in received:
        assert obj.payload == payload(obj.group_id, obj.object_id, size)


@pytest.mark.parametrize("backend", STACKS)
def test_live_subscription_round_trip(backend: str, cert: CertificatePaths) -> None:
    settings = QuicSettings.loopback(backend=backend, ca_file=cert.cert)  # type: ignore[arg-type]
    publisher = api.Publisher()
    track = publisher.track(NAMESPACE, b"int8")

    async def main() -> None:
        async with (
            publisher_server(settings, cert, publisher) as (url, _),
            api.connect(url, settings) as session,
        ):
            subscription = await session.subscribe(TRACK)
            assert subscription.largest is None
            reader = asyncio.ensure_future(read_all(subscription))
            await write_groups(track, range(3), 5)
            track.end()
            received = await reader
            assert_objects(received, [(g, o) for g in range(3) for o in range(5)])
            assert subscription.done_status == PublishDoneStatus.TRACK_ENDED

    run(main)


def test_subscribe_from_a_start_location_gets_only_new_objects_from_there(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    publisher = api.Publisher()
    track = publisher.track(NAMESPACE, b"int8")

    async def main() -> None:
        await write_groups(track, range(3), 5)
        async with (
            publisher_server(settings, cert, publisher) as (url, _),
            api.connect(url, settings) as session,
        ):
            subscription = await session.subscribe(TRACK, start=Location(4, 2))
            assert subscription.largest == Location(2, 4)
            reader = asyncio.ensure_future(read_all(subscription))
            await write_groups(track, range(3, 7), 5)
            track.end()
            expected = [(4, o) for o in range(2, 5)] + [(g, o) for g in (5, 6) for o in range(5)]
            assert_objects(await reader, expected)

    run(main)


def test_range_subscription_ends_after_its_last_group(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    publisher = api.Publisher()
    track = publisher.track(NAMESPACE, b"int8")

    async def main() -> None:
        async with (
            publisher_server(settings, cert, publisher) as (url, _),
            api.connect(url, settings) as session,
        ):
            subscription = await session.subscribe(TRACK, start=Location(1, 2), end_group=2)
            reader = asyncio.ensure_future(read_all(subscription))
            await write_groups(track, range(5), 4)
            expected = [(1, 2), (1, 3)] + [(2, o) for o in range(4)]
            assert_objects(await reader, expected)
            assert subscription.done_status == PublishDoneStatus.SUBSCRIPTION_ENDED
            assert not track.ended

    run(main)


def test_fetch_past_objects_and_refusals(settings: QuicSettings, cert: CertificatePaths) -> None:
    publisher = api.Publisher()
    track = publisher.track(NAMESPACE, b"int8")

    async def main() -> None:
        await write_groups(track, range(4), 6)
        async with (
            publisher_server(settings, cert, publisher) as (url, _),
            api.connect(url, settings) as session,
        ):
            whole = await session.fetch(TRACK, Location(1, 4), end_group=2)
            assert whole.end_location == Location(2, 6)
            expected = [(1, 4), (1, 5)] + [(2, o) for o in range(6)]
            assert_objects(await read_all(whole), expected)

            part = await session.fetch(TRACK, Location(0, 0), end_group=3, end_object=1)
            expected = [(g, o) for g in range(3) for o in range(6)] + [(3, 0), (3, 1)]
            assert_objects(await read_all(part), expected)

            with pytest.raises(api.RequestRefused) as missing:
                await session.fetch(FullTrackName(NAMESPACE, b"fp4"), Location(0, 0), 1)
            assert missing.value.code == FetchErrorCode.TRACK_DOES_NOT_EXIST
            with pytest.raises(api.RequestRefused) as beyond:
                await session.fetch(TRACK, Location(10, 0), 12)
            # Drafts after 14 have no NO_OBJECTS: an empty range is an invalid one there.
            later = session.connection.moqt.draft.request_replies
            nothing = FetchErrorCode.INVALID_RANGE if later else FetchErrorCode.NO_OBJECTS
            assert beyond.value.code == nothing

    run(main)


def test_track_status_and_unknown_track(settings: QuicSettings, cert: CertificatePaths) -> None:
    publisher = api.Publisher()
    track = publisher.track(NAMESPACE, b"int8")
    publisher.track(NAMESPACE, b"fp16")

    async def main() -> None:
        await write_groups(track, range(2), 3)
        async with (
            publisher_server(settings, cert, publisher) as (url, _),
            api.connect(url, settings) as session,
        ):
            assert (await session.track_status(TRACK)).largest == Location(1, 2)
            empty = await session.track_status(FullTrackName(NAMESPACE, b"fp16"))
            assert empty.largest is None
            unknown = FullTrackName(NAMESPACE, b"nope")
            with pytest.raises(api.RequestRefused) as refused:
                await session.subscribe(unknown)
            assert refused.value.code == SubscribeErrorCode.TRACK_DOES_NOT_EXIST
            with pytest.raises(api.RequestRefused):
                await session.track_status(unknown)

    run(main)


def test_a_session_that_only_subscribes_builds_no_origin_and_serves_nothing(
    settings: QuicSettings, cert: CertificatePaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client without a publisher builds no origin (the real one counted as it is built);
    the peer's requests of it find nothing, as they would at an origin that holds nothing."""
    publisher = api.Publisher()
    built: list[Origin] = []
    build = Origin.__init__

    def counted(origin: Origin, *args: Any, **kwargs: Any) -> None:
        built.append(origin)
        build(origin, *args, **kwargs)

    async def main() -> None:
        async with publisher_server(settings, cert, publisher) as (url, sessions):
            monkeypatch.setattr(Origin, "__init__", counted)
            async with api.connect(url, settings) as client:
                assert client.publisher is None and not built
                server = sessions[0]
                with pytest.raises(api.RequestRefused) as refused:
                    await server.subscribe(TRACK)
                assert refused.value.code == SubscribeErrorCode.TRACK_DOES_NOT_EXIST
                with pytest.raises(api.RequestRefused) as refused:
                    await server.fetch(TRACK, Location(0, 0), 1)
                assert refused.value.code == FetchErrorCode.TRACK_DOES_NOT_EXIST
                with pytest.raises(api.RequestRefused):
                    await server.track_status(TRACK)
                announcements = await server.subscribe_namespace(NAMESPACE[:1])
                await announcements.unsubscribe()
                # It still announces (to a relay, which routes requests here to be refused).
                await client.publish_namespace(NAMESPACE)
            assert not built

    run(main)


@pytest.mark.parametrize("backend", STACKS)
def test_many_objects_and_large_objects(backend: str, cert: CertificatePaths) -> None:
    settings = QuicSettings.loopback(backend=backend, ca_file=cert.cert)  # type: ignore[arg-type]
    publisher = api.Publisher()
    small = publisher.track(NAMESPACE, b"int4")
    large = publisher.track(NAMESPACE, b"fp16")
    rng = random.Random(7)
    sizes = {(g, o): rng.randrange(0, 3000) for g in range(20) for o in range(100)}
    big = [rng.randbytes(1_500_000 + i) for i in range(4)]

    async def main() -> None:
        async with (
            publisher_server(settings, cert, publisher) as (url, _),
            api.connect(url, settings) as session,
        ):
            small_sub = await session.subscribe(FullTrackName(NAMESPACE, b"int4"))
            large_sub = await session.subscribe(FullTrackName(NAMESPACE, b"fp16"))
            readers = asyncio.gather(read_all(small_sub), read_all(large_sub))
            for (group, obj), size in sizes.items():
                await small.write(group, obj, payload(group, obj, size))
            for group, data in enumerate(big):
                await large.write(group, 0, data, end_of_group=True)
            small.end()
            large.end()
            got_small, got_large = await readers
            assert [o.location for o in got_small] == [Location(g, o) for g, o in sizes]
            for obj in got_small:
                assert obj.payload == payload(
                    obj.group_id, obj.object_id, sizes[obj.location.group, obj.location.object]
                )
            assert [o.payload for o in got_large] == big

            fetched = await session.fetch(FullTrackName(NAMESPACE, b"fp16"), Location(1, 0), 3)
            assert [o.payload for o in await read_all(fetched)] == big[1:]

    run(main, timeout=240)


def test_subscriber_that_goes_away_does_not_stall_the_publisher(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    publisher = api.Publisher()
    track = publisher.track(NAMESPACE, b"int8")

    async def main() -> None:
        async with publisher_server(settings, cert, publisher) as (url, sessions):
            async with api.connect(url, settings) as leaving:
                subscription = await leaving.subscribe(TRACK)
                await write_groups(track, range(2), 3)
                first = await anext(subscription)
                assert first.location == Location(0, 0)
            # The subscriber's connection is closed; its queue reports that, not a hang.
            with pytest.raises(api.SessionGone):
                await read_all(subscription)
            await asyncio.wait_for(sessions[0].connection.closed, 10)
            await write_groups(track, range(2, 50), 3, size=60_000)
            assert track.largest == Location(49, 2)

            async with api.connect(url, settings) as staying:
                subscription = await staying.subscribe(TRACK)
                await subscription.unsubscribe()
                await write_groups(track, range(50, 52), 3)
                # Nothing is delivered after an unsubscribe, and the publisher is unaffected.
                assert all(obj.group_id < 50 for obj in await read_all(subscription))
                assert (await staying.track_status(TRACK)).largest == Location(51, 2)

    run(main)


def test_publisher_rejects_writes_out_of_order() -> None:
    async def main() -> None:
        track = api.Publisher().track(NAMESPACE, b"int8")
        await track.write(3, 1, b"x")
        for group, obj in ((3, 1), (3, 0), (2, 9)):
            with pytest.raises(UsageError):
                await track.write(group, obj, b"y")
        small = api.Publisher().track(NAMESPACE, b"int4", cache_bytes=1000)
        with pytest.raises(UsageError):
            await small.write(0, 0, bytes(1001))
        track.end()
        with pytest.raises(UsageError):
            await track.write(5, 0, b"z")

    run(main)


def test_subscriber_that_does_not_read_overflows_instead_of_growing(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    publisher = api.Publisher()
    track = publisher.track(NAMESPACE, b"int8")

    async def main() -> None:
        async with (
            publisher_server(settings, cert, publisher) as (url, _),
            api.connect(url, settings, receive_buffer=200_000) as session,
        ):
            subscription = await session.subscribe(TRACK)
            await write_groups(track, range(4), 2, size=60_000)
            with pytest.raises(api.ReceiveOverflow):
                await read_all(subscription)
            # The subscriber unsubscribed; the publisher stops sending to it.
            await write_groups(track, range(4, 6), 2)
            assert (await session.track_status(TRACK)).largest == Location(5, 1)
            assert track.subscribers == 0

    run(main)


def test_a_writer_goes_at_the_pace_of_its_subscriber_and_loses_it_no_object(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    """Eight times the track's cache through one subscription, written as fast as the writer
    can: it waits for the subscriber (write_backlog), so nothing waits long enough to be
    sent to the cache instead, where most of it would be evicted already (TOO_FAR_BEHIND)."""
    limits = OriginLimits(max_queued_bytes=4 * MiB)
    publisher = api.Publisher(limits, write_backlog=MiB)
    track = publisher.track(NAMESPACE, b"int8", cache_bytes=4 * MiB)
    groups, objects, size = 32, 4, 256 * 1024
    # A short QUIC send backlog, so that what the network has not taken waits in the outbox.
    short = dataclasses.replace(settings, max_send_backlog=256 * 1024)

    async def main() -> None:
        async with (
            publisher_server(short, cert, publisher) as (url, _),
            api.connect(url, settings) as session,
        ):
            subscription = await session.subscribe(TRACK)
            reading = asyncio.ensure_future(read_all(subscription))
            served = publisher.origin.tracks[TRACK]
            most_queued = 0
            for group in range(groups):
                for obj in range(objects):
                    last = obj == objects - 1
                    await track.write(group, obj, payload(group, obj, size), end_of_group=last)
                    most_queued = max(most_queued, publisher.origin.queued_bytes(served))
            assert most_queued <= publisher.write_backlog
            track.end()
            received = sorted(await reading, key=lambda obj: obj.location)  # groups interleave
            assert_objects(received, [(g, o) for g in range(groups) for o in range(objects)], size)
            assert subscription.done_status == PublishDoneStatus.TRACK_ENDED

    run(main)


def test_namespace_announcement_is_accepted(settings: QuicSettings, cert: CertificatePaths) -> None:
    async def main() -> None:
        async with (
            publisher_server(settings, cert, api.Publisher()) as (url, _),
            api.connect(url, settings) as session,
        ):
            await session.publish_namespace(NAMESPACE)

    run(main)


@pytest.mark.parametrize("backend", STACKS)
def test_requests_on_a_connection_the_peer_closed_end_with_the_session(
    backend: str, cert: CertificatePaths
) -> None:
    """Between the peer's CONNECTION_CLOSE and the end of QUIC's draining period the session
    still looks open; a request made then is SessionGone (a ConnectionError, which callers
    handle), not the stack's own error (qh3 raised QuicConnectionError, and a sidecar's
    Publish failed with it) nor a wait for an answer that cannot come; ending a request
    then only forgets it."""
    settings = QuicSettings.loopback(backend=backend, ca_file=cert.cert)  # type: ignore[arg-type]

    async def main() -> None:
        publisher = api.Publisher()
        publisher.track(NAMESPACE, b"int8")
        async with (
            publisher_server(settings, cert, publisher) as (url, sessions),
            api.connect(url, settings) as session,
        ):
            subscription = await session.subscribe(TRACK)
            sessions[0].connection.close(reason="going away")
            while not session.connection.closing:
                await asyncio.sleep(0.01)
            assert not session.closed  # still draining
            requests = (
                lambda: session.subscribe(TRACK),
                lambda: session.fetch(TRACK, Location(0, 0), 0),
                lambda: session.track_status(TRACK),
                lambda: session.publish_namespace(NAMESPACE),
                lambda: session.subscribe_namespace(NAMESPACE[:2]),
            )
            for request in requests:
                with pytest.raises(api.SessionGone):
                    await request()
            await subscription.unsubscribe()  # nothing to tell the peer: no error either

    run(main)


class OnDemand(api.Publisher):
    """Makes a track the first time a peer asks for it, once the test lets it: a publisher
    whose tracks take work to produce (as KVPublisher's do)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def resolve(self, name: FullTrackName) -> api.PublishedTrack | None:
        if name.name == b"broken":
            raise RuntimeError("cannot produce it")
        await self.go.wait()
        track = self.track(name.namespace, name.name)
        if track.largest is None:
            await write_groups(track, range(2), 3)
        return track


def test_a_subscribe_given_up_before_its_answer_is_withdrawn(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    """A SUBSCRIBE cancelled while the publisher still works on it is withdrawn
    (UNSUBSCRIBE): the track can be asked for again on the session at once, and the late
    answer to the first request troubles neither side."""
    publisher = OnDemand()

    async def main() -> None:
        async with (
            publisher_server(settings, cert, publisher) as (url, _),
            api.connect(url, settings) as session,
        ):
            asking = asyncio.ensure_future(session.subscribe(TRACK))
            await asyncio.sleep(0.2)  # the SUBSCRIBE is out, held by the publisher
            asking.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asking
            publisher.go.set()
            subscription = await session.subscribe(TRACK)
            track = publisher.track(NAMESPACE, b"int8")
            await write_groups(track, range(2, 3), 2)
            track.end()
            received = [obj async for obj in subscription if obj.group_id == 2]
            assert_objects(received, [(2, 0), (2, 1)])

    run(main)


def test_a_track_resolved_on_request_is_awaited_while_the_session_serves_others(
    settings: QuicSettings, cert: CertificatePaths
) -> None:
    publisher = OnDemand()
    held = publisher.track(NAMESPACE, b"held")

    async def main() -> None:
        await write_groups(held, range(1), 2)
        async with (
            publisher_server(settings, cert, publisher) as (url, _),
            api.connect(url, settings) as session,
        ):
            pending = asyncio.ensure_future(session.fetch(TRACK, Location(0, 0), 1))
            await asyncio.sleep(0)  # the FETCH goes out first
            status = await session.track_status(FullTrackName(NAMESPACE, b"held"))
            assert status.largest == Location(0, 1) and not pending.done()
            with pytest.raises(api.RequestRefused) as refused:
                await session.track_status(FullTrackName(NAMESPACE, b"broken"))
            assert refused.value.code == SubscribeErrorCode.INTERNAL_ERROR
            publisher.go.set()
            assert_objects(
                await read_all(await pending), [(g, o) for g in range(2) for o in range(3)]
            )
            # Now held: answered from `get`, without resolving again.
            assert (await session.track_status(TRACK)).largest == Location(1, 2)

    run(main)
