"""Lookups learn the published prompts from the relay's namespace announcements: a real relay
process, publishers and a decoder on real QUIC sessions to it (tests/support/kv_net.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import torch

from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.naming import PromptName
from sidecar.moqt.aio import api
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.protocol.drafts import DRAFT_16
from sidecar.transfer.publisher import KVPublisher
from sidecar.transfer.subscriber import Availability, KVSubscriber, StopReason
from tests.support.aio import run
from tests.support.kv_net import (
    MODEL,
    PROMPT_CHUNK,
    PROMPT_LAYOUT,
    answers,
    eventually,
    network,
    publish,
    synthetic_kv,
)
from tests.support.relay import RelayProcess, settings_for


def tracked(subscriber: KVSubscriber, prompt: PromptName) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return prompt in subscriber.announced

    return check


def int8(kv: torch.Tensor) -> torch.Tensor:
    codec = get_codec("int8")
    return codec.decode(codec.encode(kv, PROMPT_LAYOUT), PROMPT_LAYOUT)


def test_a_decoder_finds_a_longer_published_prompt_that_shares_its_first_chunks(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """No link of the query names the longer prompt, so only its announcement (and the
    catalog read after it) can tell the decoder; the tokens after the shared whole chunks
    are left to recompute."""
    long = list(range(1000, 1000 + 5 * PROMPT_CHUNK))
    query = [*long[: 2 * PROMPT_CHUNK + 3], *range(7000, 7020)]

    async def main() -> None:
        async with network(relay.url, cert) as net:
            prompt, kv = await publish(*await net.publisher(), long, seed=11)
            subscriber = await net.subscriber(PROMPT_CHUNK)
            # The first lookup of the model starts following its announcements and waits
            # for the prompts the relay lists to be read: it finds the longer one at once.
            whole = Availability(prompt.name, 2 * PROMPT_CHUNK, 2 * PROMPT_CHUNK)
            assert await subscriber.lookup(MODEL, query) == whole
            # A query of whole shared chunks needs no probe: the announcement vouches for
            # the prompt, so the lookup asks the relay nothing (the publisher sees nothing).
            catalog_requests = prompt.requests["catalog"]
            assert await subscriber.lookup(MODEL, long[: 2 * PROMPT_CHUNK]) == whole
            assert prompt.requests["catalog"] == catalog_requests

            out = torch.zeros(PROMPT_LAYOUT.shape(len(query)))
            result = await subscriber.load(MODEL, query, out, 30)
            assert result.stopped is StopReason.COMPLETE, result
            assert result.available == result.prefix_tokens == 2 * PROMPT_CHUNK
            assert torch.equal(out[:, :, : 2 * PROMPT_CHUNK], int8(kv)[:, :, : 2 * PROMPT_CHUNK])
            assert not out[:, :, 2 * PROMPT_CHUNK :].any()

    run(main)


def test_a_prompt_announced_during_prefill_is_answered_without_asking_once_complete(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """A prompt is announced before its first chunk, so the catalog read after the
    announcement is incomplete: lookups ask the relay until one sees the complete catalog,
    and answer with no request after that."""
    token_ids = list(range(9000, 9000 + 3 * PROMPT_CHUNK))
    kv = synthetic_kv(len(token_ids), PROMPT_LAYOUT, seed=14)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            subscriber = await net.subscriber(PROMPT_CHUNK)
            assert await subscriber.lookup(MODEL, token_ids) == Availability(None, 0, 0)
            publisher, session = await net.publisher()
            prompt = publisher.prompt(
                MODEL, PROMPT_LAYOUT, token_ids, tracks=("int8",), chunk_size=PROMPT_CHUNK
            )
            await session.publish_namespace(prompt.namespace)
            await prompt.add_chunk(kv[:, :, :PROMPT_CHUNK])
            await eventually(tracked(subscriber, prompt.name))
            assert await subscriber.lookup(MODEL, token_ids) == Availability(prompt.name, 48, 16)
            for start in (PROMPT_CHUNK, 2 * PROMPT_CHUNK):
                await prompt.add_chunk(kv[:, :, start : start + PROMPT_CHUNK])
            await eventually(answers(subscriber, token_ids, Availability(prompt.name, 48, 48)))
            catalog_requests = prompt.requests["catalog"]
            assert await subscriber.lookup(MODEL, token_ids) == Availability(prompt.name, 48, 48)
            assert prompt.requests["catalog"] == catalog_requests

    run(main)


def test_a_withdrawn_prompt_is_served_from_what_the_relay_caches(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """Withdrawn by its publisher (PUBLISH_NAMESPACE_DONE) or gone with its publisher's
    session: the relay keeps serving what it cached of the prompt, so lookups still find
    it (saying it is withdrawn: nothing more will come) and loads still complete. A prefill
    pod that restarts does not take its prompts with it."""
    removed = list(range(2000, 2000 + 3 * PROMPT_CHUNK))
    left = list(range(3000, 3000 + 3 * PROMPT_CHUNK + 5))

    async def main() -> None:
        async with network(relay.url, cert) as net:
            subscriber = await net.subscriber(PROMPT_CHUNK)
            assert await subscriber.lookup(MODEL, removed) == Availability(None, 0, 0)
            publisher, session = await net.publisher()
            prompt, kv = await publish(publisher, session, removed, seed=12)
            await eventually(tracked(subscriber, prompt.name))
            assert await subscriber.lookup(MODEL, removed) == Availability(prompt.name, 48, 48)
            await loads_whole(subscriber, removed, kv)  # through the relay: now in its cache
            # What the sidecar does to unpublish: forget the tracks, withdraw the namespace.
            publisher.remove(prompt.namespace)
            session.publish_namespace_done(prompt.namespace)
            await eventually(withdrawn(subscriber, prompt.name))
            assert prompt.name not in subscriber.announced
            cached = Availability(prompt.name, 48, 48, withdrawn=True)
            assert await subscriber.lookup(MODEL, removed) == cached
            await loads_whole(subscriber, removed, kv)

            leaving = KVPublisher()
            async with api.connect(relay.url, settings_for(cert), publisher=leaving) as session:
                gone, kv = await publish(leaving, session, left, seed=13)
                await eventually(tracked(subscriber, gone.name))
                assert await subscriber.lookup(MODEL, left) == Availability(gone.name, 53, 53)
                await loads_whole(subscriber, left, kv)
            await eventually(withdrawn(subscriber, gone.name))
            cached = Availability(gone.name, 53, 53, withdrawn=True)
            assert await subscriber.lookup(MODEL, left) == cached
            await loads_whole(subscriber, left, kv)
            # A prompt nobody published, nor any relay caches, is not found, at once.
            never = list(range(9000, 9000 + 2 * PROMPT_CHUNK))
            assert await subscriber.lookup(MODEL, never, timeout=1) == Availability(None, 0, 0)

    run(main)


async def loads_whole(subscriber: KVSubscriber, token_ids: list[int], kv: torch.Tensor) -> None:
    out = torch.zeros_like(kv)
    result = await subscriber.load(MODEL, token_ids, out, 30)
    assert result.stopped is StopReason.COMPLETE, result
    assert torch.equal(out, int8(kv))


def withdrawn(subscriber: KVSubscriber, prompt: PromptName) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return subscriber.announced.withdrawn(prompt)

    return check


def test_the_oldest_announced_prompts_are_forgotten_past_the_bound(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """Two prompts tracked at most: the two announced last. An older one is still found, by
    probing the query's links."""
    prompts = [list(range(base, base + 2 * PROMPT_CHUNK)) for base in (4000, 5000, 6000, 7000)]

    async def main() -> None:
        async with network(relay.url, cert) as net:
            subscriber = KVSubscriber(await net.session(), chunk_size=PROMPT_CHUNK, max_announced=2)
            assert await subscriber.lookup(MODEL, prompts[0]) == Availability(None, 0, 0)
            publisher, session = await net.publisher()
            names = [
                (await publish(publisher, session, p, seed=20 + i))[0].name
                for i, p in enumerate(prompts)
            ]
            await eventually(tracked(subscriber, names[-1]))
            assert [name in subscriber.announced for name in names] == [False, False, True, True]
            assert len(subscriber.announced) == 2
            oldest = Availability(names[0], 2 * PROMPT_CHUNK, 2 * PROMPT_CHUNK)
            assert await subscriber.lookup(MODEL, prompts[0]) == oldest

    run(main)


