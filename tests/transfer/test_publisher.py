"""KVPublisher: what its MoQT tracks hold, what it refuses, and (over real QUIC on 127.0.0.1)
how a request for a track not yet encoded waits for it without stalling the sessions."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest

from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.errors import UnknownCodecError
from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.aio import api
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.protocol.messages import StandaloneFetch
from sidecar.moqt.protocol.model import FullTrackName, Location
from sidecar.transfer.publisher import KVPublisher, PublishedPrompt, PublishError
from tests.support.aio import run
from tests.support.kv_net import MODEL, synthetic_kv
from tests.support.relay import publisher_server, settings_for

TIMEOUT = 30.0

LAYOUT = KVLayout(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float32")
CHUNK = 4
TOKENS = list(range(10, 20))  # chunks of 4, 4, 2


def payloads(publisher: KVPublisher, track: FullTrackName, group: int) -> list[bytes]:
    assert publisher.get(track) is not None
    held = publisher.origin.cache.objects(track, Location(group, 0), Location(group, 99))
    return [obj.payload for _, obj in held]


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
    assert publisher.get(ac) is None  # offered, not held: a request for it resolves it
    assert asyncio.run(publisher.resolve(ac)) is publisher.get(ac)
    assert prompt.catalog is not None
    for index in range(3):
        prompt.catalog.verify_chunk("ac", index, payloads(publisher, ac, index))
    assert prompt.kept_tracks == ("ac", "int8")
    assert prompt.requests["ac"] == 5  # every `get`: what a session looks up first
    fp16 = FullTrackName(prompt.namespace, b"fp16")  # not offered
    assert publisher.get(fp16) is None and asyncio.run(publisher.resolve(fp16)) is None


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


class HeldEncoder:
    """A payload hook that holds the worker thread encoding `track` until released, and counts
    what it encodes: the loop's freedom meanwhile, and one encoding per object, show."""

    def __init__(self, track: str) -> None:
        self.track = track
        self.release = threading.Event()
        self.encoded: Counter[tuple[int, int]] = Counter()

    def __call__(self, track: str, group: int, obj: int, payload: bytes) -> bytes:
        if track == self.track:
            self.encoded[(group, obj)] += 1
            assert self.release.wait(TIMEOUT), "never released"
        return payload


def held_ac_prompt() -> tuple[HeldEncoder, KVPublisher, PublishedPrompt, FullTrackName]:
    """A prompt with tracks int8 and ac, whose "ac" encoding waits for `HeldEncoder.release`."""
    held = HeldEncoder("ac")
    publisher = KVPublisher()
    prompt = publisher.prompt(
        MODEL, LAYOUT, TOKENS, tracks=("int8", "ac"), chunk_size=CHUNK, payload_hook=held
    )
    return held, publisher, prompt, FullTrackName(prompt.namespace, b"ac")


async def newest_catalog(session: api.Session, namespace: tuple[bytes, ...]) -> Catalog:
    track = FullTrackName(namespace, b"catalog")
    status = await session.track_status(track)
    assert status.largest is not None
    group = status.largest.group
    fetched = [obj async for obj in await session.fetch(track, Location(group, 0), group)]
    return Catalog.decode(fetched[0].payload)


def test_a_first_request_waits_for_its_encoding_while_sessions_are_served(
    cert: CertificatePaths,
) -> None:
    kv = synthetic_kv(len(TOKENS), LAYOUT, seed=3)
    held, publisher, prompt, ac = held_ac_prompt()

    async def main() -> None:
        await prompt.publish(kv)
        async with (
            publisher_server(settings_for(cert), cert, publisher) as (url, _),
            api.connect(url, settings_for(cert)) as first,
            api.connect(url, settings_for(cert)) as second,
        ):
            fetches = [
                asyncio.ensure_future(session.fetch(ac, Location(0, 0), 2))
                for session in (first, second)
            ]
            await asyncio.sleep(0)  # both FETCHes sent, each before its session's next request
            # The worker encoding "ac" is held: both sessions still answer other requests.
            catalogs = [
                await newest_catalog(session, prompt.namespace) for session in (first, second)
            ]
            assert catalogs[0] == catalogs[1] == prompt.catalog
            assert not any(fetch.done() for fetch in fetches)
            held.release.set()
            for fetch in fetches:
                objects = [obj async for obj in await fetch]
                for group in range(3):
                    chunk = [obj.payload for obj in objects if obj.group_id == group]
                    catalogs[0].verify_chunk("ac", group, chunk)

    run(main)
    assert held.encoded == Counter({(g, o): 1 for g, n in enumerate((4, 4, 2)) for o in range(n)})
    assert prompt.kept_tracks == ("ac", "int8") and prompt.requests["ac"] == 2


def test_requests_that_end_while_their_track_is_encoded_are_not_answered(
    cert: CertificatePaths,
) -> None:
    kv = synthetic_kv(len(TOKENS), LAYOUT, seed=4)
    held, publisher, prompt, ac = held_ac_prompt()

    async def main() -> None:
        await prompt.publish(kv)
        async with publisher_server(settings_for(cert), cert, publisher) as (url, served):
            async with api.connect(url, settings_for(cert)) as leaving:
                leaving.connection.moqt.subscribe(ac)
                leaving.connection.transmit()
                await newest_catalog(leaving, prompt.namespace)  # the SUBSCRIBE is waiting
                assert served[0].resolving == 1
            async with api.connect(url, settings_for(cert)) as session:
                moqt = session.connection.moqt
                subscribe = moqt.subscribe(ac)
                fetch = moqt.fetch(StandaloneFetch(ac, Location(0, 0), 2))
                session.connection.transmit()
                await newest_catalog(session, prompt.namespace)
                assert served[1].resolving == 2
                moqt.unsubscribe(subscribe)
                moqt.fetch_cancel(fetch)
                session.connection.transmit()
                await newest_catalog(session, prompt.namespace)
                assert served[1].resolving == 0
                # The server hears of the first session's end only after QUIC's draining
                # period (3 PTO after its CONNECTION_CLOSE), which grows with a busy CPU.
                async with asyncio.timeout(10):
                    while served[0].resolving:
                        await asyncio.sleep(0.01)
                held.release.set()
                while "ac" not in prompt.kept_tracks:  # the encoding goes on without waiters
                    await asyncio.sleep(0.01)
                kept = publisher.get(ac)
                assert kept is not None and kept.subscribers == 0
                objects = [obj async for obj in await session.fetch(ac, Location(0, 0), 2)]
                assert prompt.catalog is not None
                for group in range(3):
                    chunk = [obj.payload for obj in objects if obj.group_id == group]
                    prompt.catalog.verify_chunk("ac", group, chunk)

    run(main)
    assert set(held.encoded.values()) == {1}
