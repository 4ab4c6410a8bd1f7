"""Lookups and loads through independent draft-14 relays (tests/interop harness).

The aiomoqt relay routes SUBSCRIBE and FETCH upstream like ours, so a load works through it
unchanged. A moq-rs relay (moq-ffi 0.4.18) forwards the `catalog` track and serves per-group
FETCH only from its cache; it holds a finished prompt's chunks because our publisher replays a
track's cached groups on a SUBSCRIBE from a moq-lite-rs peer (docs/wire-format.md, "Through
relays"; tests/interop/README.md, quirks 24-28).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.aio import api
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.transfer.catalog_feed import CatalogFeed
from sidecar.transfer.publisher import KVPublisher
from sidecar.transfer.subscriber import Availability, KVSubscriber, StopReason
from tests.interop.certs import Certs
from tests.interop.conftest import StartPeer, certs, start_peer  # noqa: F401 (fixtures)
from tests.interop.harness import RelayPeer
from tests.support.aio import run
from tests.support.kv_net import MODEL, synthetic_kv

pytestmark = pytest.mark.interop

LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=16, dtype="float32")
CHUNK = 16

RELAYS = [
    pytest.param("aiomoqt", id="aiomoqt-relay"),
    pytest.param("moqrs", id="moqrs-relay"),
]


@pytest.mark.parametrize("kind", RELAYS)
def test_load_through_an_independent_relay(
    start_peer: StartPeer,  # noqa: F811
    certs: Certs,  # noqa: F811
    kind: str,
) -> None:
    relay = start_peer(kind, "relay")
    assert isinstance(relay, RelayPeer)
    relay.wait_ready()
    # Internet-sized packets: picoquic, under the aiomoqt relay, drops 16 KiB ones.
    settings = QuicSettings(ca_file=certs.ca)
    token_ids = list(range(100, 100 + 4 * CHUNK + 6))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=9)

    async def main() -> None:
        publisher = KVPublisher()
        prompt = publisher.prompt(MODEL, LAYOUT, token_ids, tracks=("int8",), chunk_size=CHUNK)
        async with api.connect(relay.url, settings, publisher=publisher) as session:
            await session.publish_namespace(prompt.namespace)
            await prompt.publish(kv)
            async with api.connect(relay.url, settings) as decoder:
                subscriber = KVSubscriber(decoder, chunk_size=CHUNK)
                found = await subscriber.lookup(MODEL, token_ids)
                assert (found.prompt, found.tokens) == (prompt.name, len(token_ids))
                out = torch.zeros_like(kv)
                result = await subscriber.load(MODEL, token_ids, out, 20)
                assert result.stopped is StopReason.COMPLETE
                assert result.loaded_tokens == (range(0, len(token_ids)),)
                codec = get_codec("int8")
                assert torch.equal(out, codec.decode(codec.encode(kv, LAYOUT), LAYOUT))

    run(main, timeout=60)


def test_our_catalog_track_passes_through_a_moqrs_relay(
    start_peer: StartPeer,  # noqa: F811
    certs: Certs,  # noqa: F811
) -> None:
    """moq-rs keeps catalog tracks of its own in every broadcast (quirk 7), yet a SUBSCRIBE
    for `catalog` in a draft-14 publisher's namespace reaches that publisher: the track name
    needs no alias. Prefill is still running, so the track has not ended and the newest
    revision reaches the subscriber's catalog feed."""
    relay = start_peer("moqrs", "relay")
    assert isinstance(relay, RelayPeer)
    relay.wait_ready()
    settings = QuicSettings.loopback(ca_file=certs.ca)
    token_ids = list(range(300, 300 + 4 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=10)

    async def main() -> None:
        publisher = KVPublisher()
        prompt = publisher.prompt(MODEL, LAYOUT, token_ids, tracks=("int8",), chunk_size=CHUNK)
        async with api.connect(relay.url, settings, publisher=publisher) as session:
            await session.publish_namespace(prompt.namespace)
            await prompt.add_chunk(kv[:, :, :CHUNK])
            async with api.connect(relay.url, settings) as decoder:
                feed = await CatalogFeed.open(decoder, prompt.name)
                try:
                    catalog = await asyncio.wait_for(feed.wait_ready(1), 10)
                finally:
                    await feed.close()
                assert prompt.requests["catalog"] >= 1
                assert catalog == prompt.catalog

    run(main, timeout=60)


def test_a_decoder_hears_of_prompts_a_moqrs_relay_announced_before_it_asked(
    start_peer: StartPeer,  # noqa: F811
    certs: Certs,  # noqa: F811
) -> None:
    """moq-rs announces every broadcast to a new session right after setup, before any
    SUBSCRIBE_NAMESPACE, and does not repeat them when one comes (quirk 4): the session keeps
    them, so a decoder's first lookup finds a longer published prompt that shares its first
    chunks, which no probe of its own links would name."""
    relay = start_peer("moqrs", "relay")
    assert isinstance(relay, RelayPeer)
    relay.wait_ready()
    settings = QuicSettings.loopback(ca_file=certs.ca)
    long = list(range(500, 500 + 4 * CHUNK))
    query = [*long[: 2 * CHUNK], *range(9000, 9010)]
    kv = synthetic_kv(len(long), LAYOUT, seed=12)

    async def main() -> None:
        publisher = KVPublisher()
        prompt = publisher.prompt(MODEL, LAYOUT, long, tracks=("int8",), chunk_size=CHUNK)
        async with api.connect(relay.url, settings, publisher=publisher) as session:
            await session.publish_namespace(prompt.namespace)
            await prompt.publish(kv)
            async with api.connect(relay.url, settings) as decoder:
                await asyncio.sleep(1.0)  # the unsolicited announcements arrive meanwhile
                subscriber = KVSubscriber(decoder, chunk_size=CHUNK)
                whole = Availability(prompt.name, 2 * CHUNK, 2 * CHUNK)
                assert await subscriber.lookup(MODEL, query) == whole

    run(main, timeout=60)