def test_a_relay_that_refuses_the_namespace_subscription_leaves_lookups_to_probes(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """Our relay lets one peer follow 64 prefixes (protocol.records.OriginLimits): a decoder session
    that follows as many already gets its SUBSCRIBE_NAMESPACE refused. Lookups go on, from
    the query's links, and nothing is tracked."""
    long = list(range(8000, 8000 + 3 * PROMPT_CHUNK))
    # Draft 16: at 18 each prefix followed takes two QUIC streams (its namespaces, its
    # tracks), and 64 of them fill aioquic's 128 before the decoder's own requests.
    draft_16 = settings_for(cert, drafts=(DRAFT_16,))

    async def main() -> None:
        async with network(relay.url, cert, draft_16) as net:
            decoder = await net.session()
            for i in range(64):
                await decoder.subscribe_namespace((b"elsewhere", b"%d" % i))
            subscriber = KVSubscriber(decoder, chunk_size=PROMPT_CHUNK)
            assert await subscriber.lookup(MODEL, long) == Availability(None, 0, 0)
            prompt, _ = await publish(*await net.publisher(), long, seed=30)
            found = Availability(prompt.name, 3 * PROMPT_CHUNK, 3 * PROMPT_CHUNK)
            assert await subscriber.lookup(MODEL, long) == found
            assert await subscriber.lookup(MODEL, [*long, 1, 2]) == found
            assert len(subscriber.announced) == 0

    run(main)
