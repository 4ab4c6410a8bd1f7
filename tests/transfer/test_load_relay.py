"""Publisher and subscriber through a real relay process, on synthetic KV (fast)."""

from __future__ import annotations

import asyncio
import dataclasses

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sidecar.address import free_udp_port
from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.layout import KVLayout
from sidecar.kvcache.naming import prompt_id
from sidecar.kvcache.prefix_index import PrefixIndex
from sidecar.kvcache.signing import CatalogSigner, CatalogTrust, Refusal
from sidecar.moqt.aio import api
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.protocol.model import FullTrackName, Location
from sidecar.transfer.adapt import ThroughputEstimate
from sidecar.transfer.publisher import KVPublisher
from sidecar.transfer.subscriber import Availability, KVSubscriber, StopReason, expected_kl
from sidecar.transfer.track_quality import MEASURED, TrackChoice
from tests.support.aio import run
from tests.support.kv_net import MODEL, network, synthetic_kv
from tests.support.relay import RelayProcess

LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=16, dtype="float32")
CHUNK = 16


def test_whole_prompt_loads_on_the_default_track(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    token_ids = list(range(100, 170))
    kv = synthetic_kv(len(token_ids), LAYOUT)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            prompt = await net.published(
                LAYOUT, token_ids, kv, tracks=("int8", "fp16"), chunk_size=CHUNK
            )
            subscriber = await net.subscriber(CHUNK)
            found = await subscriber.lookup(MODEL, token_ids)
            assert (found.prompt, found.tokens, found.ready_tokens) == (prompt.name, 70, 70)
            # Listed by the relay and its catalog read whole first: the lookup asked nothing.
            assert found.catalog is None
            assert await subscriber.catalog(prompt.name, 5) == prompt.catalog  # for estimates
            out = torch.zeros_like(kv)
            result = await subscriber.load(
                MODEL, token_ids, out, deadline=30, choice=TrackChoice(("int8",))
            )
            assert result.stopped is StopReason.COMPLETE, result
            assert result.loaded_tokens == (range(0, 70),)
            assert not result.rejected
            expected = get_codec("int8").decode(get_codec("int8").encode(kv, LAYOUT), LAYOUT)
            assert torch.equal(out, expected)
            assert prompt.kept_tracks == ("int8",)

    run(main)


def roundtrip(track: str, kv: torch.Tensor, tables: bytes | None = None) -> torch.Tensor:
    codec = get_codec(track)
    return codec.decode(codec.encode(kv, LAYOUT, tables), LAYOUT, tables)


def test_a_track_is_encoded_when_first_asked_for(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    token_ids = list(range(1, 50))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=1)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            prompt = await net.published(
                LAYOUT, token_ids, kv, tracks=("int8", "fp16", "int4"), chunk_size=CHUNK
            )
            assert prompt.kept_tracks == ("int8",)
            subscriber = await net.subscriber(CHUNK)
            out = torch.zeros_like(kv)
            result = await subscriber.load(MODEL, token_ids, out, 30, choice=TrackChoice(("fp16",)))
            assert result.stopped is StopReason.COMPLETE
            assert [c.track for c in result.loaded] == ["fp16"] * 4
            assert torch.equal(out, roundtrip("fp16", kv))
            assert prompt.kept_tracks == ("fp16", "int8")  # int4 was never asked for
            assert prompt.requests["fp16"] == 4 and prompt.requests["int4"] == 0

    run(main)


def test_a_quality_floor_keeps_chunks_off_tracks_outside_it(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """A prompt offered on int4 and ac only: the default floor takes neither (nothing is
    loaded, the model server computes it all); a floor of 0.01 takes int4 for every chunk
    but the most recent, which it leaves to compute; each load says what its KV costs."""
    token_ids = list(range(300, 300 + 3 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=7)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            await net.published(
                LAYOUT, token_ids, kv, tracks=("int4", "ac"), default_track="int4", chunk_size=CHUNK
            )
            subscriber = await net.subscriber(CHUNK)
            out = torch.zeros_like(kv)
            strict = await subscriber.load(MODEL, token_ids, out, 30)
            assert strict.stopped is StopReason.QUALITY_FLOOR
            assert strict.loaded == () and not out.any()
            assert expected_kl(strict.loaded) == 0.0

            looser = await subscriber.load(
                MODEL, token_ids, out, 30, choice=TrackChoice(max_kl=0.01)
            )
            assert looser.stopped is StopReason.QUALITY_FLOOR
            assert [(c.index, c.track) for c in looser.loaded] == [(0, "int4"), (1, "int4")]
            assert looser.loaded_tokens == (range(0, 2 * CHUNK),)
            assert not out[:, :, 2 * CHUNK :].any()  # the most recent chunk: left to compute
            assert expected_kl(looser.loaded) == MEASURED["int4"].served <= 0.01

            whatever = await subscriber.load(
                MODEL, token_ids, out, 30, choice=TrackChoice.only("ac")
            )
            assert whatever.stopped is StopReason.COMPLETE
            assert expected_kl(whatever.loaded) == MEASURED["ac"].alone

    run(main)


def test_a_load_leaves_chunks_the_model_server_computes_sooner(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """A model server that computes a chunk faster than any track brings it gets none: the
    load stops at once (COMPUTE_FASTER), writes nothing and measures the link for the next
    load; one that computes slower than every track gets the whole prompt."""
    token_ids = list(range(500, 500 + 3 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=11)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            await net.published(LAYOUT, token_ids, kv, tracks=("int8",), chunk_size=CHUNK)
            subscriber = await net.subscriber(CHUNK)
            out = torch.zeros_like(kv)
            faster = await subscriber.load(MODEL, token_ids, out, 30, compute_rate=1e15)
            assert faster.stopped is StopReason.COMPUTE_FASTER
            assert faster.loaded == () and not out.any()
            for _ in range(100):  # the first chunk, fetched for no load: the link's rate
                if "int8" in subscriber.track_rates():
                    break
                await asyncio.sleep(0.05)
            assert "int8" in subscriber.track_rates()

            slower = await subscriber.load(MODEL, token_ids, out, 30, compute_rate=1.0)
            assert slower.stopped is StopReason.COMPLETE
            assert slower.loaded_tokens == (range(0, 3 * CHUNK),)

    run(main)


def test_chunks_stream_while_prefill_runs(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """A load started before the first chunk exists follows the catalog revisions, and a
    live subscriber to the default track gets each chunk as it is added."""
    token_ids = list(range(7, 7 + 4 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=2)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            publisher, session = await net.publisher()
            prompt = publisher.prompt(MODEL, LAYOUT, token_ids, tracks=("int8",), chunk_size=CHUNK)
            await session.publish_namespace(prompt.namespace)
            watcher = await net.session()
            live = await watcher.subscribe(FullTrackName(prompt.namespace, b"int8"))
            subscriber = await net.subscriber(CHUNK)
            out = torch.zeros_like(kv)
            loading = asyncio.ensure_future(subscriber.load(MODEL, token_ids, out, 60))
            for index in range(4):
                await asyncio.sleep(0.2)
                await prompt.add_chunk(kv[:, :, index * CHUNK : (index + 1) * CHUNK])
                # each chunk reaches the live subscriber before the next one exists
                got = [await anext(live) for _ in range(CHUNK)]
                assert [o.location for o in got] == [Location(index, i) for i in range(CHUNK)]
            result = await loading
            assert result.stopped is StopReason.COMPLETE, result
            assert result.loaded_tokens == (range(0, 4 * CHUNK),)
            assert torch.equal(out, roundtrip("int8", kv))

    run(main)


def test_a_longer_prompt_loads_the_shared_prefix(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """The published prompt is a whole-chunk prefix of the query: found by probing the
    query's links; the tokens after it are left to recompute."""
    published = list(range(300, 300 + 3 * CHUNK))
    query = [*published, *range(900, 925)]
    kv = synthetic_kv(len(published), LAYOUT, seed=3)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            prompt = await net.published(LAYOUT, published, kv, tracks=("int8",), chunk_size=CHUNK)
            subscriber = await net.subscriber(CHUNK)
            found = await subscriber.lookup(MODEL, query)
            assert (found.prompt, found.tokens) == (prompt.name, 3 * CHUNK)
            out = torch.zeros(LAYOUT.shape(len(query)))
            result = await subscriber.load(MODEL, query, out, 30)
            assert result.stopped is StopReason.COMPLETE
            assert result.available == result.prefix_tokens == 3 * CHUNK
            assert torch.equal(out[:, :, : 3 * CHUNK], roundtrip("int8", kv))
            assert not out[:, :, 3 * CHUNK :].any()

    run(main)


def test_a_diverging_prompt_is_found_from_a_catalog_seen_before(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """Two prompts sharing 2.5 chunks: the second finds its 2 whole shared chunks in the
    first one's catalog, which the subscriber's first lookup read as the relay listed the
    prompt (no probe can: no prompt ends there)."""
    first = list(range(40, 40 + 4 * CHUNK + 5))
    second = [*first[: 2 * CHUNK + 8], *range(5000, 5040)]
    kv = synthetic_kv(len(first), LAYOUT, seed=4)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            prompt = await net.published(LAYOUT, first, kv, tracks=("int8",), chunk_size=CHUNK)
            subscriber = await net.subscriber(CHUNK)
            found = await subscriber.lookup(MODEL, second)
            assert (found.prompt, found.tokens) == (prompt.name, 2 * CHUNK)
            assert (await subscriber.lookup(MODEL, first)).tokens == len(first)
            out = torch.zeros(LAYOUT.shape(len(second)))
            result = await subscriber.load(MODEL, second, out, 30)
            assert result.loaded_tokens == (range(0, 2 * CHUNK),)
            assert torch.equal(out[:, :, : 2 * CHUNK], roundtrip("int8", kv)[:, :, : 2 * CHUNK])

    run(main)


def test_an_unknown_prompt_is_not_found(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    async def main() -> None:
        async with network(relay.url, cert) as net:
            subscriber = await net.subscriber()
            token_ids = list(range(64))
            assert await subscriber.lookup(MODEL, token_ids) == Availability(None, 0, 0)
            result = await subscriber.load(MODEL, token_ids, torch.zeros(LAYOUT.shape(64)), 5)
            assert (result.stopped, result.loaded, result.available) == (
                StopReason.NOT_FOUND,
                (),
                0,
            )

    run(main)


def test_a_corrupted_object_rejects_its_chunk_only(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    token_ids = list(range(11, 11 + 4 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=5)

    def corrupt(track: str, group: int, obj: int, payload: bytes) -> bytes:
        if (group, obj) != (1, 3):
            return payload
        return payload[:-1] + bytes([payload[-1] ^ 0x01])

    async def main() -> None:
        async with network(relay.url, cert) as net:
            await net.published(
                LAYOUT, token_ids, kv, tracks=("int8",), chunk_size=CHUNK, payload_hook=corrupt
            )
            subscriber = await net.subscriber(CHUNK)
            out = torch.full(kv.shape, float("nan"))
            result = await subscriber.load(MODEL, token_ids, out, 30)
            assert result.stopped is StopReason.COMPLETE
            assert [(r.index, r.track) for r in result.rejected] == [(1, "int8")]
            assert "digest" in result.rejected[0].reason
            assert result.loaded_tokens == (range(0, CHUNK), range(2 * CHUNK, 4 * CHUNK))
            assert result.prefix_tokens == CHUNK
            expected = roundtrip("int8", kv)
            assert out[:, :, CHUNK : 2 * CHUNK].isnan().all()  # never written
            keep = torch.ones(kv.shape[2], dtype=torch.bool)
            keep[CHUNK : 2 * CHUNK] = False
            assert torch.equal(out[:, :, keep], expected[:, :, keep])

    run(main)


def test_no_time_loads_nothing(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    token_ids = list(range(500, 500 + 2 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=6)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            await net.published(LAYOUT, token_ids, kv, tracks=("int8",), chunk_size=CHUNK)
            subscriber = await net.subscriber(CHUNK)
            result = await subscriber.load(MODEL, token_ids, torch.zeros_like(kv), 0)
            assert result.stopped is StopReason.DEADLINE and not result.loaded

    run(main)


def test_a_load_refused_on_a_stale_estimate_measures_the_link_again(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """An estimate of 1 kB/s (left by some slow spell) refuses a 1-second load its first
    chunk; the subscriber fetches that chunk anyway, for no load, and observes it, so the
    next load with the same deadline completes. Without it nothing would ever measure the
    link again, and every load would be refused."""
    token_ids = list(range(1200, 1200 + 2 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=12)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            await net.published(LAYOUT, token_ids, kv, tracks=("int8",), chunk_size=CHUNK)
            subscriber = await net.subscriber(CHUNK)
            subscriber.throughput = ThroughputEstimate(1e3)
            refused = await subscriber.load(MODEL, token_ids, torch.zeros_like(kv), 1.0)
            assert refused.stopped is StopReason.DEADLINE and not refused.loaded
            end = asyncio.get_running_loop().time() + 10
            while subscriber.throughput.samples == 0:
                assert asyncio.get_running_loop().time() < end, "the link was not measured"
                await asyncio.sleep(0.01)
            assert subscriber.throughput.bytes_per_second > 100 * 1e3
            result = await subscriber.load(MODEL, token_ids, torch.zeros_like(kv), 1.0)
            assert result.stopped is StopReason.COMPLETE, result

    run(main)


def test_the_relay_serves_later_decoders_from_its_cache(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """One prefill, three decoders: the publisher answers one FETCH per chunk in all."""
    token_ids = list(range(70, 70 + 4 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=7)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            prompt = await net.published(LAYOUT, token_ids, kv, tracks=("int8",), chunk_size=CHUNK)
            expected = roundtrip("int8", kv)
            for _ in range(3):
                subscriber = await net.subscriber(CHUNK)
                out = torch.zeros_like(kv)
                result = await subscriber.load(MODEL, token_ids, out, 30)
                assert result.loaded_tokens == (range(0, 4 * CHUNK),)
                assert torch.equal(out, expected)
            assert prompt.requests["int8"] == 4

    run(main)


def test_direct_from_publisher_to_subscriber(cert: CertificatePaths) -> None:
    token_ids = list(range(900, 900 + 2 * CHUNK + 3))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=8)

    async def main() -> None:
        publisher = KVPublisher()
        prompt = publisher.prompt(MODEL, LAYOUT, token_ids, tracks=("int8",), chunk_size=CHUNK)
        await prompt.publish(kv)
        port = free_udp_port()
        server = await api.serve(
            "127.0.0.1",
            port,
            QuicSettings.loopback(),
            cert=cert.cert,
            key=cert.key,
            publisher=publisher,
        )
        try:
            async with network(f"moqt://127.0.0.1:{port}", cert) as net:
                subscriber = await net.subscriber(CHUNK)
                out = torch.zeros_like(kv)
                result = await subscriber.load(MODEL, token_ids, out, 30)
                assert result.loaded_tokens == (range(0, len(token_ids)),)
                assert torch.equal(out, roundtrip("int8", kv))
        finally:
            server.close()

    run(main)


def test_concurrent_loads_of_one_prompt_share_its_catalog(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """Draft-14 allows one subscription per track and session: two loads and a lookup of
    one prompt at once on one session share the catalog subscription."""
    token_ids = list(range(3000, 3000 + 3 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=10)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            await net.published(LAYOUT, token_ids, kv, tracks=("int8",), chunk_size=CHUNK)
            subscriber = await net.subscriber(CHUNK)
            outs = [torch.zeros_like(kv), torch.zeros_like(kv)]
            first, second, found = await asyncio.gather(
                subscriber.load(MODEL, token_ids, outs[0], 30),
                subscriber.load(MODEL, token_ids, outs[1], 30),
                subscriber.lookup(MODEL, token_ids),
            )
            assert found.tokens == len(token_ids)
            expected = roundtrip("int8", kv)
            for result, out in zip((first, second), outs, strict=True):
                assert result.loaded_tokens == (range(0, len(token_ids)),)
                assert torch.equal(out, expected)
            # and once all are done, the prompt can be loaded again (the feed was closed)
            again = await subscriber.load(MODEL, token_ids, torch.zeros_like(kv), 30)
            assert again.stopped is StopReason.COMPLETE

    run(main)


def test_a_generous_deadline_takes_the_best_track(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    token_ids = list(range(4000, 4000 + 3 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=11)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            await net.published(
                LAYOUT, token_ids, kv, tracks=("int4", "int8", "fp16"), chunk_size=CHUNK
            )
            subscriber = await net.subscriber(CHUNK)
            out = torch.zeros_like(kv)
            result = await subscriber.load(MODEL, token_ids, out, 60)
            assert [c.track for c in result.loaded] == ["fp16"] * 3
            assert torch.equal(out, roundtrip("fp16", kv))

    run(main)


def test_a_deadline_shorter_than_prefill_loads_a_verified_prefix(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """Prefill makes a chunk every 0.5 s; a load given 1.2 s cannot have all four: it
    returns the chunks it got, checked, and leaves the rest to recompute."""
    token_ids = list(range(6000, 6000 + 4 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=12)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            publisher, session = await net.publisher()
            prompt = publisher.prompt(MODEL, LAYOUT, token_ids, tracks=("int8",), chunk_size=CHUNK)
            await session.publish_namespace(prompt.namespace)
            subscriber = await net.subscriber(CHUNK)
            out = torch.zeros_like(kv)

            async def prefill() -> None:
                for index in range(4):
                    await prompt.add_chunk(kv[:, :, index * CHUNK : (index + 1) * CHUNK])
                    await asyncio.sleep(0.5)

            producing = asyncio.ensure_future(prefill())
            result = await subscriber.load(MODEL, token_ids, out, 1.2)
            await producing
            assert result.stopped is StopReason.DEADLINE
            assert result.available == len(token_ids)
            loaded = result.prefix_tokens
            assert loaded < len(token_ids) and result.loaded_tokens in ((), (range(0, loaded),))
            assert torch.equal(out[:, :, :loaded], roundtrip("int8", kv)[:, :, :loaded])
            assert not out[:, :, loaded:].any()

    run(main)


def test_a_rejected_chunk_is_fetched_again_on_the_next_track(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """fp16 chunk 2 is corrupted at the publisher: the load rejects it, takes chunk 2 on
    int8 instead, and the prefix stays whole."""
    token_ids = list(range(8000, 8000 + 4 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=13)

    def corrupt(track: str, group: int, obj: int, payload: bytes) -> bytes:
        if (track, group, obj) != ("fp16", 2, 0):
            return payload
        return payload[:5] + bytes([payload[5] ^ 0x40]) + payload[6:]

    async def main() -> None:
        async with network(relay.url, cert) as net:
            publisher, session = await net.publisher()
            prompt = publisher.prompt(
                MODEL,
                LAYOUT,
                token_ids,
                tracks=("int8", "fp16"),
                chunk_size=CHUNK,
                payload_hook=corrupt,
            )
            await session.publish_namespace(prompt.namespace)
            await prompt.publish(kv)
            subscriber = await net.subscriber(CHUNK)
            out = torch.zeros_like(kv)
            result = await subscriber.load(MODEL, token_ids, out, 60)
            assert result.stopped is StopReason.COMPLETE
            assert [(r.index, r.track) for r in result.rejected] == [(2, "fp16")]
            assert [c.track for c in result.loaded] == ["fp16", "fp16", "int8", "fp16"]
            assert result.loaded_tokens == (range(0, len(token_ids)),)
            span = slice(2 * CHUNK, 3 * CHUNK)
            assert torch.equal(out[:, :, span], roundtrip("int8", kv)[:, :, span])
            out[:, :, span] = roundtrip("fp16", kv)[:, :, span]
            assert torch.equal(out, roundtrip("fp16", kv))

    run(main)


def test_a_load_starts_from_the_throughput_earlier_loads_measured(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """A subscriber that knows its link is slow (8 kB/s) takes the first chunk of a 3 s load
    on int8: fp16 (8208 bytes a chunk) does not fit its 1 s share, as it would at the 1 Gbit/s
    prior. Loopback then measures fast, so the rest come on fp16; the next load starts from
    that measurement, not from the seed again, and keeps refining it."""
    token_ids = list(range(9000, 9000 + 3 * CHUNK))
    kv = synthetic_kv(len(token_ids), LAYOUT, seed=14)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            await net.published(LAYOUT, token_ids, kv, tracks=("int8", "fp16"), chunk_size=CHUNK)
            slow = ThroughputEstimate(bytes_per_second=8000.0)
            subscriber = KVSubscriber(await net.session(), chunk_size=CHUNK, throughput=slow)
            first = await subscriber.load(MODEL, token_ids, torch.zeros_like(kv), 3)
            assert first.stopped is StopReason.COMPLETE, first
            assert [c.track for c in first.loaded] == ["int8", "fp16", "fp16"]
            measured = subscriber.throughput
            assert measured.samples == 3 and measured.bytes_per_second > 8000.0
            second = await subscriber.load(MODEL, token_ids, torch.zeros_like(kv), 3)
            assert [c.track for c in second.loaded] == ["fp16"] * 3
            assert subscriber.throughput.samples == 6

    run(main)


def test_keyed_prompt_ids_share_prefixes_only_with_the_same_key(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """A deployment's prompt key: the relay sees ids nobody can compute from a guessed
    prompt, sidecars with the key find and load the shared prefix as before, and one with
    another key (or none) finds nothing."""
    key, other = b"k" * 32, b"o" * 32
    published = list(range(400, 400 + 3 * CHUNK))
    query = [*published, *range(950, 960)]
    kv = synthetic_kv(len(published), LAYOUT, seed=4)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            kv_publisher = KVPublisher(prompt_key=key)
            session = await net.session(kv_publisher)
            prompt = kv_publisher.prompt(
                MODEL, LAYOUT, published, tracks=("int8",), chunk_size=CHUNK
            )
            await session.publish_namespace(prompt.namespace)
            await prompt.publish(kv)
            assert prompt.name.prompt_id != prompt_id(published, CHUNK)  # the unkeyed id
            assert prompt.name.prompt_id == prompt_id(published, CHUNK, key)

            def subscriber_with(prompt_key: bytes | None) -> KVSubscriber:
                index = PrefixIndex(prompt_key=prompt_key)
                return KVSubscriber(session_for[prompt_key], chunk_size=CHUNK, index=index)

            session_for = {k: await net.session() for k in (key, other, None)}
            found = await subscriber_with(key).lookup(MODEL, query)
            assert (found.prompt, found.tokens) == (prompt.name, 3 * CHUNK)
            out = torch.zeros(LAYOUT.shape(len(query)))
            result = await subscriber_with(key).load(MODEL, query, out, 30)
            assert result.stopped is StopReason.COMPLETE
            assert torch.equal(out[:, :, : 3 * CHUNK], roundtrip("int8", kv))
            for stranger in (other, None):
                missed = await subscriber_with(stranger).lookup(MODEL, query)
                assert (missed.prompt, missed.tokens) == (None, 0)

    run(main)


@dataclasses.dataclass(frozen=True, slots=True)
class RewrittenInTransit(CatalogSigner):
    """The deployment's key signs each revision; then, as a relay in the middle would, chunk
    0's int8 digest is rewritten under the signature (so a forged chunk 0 would pass)."""

    def seal(self, catalog: bytes) -> bytes:
        sealed = CatalogSigner.seal(self, catalog)
        revision = Catalog.decode(catalog)
        track = revision.track("int8")
        assert track.digests, "a revision without digests would go out untouched"
        forged = bytes([track.digests[0][0] ^ 0x01]) + track.digests[0][1:]
        rewritten = dataclasses.replace(track, digests=(forged, *track.digests[1:]))
        tracks = tuple(rewritten if t.name == "int8" else t for t in revision.tracks)
        body = dataclasses.replace(revision, tracks=tracks).encode()
        return sealed[: len(sealed) - len(catalog)] + body


def test_signed_catalogs_load_only_where_the_key_is_trusted(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """Relays carry catalogs, but a subscriber with trusted keys takes only catalogs signed
    by one of them: an unsigned publisher's prompt, one signed by another key, or one the
    trusted key signed and the path rewrote, is not found (and each refusal is counted),
    while a trusted signer's loads bit-exact. A subscriber without keys takes the rewritten
    catalog, and only chunk 0's digest check stops what it claims."""
    deployment, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    token_ids = list(range(2000, 2040))

    async def main() -> None:
        async with network(relay.url, cert) as net:
            signers = {
                "deployment": CatalogSigner(deployment),
                "stranger": CatalogSigner(stranger),
                "none": None,
                "rewritten": RewrittenInTransit(deployment),
            }
            for seed, signer in enumerate(signers.values()):
                publisher = KVPublisher(signer=signer)
                session = await net.session(publisher)
                ids = [seed, *token_ids]  # one prompt per publisher
                prompt = publisher.prompt(MODEL, LAYOUT, ids, tracks=("int8",), chunk_size=CHUNK)
                await session.publish_namespace(prompt.namespace)
                await prompt.publish(synthetic_kv(len(ids), LAYOUT, seed=seed))

            refusals: list[Refusal] = []
            trust = dataclasses.replace(
                CatalogTrust.of([deployment.public_key()]), on_refusal=refusals.append
            )
            subscriber = KVSubscriber(await net.session(), chunk_size=CHUNK, trust=trust)
            for seed, name in enumerate(signers):
                ids = [seed, *token_ids]
                out = torch.zeros(LAYOUT.shape(len(ids)))
                result = await subscriber.load(MODEL, ids, out, 30)
                if name == "deployment":
                    assert result.stopped is StopReason.COMPLETE, result
                    expected = roundtrip("int8", synthetic_kv(len(ids), LAYOUT, seed=seed))
                    assert torch.equal(out[:, :, :32], expected[:, :, :32])
                else:
                    assert result.stopped is StopReason.NOT_FOUND, (name, result)
                    assert not out.any()
            assert refusals == [Refusal.UNKNOWN_KEY, Refusal.UNSIGNED, Refusal.BAD_SIGNATURE]
            # A subscriber without keys trusts the relay, and loads every one of them.
            trusting = KVSubscriber(await net.session(), chunk_size=CHUNK)
            for seed, name in enumerate(signers):
                ids = [seed, *token_ids]
                out = torch.zeros(LAYOUT.shape(len(ids)))
                result = await trusting.load(MODEL, ids, out, 30)
                if name == "rewritten":
                    assert [c.index for c in result.rejected] == [0], result
                    assert "digest differs from the catalog" in result.rejected[0].reason
                else:
                    assert result.stopped is StopReason.COMPLETE, result

    run(main)
