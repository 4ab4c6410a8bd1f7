"""The relay process end to end: routing, fan-out, namespaces, the cache, FETCH, slow peers.

Every test runs a real `kvmoq relay` process and real MoQT sessions over QUIC on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest

from sidecar.moqt.aio.quic_backend import QuicSettings, load_backend
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.protocol.data import FetchHeader, FetchObject, ObjectBody
from sidecar.moqt.protocol.errors import FetchErrorCode, PublishDoneStatus, SubscribeErrorCode
from sidecar.moqt.protocol.events import (
    DataStreamEnded,
    DataStreamReset,
    FetchCancelled,
    FetchRequested,
    GoawayReceived,
    NamespacePublishDone,
    ObjectReceived,
    RequestAccepted,
    RequestRejected,
    SubscribeRequested,
    SubscriptionEnded,
    TrackStatusRequested,
)
from sidecar.moqt.protocol.messages import FilterType, StandaloneFetch, SubscriptionFilter
from sidecar.moqt.protocol.model import Location, ObjectStatus
from tests.support.aio import run
from tests.support.relay import (
    FROM_START,
    NAMESPACE,
    RELAY_BACKENDS,
    REPO,
    TRACK,
    Client,
    RelayProcess,
    Sessions,
    accept,
    announce,
    expected,
    payload,
    received,
    running_relay,
    send_groups,
)

# Times loads over paced links or stall watches: scripts/test.sh runs it alone (see there).
pytestmark = pytest.mark.timing


async def subscribe(client: Client, filter: SubscriptionFilter = FROM_START) -> int:
    request_id = client.moqt.subscribe(TRACK, filter=filter)
    client.send()
    await client.next(RequestAccepted, lambda e: e.request_id == request_id)
    return request_id


async def all_acknowledged(client: Client) -> None:
    """Wait until the peer acknowledged everything ``client`` sent."""
    assert client.connection is not None
    quic = client.connection.endpoint.quic
    backlog = load_backend(QuicSettings().backend).send_backlog  # the sessions' default stack
    while backlog(quic):
        await asyncio.sleep(0.05)


def all_streams_ended(client: Client, request_id: int, last_group: int) -> bool:
    """The last group has arrived and every stream that brought objects has ended."""
    objects = client.objects(request_id)
    ended = {e.stream_id for e in client.of(DataStreamEnded)}
    return any(e.group_id == last_group for e in objects) and all(
        e.stream_id in ended for e in objects
    )


def answer_fetch(publisher: Client, request_id: int) -> None:
    """FETCH_OK, then groups 0 and 1 of 3 objects of 3000 bytes on the fetch stream, FIN."""
    moqt = publisher.moqt
    moqt.fetch_ok(request_id, Location(1, 2))
    stream = moqt.objects.open_fetch_stream(request_id)
    for group in range(2):
        for obj in range(3):
            moqt.objects.send_fetch_object(stream, group, 0, obj, payload(group, obj, 3000))
    moqt.objects.end_stream(stream)
    publisher.send()


@dataclass
class Pulled:
    """A track a publisher sent whole through the relay to a first subscriber."""

    prefill: Client
    first: Client
    first_id: int
    upstream: int
    sent: int


async def pulled_through(sessions: Sessions, groups: int, objects: int, size: int) -> Pulled:
    """A publisher announces, a first subscriber asks from the start, the publisher sends
    `groups` x `objects` of `size` bytes, and the subscriber has them all (the relay, too)."""
    prefill = await sessions.open()
    await announce(prefill)
    first = await sessions.open()
    first_id = first.moqt.subscribe(TRACK, filter=FROM_START)
    first.send()
    upstream = accept(prefill, await prefill.next(SubscribeRequested))
    sent = await send_groups(prefill, upstream, groups=groups, objects=objects, size=size)
    await first.until(lambda: len(first.objects(first_id)) == sent)
    return Pulled(prefill, first, first_id, upstream, sent)


def test_prints_its_url_and_leaves_on_sigterm_with_goaway(cert: CertificatePaths) -> None:
    with running_relay(cert) as relay:

        async def main() -> None:
            async with Sessions(relay, cert) as sessions:
                client = await sessions.open()
                relay.process.send_signal(15)
                await client.next(GoawayReceived)

        run(main)
        assert relay.process.wait(15) == 0


@pytest.mark.parametrize("relay", RELAY_BACKENDS, indirect=True)
def test_one_upstream_subscription_fans_out_to_every_subscriber(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            publisher = await sessions.open()
            await announce(publisher)
            decoders = [await sessions.open() for _ in range(3)]
            first = decoders[0].moqt.subscribe(TRACK)
            decoders[0].send()
            upstream = accept(publisher, await publisher.next(SubscribeRequested))
            await decoders[0].next(RequestAccepted, lambda e: e.request_id == first)
            request_ids = [first]
            for decoder in decoders[1:]:
                request_ids.append(await subscribe(decoder, SubscriptionFilter()))
            sent = await send_groups(publisher, upstream, groups=3, objects=4, size=5000)
            for decoder, request_id in zip(decoders, request_ids, strict=True):
                await decoder.until(lambda d=decoder, r=request_id: len(d.objects(r)) == sent)
                assert received(decoder, request_id) == expected(3, 4, 5000)
            assert len(publisher.of(SubscribeRequested)) == 1

    run(main)


@pytest.mark.parametrize("relay", RELAY_BACKENDS, indirect=True)
def test_late_decoders_load_past_groups_from_the_cache(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """Prefill publishes once; decoders arriving later, even after it left, get every group."""

    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            pulled = await pulled_through(sessions, groups=6, objects=3, size=20_000)
            prefill, first, sent = pulled.prefill, pulled.first, pulled.sent

            second = await sessions.open()
            second_id = await subscribe(second)
            await second.until(lambda: len(second.objects(second_id)) == sent, "cached objects")
            assert received(second, second_id) == expected(6, 3, 20_000)

            await sessions.close(prefill)
            await first.next(SubscriptionEnded)
            third = await sessions.open()
            third_id = await subscribe(third)
            ended = await third.next(SubscriptionEnded, lambda e: e.request_id == third_id)
            assert ended.message.status_code == PublishDoneStatus.TRACK_ENDED
            await third.until(lambda: len(third.objects(third_id)) == sent)
            assert received(third, third_id) == expected(6, 3, 20_000)

            fetch_id = third.moqt.fetch(StandaloneFetch(TRACK, Location(2, 1), 4, None))
            third.send()
            await third.next(DataStreamEnded, lambda e: e.request_id == fetch_id)
            fetched = [(g, o, p) for g, o, p in expected(6, 3, 20_000) if (2, 1) <= (g, o) < (5, 0)]
            assert received(third, fetch_id) == fetched
            assert len(prefill.of(SubscribeRequested)) == 1
            assert sent == 6 * 3

    run(main)


def test_subscribers_waiting_on_a_publisher_that_leaves_get_the_cache(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """The relay forwarded a SUBSCRIBE to the publisher, which leaves (its pod restarts)
    before answering: the subscriber gets what the relay caches of the track, instead of a
    refusal that would leave every decoder to recompute a prompt the relay holds."""

    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            pulled = await pulled_through(sessions, groups=3, objects=2, size=5_000)
            prefill, sent = pulled.prefill, pulled.sent
            prefill.moqt.publish_done(pulled.upstream, PublishDoneStatus.TRACK_ENDED)
            prefill.send()
            await pulled.first.next(SubscriptionEnded)

            second = await sessions.open()
            second_id = second.moqt.subscribe(TRACK, filter=FROM_START)
            second.send()
            await prefill.until(lambda: len(prefill.of(SubscribeRequested)) == 2)
            await sessions.close(prefill)  # without answering it
            await second.next(RequestAccepted, lambda e: e.request_id == second_id)
            await second.until(lambda: len(second.objects(second_id)) == sent, "cached objects")
            assert received(second, second_id) == expected(3, 2, 5_000)
            assert not second.of(RequestRejected)

    run(main)


def test_a_subscriber_joining_after_a_whole_group_hears_that_it_ended(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """A Largest Object subscriber starts right after the newest object and fetches the rest
    of that group; when the group has ended, an END_OF_GROUP status object at the start says
    so (else moq-rs holds the group open until the subscription ends)."""

    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            publisher = await sessions.open()
            await announce(publisher)
            first = await sessions.open()
            first_id = first.moqt.subscribe(TRACK, filter=FROM_START)
            first.send()
            upstream = accept(publisher, await publisher.next(SubscribeRequested))
            await send_groups(publisher, upstream, groups=2, objects=2, size=100)
            await first.until(lambda: all_streams_ended(first, first_id, last_group=1))

            late = await sessions.open()
            late_id = await subscribe(late, SubscriptionFilter())
            marker = await late.next(ObjectReceived, lambda e: e.request_id == late_id)
            assert (marker.group_id, marker.object_id) == (1, 2)
            assert marker.body.status == ObjectStatus.END_OF_GROUP
            await late.next(DataStreamEnded, lambda e: e.stream_id == marker.stream_id)

    run(main)


@pytest.mark.parametrize("relay", RELAY_BACKENDS, indirect=True)
def test_fetch_goes_upstream_once_then_comes_from_the_cache(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            publisher = await sessions.open()
            await announce(publisher)
            decoder = await sessions.open()
            target = StandaloneFetch(TRACK, Location(0, 0), 1, None)
            first = decoder.moqt.fetch(target)
            decoder.send()
            request = (await publisher.next(FetchRequested)).message
            answer_fetch(publisher, request.request_id)
            await decoder.next(DataStreamEnded, lambda e: e.request_id == first)
            assert received(decoder, first) == expected(2, 3, 3000)

            again = decoder.moqt.fetch(target)
            decoder.send()
            await decoder.next(DataStreamEnded, lambda e: e.request_id == again)
            assert received(decoder, again) == expected(2, 3, 3000)
            assert len(publisher.of(FetchRequested)) == 1

    run(main)


def test_fetches_of_one_range_in_flight_go_upstream_once(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """Decoders ask for a chunk at once: the relay sends the publisher one FETCH and serves
    the others from what it brings, even once the decoder that asked first cancelled."""

    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            publisher = await sessions.open()
            await announce(publisher)
            first, second, third = [await sessions.open() for _ in range(3)]
            target = StandaloneFetch(TRACK, Location(0, 0), 1, None)
            ids = []
            for decoder in (first, second, third):
                ids.append(decoder.moqt.fetch(target))
                decoder.send()
                await asyncio.sleep(0.1)  # in this order at the relay
            first.moqt.fetch_cancel(ids[0])
            first.send()
            await asyncio.sleep(0.2)
            request = (await publisher.next(FetchRequested)).message
            answer_fetch(publisher, request.request_id)
            for decoder, request_id in ((second, ids[1]), (third, ids[2])):
                await decoder.next(DataStreamEnded, lambda e, r=request_id: e.request_id == r)
                assert received(decoder, request_id) == expected(2, 3, 3000)
            assert len(publisher.of(FetchRequested)) == 1
            assert not publisher.of(FetchCancelled)

    run(main)


def test_fetch_objects_that_overtake_fetch_ok_wait_for_it(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """A publisher's FETCH stream and its FETCH_OK travel on different QUIC streams, so the
    objects (even the stream's FIN) can reach the relay first. The relay must hold them until
    it has answered its subscriber, then pass every one on."""

    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            publisher = await sessions.open()
            await announce(publisher)
            decoder = await sessions.open()
            fetch_id = decoder.moqt.fetch(StandaloneFetch(TRACK, Location(0, 0), 1, None))
            decoder.send()
            request = (await publisher.next(FetchRequested)).message
            # The data stream by hand: the session only opens one for a FETCH it answered.
            assert publisher.connection is not None
            quic = publisher.connection.endpoint.quic
            objects = [
                FetchObject(group, 0, obj, body=ObjectBody(payload(group, obj, 3000)))
                for group in range(2)
                for obj in range(3)
            ]
            data = FetchHeader(request.request_id).encode() + b"".join(
                obj.encode(objects[i - 1] if i else None, publisher.moqt.draft)
                for i, obj in enumerate(objects)
            )
            quic.send_stream_data(quic.get_next_available_stream_id(True), data, True)
            publisher.send()
            await asyncio.sleep(0.5)  # the relay reads the whole stream before FETCH_OK
            assert not decoder.of(RequestAccepted, lambda e: e.request_id == fetch_id)
            publisher.moqt.fetch_ok(request.request_id, Location(1, 2))
            publisher.send()
            await decoder.next(DataStreamEnded, lambda e: e.request_id == fetch_id)
            assert received(decoder, fetch_id) == expected(2, 3, 3000)
            assert decoder.of(RequestAccepted, lambda e: e.request_id == fetch_id)

    run(main)


def test_unknown_tracks_and_empty_ranges_are_refused(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            client = await sessions.open()
            subscribe_id = client.moqt.subscribe(TRACK)
            fetch_id = client.moqt.fetch(StandaloneFetch(TRACK, Location(0, 0), 3, None))
            client.send()
            refused = await client.next(RequestRejected, lambda e: e.request_id == subscribe_id)
            assert refused.message.error_code == SubscribeErrorCode.TRACK_DOES_NOT_EXIST
            refused = await client.next(RequestRejected, lambda e: e.request_id == fetch_id)
            assert refused.message.error_code == FetchErrorCode.TRACK_DOES_NOT_EXIST

    run(main)


def test_namespace_subscribers_hear_of_publishers_coming_and_going(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    other = (b"kvcache.moq.arpa/v1", b"smollm2", b"prompt-2")

    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            early = await sessions.open()
            await announce(early)
            follower = await sessions.open()
            request_id = follower.moqt.subscribe_namespace(NAMESPACE[:2])
            follower.send()
            await follower.next(RequestAccepted, lambda e: e.request_id == request_id)
            await follower.hears(NAMESPACE)

            late = await sessions.open()
            await announce(late, other)
            await follower.hears(other)
            await announce(late, (b"elsewhere",))

            await sessions.close(late)
            await follower.next(NamespacePublishDone, lambda e: e.namespace == other)
            assert (b"elsewhere",) not in follower.heard()
            assert not follower.of(NamespacePublishDone, lambda e: e.namespace == NAMESPACE)

    run(main)


@pytest.mark.parametrize("backend", RELAY_BACKENDS)
def test_a_subscriber_that_stops_reading_falls_behind_alone(
    cert: CertificatePaths, backend: str
) -> None:
    """A stalled subscriber reads the cache once it wakes; the cache (4 MiB) lost what it had
    not read (12 MiB were sent), so it gets TOO_FAR_BEHIND. The relay stays up, and a new
    subscriber gets the groups still cached, each whole and intact."""
    namespace = json.dumps([part.decode() for part in NAMESPACE])
    flags = ("--max-queued-bytes", str(1 << 20), "--cache-bytes", str(4 << 20))
    with running_relay(cert, *flags, backend=backend) as relay:
        size = str(relay.settings.max_datagram_size)
        argv = [sys.executable, "-m", "tests.support.relay", relay.url, str(cert.cert)]
        stalled: list[subprocess.Popen[str]] = []

        async def main() -> None:
            async with Sessions(relay, cert) as sessions:
                publisher = await sessions.open()
                await announce(publisher)
                process = subprocess.Popen(
                    [*argv, namespace, TRACK.name.decode(), size],
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                stalled.append(process)
                assert process.stdout is not None
                upstream = accept(publisher, await publisher.next(SubscribeRequested))
                ready = await asyncio.to_thread(process.stdout.readline)
                assert json.loads(ready) == {"event": "ready"}
                process.send_signal(signal.SIGSTOP)
                # More than the relay's QUIC backlog (8 MiB), its queue (1 MiB), its cache.
                sent = await send_groups(publisher, upstream, groups=12, objects=16, size=65_536)
                await all_acknowledged(publisher)  # the relay has taken in every object
                late = await sessions.open()
                late_id = late.moqt.subscribe(TRACK, filter=FROM_START)
                late.send()
                await late.next(RequestAccepted, lambda e: e.request_id == late_id)
                await late.until(lambda: all_streams_ended(late, late_id, last_group=11))
                groups = {e.group_id for e in late.objects(late_id)}
                assert 0 not in groups  # evicted: 4 MiB hold fewer than four groups
                whole = [r for r in expected(12, 16, 65_536) if r[0] in groups]
                assert received(late, late_id) == whole
                process.send_signal(signal.SIGCONT)
                ended = json.loads(await asyncio.to_thread(process.stdout.readline))
                assert ended["status"] == PublishDoneStatus.TOO_FAR_BEHIND
                # Groups it got only part of end reset, never with a FIN as if whole.
                assert all(count == 16 for count in ended["finished"].values()), ended
                assert len(publisher.of(SubscribeRequested)) == 1
                assert sent == 12 * 16

        try:
            run(main)
        finally:
            for process in stalled:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()


def test_a_published_track_reaches_subscribers(relay: RelayProcess, cert: CertificatePaths) -> None:
    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            publisher = await sessions.open()
            request_id = publisher.moqt.publish(TRACK)
            publisher.send()
            await publisher.next(RequestAccepted, lambda e: e.request_id == request_id)
            decoder = await sessions.open()
            sub_id = await subscribe(decoder, SubscriptionFilter())
            moqt = publisher.moqt
            stream = moqt.objects.open_subgroup(request_id, 0)
            for obj in range(3):
                moqt.objects.send_object(stream, obj, payload(0, obj, 100), end_stream=obj == 2)
            publisher.send()
            await decoder.until(lambda: len(decoder.objects(sub_id)) == 3)
            assert received(decoder, sub_id) == expected(1, 3, 100)
            assert all(isinstance(e, ObjectReceived) for e in decoder.objects(sub_id))

    run(main)


def test_a_range_that_ends_while_its_last_group_arrives_does_not_pass_it_off_as_whole(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """Group 1 begins while group 0, the range's last, is still arriving: the relay ends the
    subscription then, and group 0's stream must not end with a FIN after one object."""

    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            publisher = await sessions.open()
            request_id = publisher.moqt.publish(TRACK)
            publisher.send()
            await publisher.next(RequestAccepted, lambda e: e.request_id == request_id)
            decoder = await sessions.open()
            sub_id = await subscribe(
                decoder, SubscriptionFilter(FilterType.ABSOLUTE_RANGE, Location(0, 0), 0)
            )
            moqt = publisher.moqt
            last = moqt.objects.open_subgroup(request_id, 0)
            moqt.objects.send_object(last, 0, payload(0, 0, 100))
            moqt.objects.send_object(
                moqt.objects.open_subgroup(request_id, 1), 0, payload(1, 0, 100)
            )
            publisher.send()
            await decoder.next(SubscriptionEnded, lambda e: e.request_id == sub_id)
            for obj in (1, 2):
                moqt.objects.send_object(last, obj, payload(0, obj, 100), end_stream=obj == 2)
            publisher.send()
            streams = {e.stream_id for e in decoder.objects(sub_id)}

            def over(kind: type[DataStreamEnded | DataStreamReset]) -> set[int]:
                return {e.stream_id for e in decoder.of(kind)} & streams

            await decoder.until(lambda: over(DataStreamEnded) | over(DataStreamReset) == streams)
            finned = over(DataStreamEnded)
            whole = [e for e in decoder.objects(sub_id) if e.stream_id in finned]
            assert not finned or len(whole) == 3, whole

    run(main)


def test_a_gone_publishers_tracks_are_served_until_their_retention_ends(
    cert: CertificatePaths,
) -> None:
    """--retention 2: the cache serves a track whose publisher left, while a subscriber
    reads it and for 2 s after nobody could send it, then forgets it."""
    with running_relay(cert, "--retention", "2") as relay:

        async def main() -> None:
            async with Sessions(relay, cert) as sessions:
                pulled = await pulled_through(sessions, groups=2, objects=2, size=1_000)
                await sessions.close(pulled.prefill)
                sent = pulled.sent
                loop = asyncio.get_running_loop()
                left = loop.time()

                async def subscribed() -> bool:
                    late = await sessions.open()
                    late_id = late.moqt.subscribe(TRACK, filter=FROM_START)
                    late.send()

                    def ours(event: RequestAccepted | RequestRejected) -> bool:
                        return event.request_id == late_id

                    await late.until(
                        lambda: bool(
                            late.of(RequestAccepted, ours) or late.of(RequestRejected, ours)
                        )
                    )
                    for refusal in late.of(RequestRejected, ours):
                        code = refusal.message.error_code
                        assert code == SubscribeErrorCode.TRACK_DOES_NOT_EXIST, refusal
                        return False
                    await late.until(lambda: len(late.objects(late_id)) == sent)
                    await sessions.close(late)
                    return True

                assert await subscribed()  # served from the cache, the publisher gone
                while await subscribed():
                    assert loop.time() - left < 10, "never forgotten"
                    await asyncio.sleep(0.2)
                assert loop.time() - left >= 2

        run(main)


def test_a_small_cache_keeps_the_newest_whole_groups(cert: CertificatePaths) -> None:
    """With room for three groups, a late decoder gets groups 5-7 whole and nothing older."""
    with running_relay(cert, "--cache-bytes", str(3 * 4 * (10_000 + 128) + 1000)) as relay:

        async def main() -> None:
            async with Sessions(relay, cert) as sessions:
                await sessions.close((await pulled_through(sessions, 8, 4, 10_000)).prefill)

                late = await sessions.open()
                status_id = late.moqt.track_status(TRACK)
                late.send()
                status = await late.next(RequestAccepted, lambda e: e.request_id == status_id)
                assert status.message.largest == Location(7, 3)
                late_id = await subscribe(late)
                ended = await late.next(SubscriptionEnded, lambda e: e.request_id == late_id)
                newest = [r for r in expected(8, 4, 10_000) if r[0] >= 5]
                # PUBLISH_DONE may overtake the data streams; its stream count says how many
                # to wait for: three groups, one stream each.
                assert ended.message.stream_count == 3
                await late.until(lambda: len(late.of(DataStreamEnded)) == 3)
                assert received(late, late_id) == newest
                fetch_id = late.moqt.fetch(StandaloneFetch(TRACK, Location(0, 0), 7, None))
                late.send()
                await late.next(DataStreamEnded, lambda e: e.request_id == fetch_id)
                assert received(late, fetch_id) == newest

        run(main)


def test_track_status_goes_to_the_publisher_of_an_unsubscribed_track(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    async def main() -> None:
        async with Sessions(relay, cert) as sessions:
            publisher = await sessions.open()
            await announce(publisher)
            client = await sessions.open()
            request_id = client.moqt.track_status(TRACK)
            client.send()
            asked = await publisher.next(TrackStatusRequested)
            assert asked.message.track == TRACK
            publisher.moqt.track_status_ok(asked.message.request_id, largest=Location(5, 2))
            publisher.send()
            answer = await client.next(RequestAccepted, lambda e: e.request_id == request_id)
            assert answer.message.largest == Location(5, 2)

    run(main)
