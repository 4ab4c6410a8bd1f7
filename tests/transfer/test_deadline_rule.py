"""The deadline rule as a load applies it, on a slow link: a real relay process, the decoder
behind bench/lossy_link.py pacing each direction at 8 Mbit/s (1 MB/s).

On fast loopback every chunk fits on the best track and the rule never has to choose, so
these loads are sized against the link, at the rate a warm-up load measured on it (QUIC
gets less than the link's rate through its 50 ms queue): the first chunk's choice follows
from that rate and the deadline alone, and the last chunk's from the time left, with
margins of a third or more either side of each threshold."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
import torch

from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.aio import api
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.transfer.adapt import ThroughputEstimate
from sidecar.transfer.publisher import KVPublisher, PublishedPrompt
from sidecar.transfer.subscriber import KVSubscriber, LoadResult, StopReason
from sidecar.transfer.track_quality import TrackChoice
from tests.support.aio import run
from tests.support.kv_net import MODEL, lossy_link, synthetic_kv
from tests.support.relay import RelayProcess, settings_for

# Times loads over paced links or stall watches: scripts/test.sh runs it alone (see there).
pytestmark = [pytest.mark.slow, pytest.mark.timing]

LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype="float16")
CHUNK = 128  # 262 KB a chunk on fp16, 0.26 s on the link
RATE = "8mbit"
BYTES_PER_SECOND = 1e6
TRACKS = ("fp16", "int8", "int4")
LATE_S = 0.05
"""How late a load may return past its deadline: the event loop's scheduling, not a chunk."""

Load = Callable[[int, float, float], Awaitable["Loaded"]]


@dataclass(frozen=True)
class Loaded:
    prompt: PublishedPrompt
    result: LoadResult
    subscriber: KVSubscriber
    """Its estimate updated by the load."""
    seconds: float
    """The load's own time, from `KVSubscriber.load` to its result."""


def on_a_slow_link(
    relay: RelayProcess, cert: CertificatePaths, test: Callable[[Load], Awaitable[None]]
) -> None:
    """Run `test` with a function that publishes a prompt of N chunks straight to the relay
    and loads it through the slow link within D seconds, starting from a throughput
    estimate of R bytes/s."""
    with lossy_link(relay.url, rate=RATE) as (url, _):

        async def main() -> None:
            publisher = KVPublisher()
            async with (
                api.connect(relay.url, settings_for(cert), publisher=publisher) as prefill,
                api.connect(url, settings_for(cert)) as decode,
            ):
                seeds = iter(range(100))

                async def load(chunks: int, deadline: float, rate: float) -> Loaded:
                    seed = next(seeds)
                    ids = [seed * 100_000 + i for i in range(chunks * CHUNK)]
                    prompt = publisher.prompt(
                        MODEL, LAYOUT, ids, tracks=TRACKS, default_track="fp16", chunk_size=CHUNK
                    )
                    await prefill.publish_namespace(prompt.namespace)
                    await prompt.publish(synthetic_kv(len(ids), LAYOUT, seed=seed))
                    for track in TRACKS:  # encoded before the clock starts
                        await prompt.kept_track(track)
                    subscriber = KVSubscriber(
                        decode,
                        chunk_size=CHUNK,
                        throughput=ThroughputEstimate(rate),
                    )
                    clock = asyncio.get_running_loop().time
                    started = clock()
                    destination = torch.zeros(LAYOUT.shape(len(ids)))
                    # The deadline rule alone: no quality floor narrows the tracks.
                    result = await subscriber.load(
                        MODEL, ids, destination, deadline, choice=TrackChoice(max_kl=math.inf)
                    )
                    return Loaded(prompt, result, subscriber, clock() - started)

                await test(load)

        run(main)


def chunk_bytes(prompt: PublishedPrompt, track: str) -> int:
    assert prompt.catalog is not None
    return prompt.catalog.chunk_bytes(0)[track]


def test_past_their_shares_chunks_load_on_the_smallest_track_until_the_deadline(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """Sixteen chunks in the time 10 int4 chunks take: not even int4 fits the first chunk's
    share (a seventeenth of the deadline), but each int4 chunk lands long before the
    deadline, so the load takes int4 chunks until the next one would land late, and stops
    there in time: chunks the model server need not compute, where stopping at the share
    wrote none. How many depends on the link's jitter, so the bounds are loose."""

    async def test(load: Load) -> None:
        warm = await load(2, 30, BYTES_PER_SECOND)
        rate = warm.subscriber.throughput.bytes_per_second
        deadline = 10 * chunk_bytes(warm.prompt, "int4") / rate
        loaded = await load(16, deadline, rate)
        result = loaded.result
        assert result.stopped is StopReason.DEADLINE, result
        assert {chunk.track for chunk in result.loaded} == {"int4"}, result.loaded
        assert 3 <= len(result.loaded) <= 10, result.loaded
        assert loaded.seconds <= deadline + LATE_S, (loaded.seconds, deadline)

    on_a_slow_link(relay, cert, test)


def test_a_chunk_that_cannot_land_in_time_stops_the_load(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """A deadline shorter than one int4 chunk takes: nothing lands in time, so the load
    stops at once with nothing written, for the model server to compute."""

    async def test(load: Load) -> None:
        warm = await load(2, 30, BYTES_PER_SECOND)
        rate = warm.subscriber.throughput.bytes_per_second
        deadline = 0.5 * chunk_bytes(warm.prompt, "int4") / rate
        result = (await load(4, deadline, rate)).result
        assert result.stopped is StopReason.DEADLINE, result
        assert result.loaded == (), result.loaded

    on_a_slow_link(relay, cert, test)


def test_each_chunk_gets_its_share_of_the_time_and_the_last_one_the_rest(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """Two chunks, in the time 5.5 int8 chunks take (I: an int8 chunk's seconds, about half
    an fp16 chunk's, F). The first gets a third of it (the recent, last chunk counts two
    shares): 1.8 I, enough for int8 but not fp16. The last gets all the time left, about
    4.5 I: fp16, even if a loaded machine slows the first chunk and the rate estimate drops
    by half again. Giving the first chunk the whole time (fp16), or miscounting the chunks
    left by one (first on fp16; or last with a third of the time left, 1.5 I: int8) each
    change a track below."""

    async def test(load: Load) -> None:
        warm = await load(2, 30, BYTES_PER_SECOND)
        rate = warm.subscriber.throughput.bytes_per_second
        int8, fp16 = (chunk_bytes(warm.prompt, track) / rate for track in ("int8", "fp16"))
        assert 1.8 * int8 < fp16 < 2.2 * int8
        deadline = 5.5 * int8
        result = (await load(2, deadline, rate)).result
        assert result.stopped is StopReason.COMPLETE, result
        assert [chunk.track for chunk in result.loaded] == ["int8", "fp16"], result.loaded

    on_a_slow_link(relay, cert, test)
