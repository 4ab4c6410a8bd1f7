"""Hostile catalogs through a relay process: a publisher written with the bare MoQT API, so
it can say what no KVPublisher would."""

from __future__ import annotations

import asyncio
import dataclasses

import torch

from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.layout import KVLayout
from sidecar.kvcache.naming import PromptName, prompt_id
from sidecar.moqt.aio import api
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.transfer.subscriber import StopReason
from tests.support.aio import run
from tests.support.kv_net import MODEL, network, synthetic_kv
from tests.support.relay import RelayProcess

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32")
CHUNK = 8
TOKENS = list(range(50, 50 + 2 * CHUNK))


def test_a_revision_that_rewrites_a_digest_stops_the_load(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """Revision 1 describes chunk 0; revision 2 changes chunk 0's digest while adding chunk
    1. The load keeps chunk 0 (verified against revision 1) and trusts nothing after."""
    kv = synthetic_kv(len(TOKENS), LAYOUT, seed=14)
    codec = get_codec("int8")
    chunks = [codec.encode(kv[:, :, i * CHUNK : (i + 1) * CHUNK], LAYOUT) for i in range(2)]
    first = Catalog.for_prompt(MODEL, LAYOUT, TOKENS, {"int8": None}, CHUNK).with_chunk(
        {"int8": chunks[0]}
    )
    entry = first.tracks[0]
    swapped = dataclasses.replace(entry, digests=(bytes(32),))
    second = dataclasses.replace(first, tracks=(swapped,)).with_chunk({"int8": chunks[1]})
    name = PromptName(MODEL, prompt_id(TOKENS, CHUNK))

    async def main() -> None:
        publisher = api.Publisher()
        namespace = name.namespace()
        payload_track = publisher.track(namespace, b"int8")
        catalog_track = publisher.track(namespace, b"catalog")
        for group, payloads in enumerate(chunks):
            for obj, payload in enumerate(payloads):
                await payload_track.write(group, obj, payload, end_of_group=obj == CHUNK - 1)
        await catalog_track.write(1, 0, first.encode(), end_of_group=True)
        async with network(relay.url, cert) as net:
            session = await net.session(publisher)
            await session.publish_namespace(namespace)
            subscriber = await net.subscriber(CHUNK)
            got_first = asyncio.Event()
            written: list[range] = []

            def sink(span: range, _: torch.Tensor) -> None:
                written.append(span)
                got_first.set()

            loading = asyncio.ensure_future(subscriber.load(MODEL, TOKENS, sink, 30))
            await got_first.wait()
            await catalog_track.write(2, 0, second.encode(), end_of_group=True)
            result = await loading
            assert result.stopped is StopReason.CATALOG_INVALID
            assert written == [range(0, CHUNK)]
            assert result.loaded_tokens == (range(0, CHUNK),)

    run(main)


def test_a_catalog_of_another_prompt_is_ignored(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """A catalog track that serves another prompt's catalog: nothing is found, nothing loads."""
    other = [t + 1 for t in TOKENS]
    foreign = Catalog.for_prompt(MODEL, LAYOUT, other, {"int8": None}, CHUNK)
    name = PromptName(MODEL, prompt_id(TOKENS, CHUNK))

    async def main() -> None:
        publisher = api.Publisher()
        catalog_track = publisher.track(name.namespace(), b"catalog")
        await catalog_track.write(0, 0, foreign.encode(), end_of_group=True)
        catalog_track.end()
        async with network(relay.url, cert) as net:
            session = await net.session(publisher)
            await session.publish_namespace(name.namespace())
            subscriber = await net.subscriber(CHUNK)
            found = await subscriber.lookup(MODEL, TOKENS)
            assert (found.prompt, found.tokens) == (None, 0)
            result = await subscriber.load(MODEL, TOKENS, torch.zeros(LAYOUT.shape(16)), 5)
            assert result.stopped is StopReason.NOT_FOUND and not result.loaded

    run(main)
