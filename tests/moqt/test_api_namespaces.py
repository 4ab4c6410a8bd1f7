"""Session.subscribe_namespace through the relay process: publishers' namespaces announced
under a prefix as they come and go, over real QUIC on 127.0.0.1."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.moqt.aio import api
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.protocol.drafts import DRAFT_16
from sidecar.moqt.protocol.model import FullTrackName, Location
from tests.support.aio import run
from tests.support.relay import RelayProcess, publisher_server, settings_for

PREFIX = (b"kvcache.moq.arpa/v1", b"smollm2-135m")
FIRST = (*PREFIX, b"0123abcd")
SECOND = (*PREFIX, b"4567ef01")
ELSEWHERE = (b"kvcache.moq.arpa/v1", b"other-model", b"0123abcd")
WAIT_S = 10.0


async def next_announcement(namespaces: api.NamespaceSubscription) -> api.Announcement:
    return await asyncio.wait_for(anext(namespaces), WAIT_S)


def test_a_subscriber_hears_of_namespaces_under_its_prefix_coming_and_going(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    settings = settings_for(cert)

    async def main() -> None:
        async with (
            api.connect(relay.url, settings) as early,
            api.connect(relay.url, settings) as follower,
        ):
            await early.publish_namespace(FIRST)
            await early.publish_namespace(ELSEWHERE)
            namespaces = await follower.subscribe_namespace(PREFIX)
            # Published before the subscription: announced right after it.
            assert await next_announcement(namespaces) == api.Announcement(FIRST, True)
            async with api.connect(relay.url, settings) as late:
                await late.publish_namespace(SECOND)
                assert await next_announcement(namespaces) == api.Announcement(SECOND, True)
                early.publish_namespace_done(FIRST)
                assert await next_announcement(namespaces) == api.Announcement(FIRST, False)
            # The late publisher's session closed: the relay withdraws what it published.
            assert await next_announcement(namespaces) == api.Announcement(SECOND, False)
            await namespaces.unsubscribe()
            assert [a async for a in namespaces] == []  # ended; ELSEWHERE was never announced
            await early.publish_namespace(SECOND)  # unheard of after the unsubscribe
            again = await follower.subscribe_namespace(PREFIX)
            assert await next_announcement(again) == api.Announcement(SECOND, True)

    run(main)


def test_a_refused_namespace_subscription_raises_and_leaves_the_others(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    async def main() -> None:
        # Draft 16: at 18 each prefix followed takes two streams (its namespaces, its
        # tracks), and 64 of them fill QUIC's 128 (aioquic's) before a 65th can be asked.
        draft_16 = settings_for(cert, drafts=(DRAFT_16,))
        async with (
            api.connect(relay.url, settings_for(cert)) as publisher,
            api.connect(relay.url, draft_16) as follower,
        ):
            # The relay lets one peer follow 64 prefixes (protocol.records.OriginLimits).
            followed = [await follower.subscribe_namespace((*PREFIX, b"%d" % i)) for i in range(64)]
            with pytest.raises(api.RequestRefused, match="64 prefixes"):
                await follower.subscribe_namespace(PREFIX)
            await followed[0].unsubscribe()
            namespaces = await follower.subscribe_namespace(PREFIX)
            await publisher.publish_namespace(FIRST)
            assert await next_announcement(namespaces) == api.Announcement(FIRST, True)

    run(main)


def test_a_publisher_announces_its_namespaces_to_a_follower_and_withdraws_them(
    cert: CertificatePaths,
) -> None:
    """Served by a publisher, no relay between: SUBSCRIBE_NAMESPACE is answered as a relay
    answers it (PUBLISH_NAMESPACE for what it holds and for what it adds later, DONE when
    it removes a namespace), and the follower's own requests still work beside it."""
    settings = settings_for(cert)
    publisher = api.Publisher()
    first = publisher.track(FIRST, b"int8")

    async def main() -> None:
        await first.write(0, 0, b"kv", end_of_group=True)
        async with (
            publisher_server(settings, cert, publisher) as (url, _),
            api.connect(url, settings) as follower,
        ):
            namespaces = await follower.subscribe_namespace(PREFIX)
            assert await next_announcement(namespaces) == api.Announcement(FIRST, True)
            publisher.track(SECOND, b"int8")
            publisher.track(ELSEWHERE, b"int8")  # not under the prefix: never announced
            assert await next_announcement(namespaces) == api.Announcement(SECOND, True)
            fetched = await follower.fetch(FullTrackName(FIRST, b"int8"), Location(0, 0), 0)
            assert [obj.payload async for obj in fetched] == [b"kv"]
            publisher.remove(FIRST)
            assert await next_announcement(namespaces) == api.Announcement(FIRST, False)
            # The follower declined the PUBLISH offers (it subscribes by itself): the
            # publisher holds none of them open.
            assert all(not peer.offers for peer in publisher.origin.peers)

    run(main)
