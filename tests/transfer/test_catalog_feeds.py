"""Catalog feeds shared on one session, through a real relay process: users come and go
while a feed opens, and the next user of the prompt still gets one."""

from __future__ import annotations

import asyncio

from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.transfer.catalog_feed import CatalogFeeds
from tests.support.aio import run
from tests.support.kv_net import network, publish
from tests.support.relay import RelayProcess


def test_a_feed_left_while_its_subscribe_is_unanswered_leaves_the_track_free(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """A lookup gives up while the relay has not answered the catalog SUBSCRIBE (it timed
    out, or its client left); the next lookup of the prompt, right after the relay answers
    again, opens the feed instead of finding the track still taken."""
    tokens = list(range(900, 932))

    async def main() -> None:
        async with network(relay.url, cert) as net:
            publisher, session = await net.publisher()
            prompt, _ = await publish(publisher, session, tokens, seed=3)
            feeds = CatalogFeeds(await net.session())
            with relay.frozen():
                leaving = asyncio.ensure_future(feeds.acquire(prompt.name))
                await asyncio.sleep(0.3)  # the SUBSCRIBE is out, unanswered
                leaving.cancel()
                await asyncio.gather(leaving, return_exceptions=True)
            feed = await feeds.acquire(prompt.name)
            catalog = await asyncio.wait_for(feed.wait_ready(2), 10)
            assert catalog is not None and catalog.ready_chunks == 2
            await feeds.release(feed)
            again = await feeds.newest(prompt.name, 10)  # and once more after a clean close
            assert again is not None and again.ready_chunks == 2

    run(main)
