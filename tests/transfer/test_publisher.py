"""KVPublisher without a network: what its MoQT tracks hold, and what it refuses."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.errors import UnknownCodecError
from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.model import FullTrackName, Location
from sidecar.transfer.publisher import KVPublisher, PublishError
from tests.transfer.kv_net import MODEL, synthetic_kv

LAYOUT = KVLayout(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float32")
CHUNK = 4
TOKENS = list(range(10, 20))  # chunks of 4, 4, 2


def payloads(publisher: KVPublisher, track: FullTrackName, group: int) -> list[bytes]:
    published = publisher.get(track)
    assert published is not None
    return [
        obj.payload for _, obj in published.cache.objects(Location(group, 0), Location(group, 99))
    ]


def test_catalog_revisions_follow_the_chunks() -> None:
    kv = synthetic_kv(len(TOKENS), LAYOUT)
    publisher = KVPublisher()
    prompt = publisher.prompt(MODEL, LAYOUT, TOKENS, tracks=("int8", "ac"), chunk_size=CHUNK)
    catalog_track = FullTrackName(prompt.namespace, b"catalog")

    async def main() -> None:
        await prompt.add_chunk(kv[:, :, :CHUNK])
        first = Catalog.decode(payloads(publisher, catalog_track, 1)[0])
        assert (first.ready_chunks, first.complete) == (1, False)
        await prompt.publish(kv)

    asyncio.run(main())
    last = Catalog.decode(payloads(publisher, catalog_track, 3)[0])
    assert last.complete and last.name == prompt.name and last == prompt.catalog
    int8 = FullTrackName(prompt.namespace, b"int8")
    for index, span in enumerate((range(0, 4), range(4, 8), range(8, 10))):
        chunk = payloads(publisher, int8, index)
        assert chunk == get_codec("int8").encode(kv[:, :, span.start : span.stop], LAYOUT)
        last.verify_chunk("int8", index, chunk)
    assert publisher.get(int8).ended  # type: ignore[union-attr]


def test_a_track_is_encoded_on_first_request_only() -> None:
    kv = synthetic_kv(len(TOKENS), LAYOUT, seed=1)
    publisher = KVPublisher()
    prompt = publisher.prompt(MODEL, LAYOUT, TOKENS, tracks=("int8", "ac"), chunk_size=CHUNK)
    asyncio.run(prompt.publish(kv))
    assert prompt.kept_tracks == ("int8",)
    ac = FullTrackName(prompt.namespace, b"ac")
    assert prompt.catalog is not None
    for index in range(3):
        prompt.catalog.verify_chunk("ac", index, payloads(publisher, ac, index))
    assert prompt.kept_tracks == ("ac", "int8")
    assert prompt.requests["ac"] == 3
    assert publisher.get(FullTrackName(prompt.namespace, b"fp16")) is None  # not offered


def test_refusals() -> None:
    kv = synthetic_kv(len(TOKENS), LAYOUT, seed=2)
    publisher = KVPublisher()
    with pytest.raises(PublishError, match="default track"):
        publisher.prompt(MODEL, LAYOUT, TOKENS, tracks=("fp16",), chunk_size=CHUNK)
    with pytest.raises(UnknownCodecError):
        publisher.prompt(MODEL, LAYOUT, TOKENS, tracks=("int8", "zip"), chunk_size=CHUNK)
    prompt = publisher.prompt(MODEL, LAYOUT, TOKENS, tracks=("int8",), chunk_size=CHUNK)
    with pytest.raises(PublishError, match="already published"):
        publisher.prompt(MODEL, LAYOUT, TOKENS, tracks=("int8",), chunk_size=CHUNK)

    async def main() -> None:
        with pytest.raises(PublishError, match="must hold 4 tokens"):
            await prompt.add_chunk(kv[:, :, :3])
        with pytest.raises(PublishError, match="KV holds 9 tokens"):
            await prompt.publish(kv[:, :, :9])
        await prompt.publish(kv)
        with pytest.raises(PublishError, match="already published"):
            await prompt.add_chunk(kv[:, :, :2])

    asyncio.run(main())
