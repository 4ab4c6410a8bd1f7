"""Loads split over several sessions and worker processes, through a real relay process:
the same bytes and the same report as one load on one session."""

from __future__ import annotations

import math

import pytest
import torch

from sidecar.kvcache.layout import KVLayout
from sidecar.kvcache.naming import PromptName
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.transfer.adapt import ThroughputEstimate
from sidecar.transfer.parallel import (
    LoadWorkers,
    Share,
    WorkerFailed,
    load_parallel,
    merge_results,
    shared_destination,
)
from sidecar.transfer.subscriber import LoadedChunk, LoadResult, RejectedChunk, StopReason
from sidecar.transfer.track_quality import TrackChoice
from tests.support.aio import run
from tests.support.kv_net import MODEL, Network, network, synthetic_kv
from tests.support.relay import RelayProcess, settings_for

LAYOUT = KVLayout(num_layers=3, num_kv_heads=2, head_dim=16, dtype="float32")
CHUNK = 16
TOKENS = list(range(300, 300 + 5 * CHUNK + 7))
"""Six chunks, the last one short: shares of 3 sessions get 2 chunks each, of 4 get 1 or 2."""
BROKEN = 3
"""The chunk whose int8 objects the publisher corrupts in the rejection test."""


def _report(result: LoadResult) -> tuple[object, ...]:
    """What a load says, less the per-chunk seconds (which differ from run to run)."""
    loaded = [(c.index, c.tokens, c.track, c.nbytes) for c in result.loaded]
    return (result.prompt, result.available, loaded, result.rejected, result.stopped)


async def _publish(net: Network, kv: torch.Tensor, corrupt: int | None = None) -> PromptName:
    def hook(track: str, group: int, obj: int, payload: bytes) -> bytes:
        # One bit of one code flipped: the chunk keeps its size and decodes, only its digest
        # tells (a load that skipped the check would write it).
        if group != corrupt or obj != 0:
            return payload
        flipped = bytearray(payload)
        flipped[-1] ^= 0x01
        return bytes(flipped)

    prompt = await net.published(
        LAYOUT, TOKENS, kv, tracks=("int8",), chunk_size=CHUNK, payload_hook=hook
    )
    return prompt.name


@pytest.mark.parametrize("sessions", [3, 4])
def test_sessions_in_one_process_load_what_one_session_loads(
    relay: RelayProcess,
    cert: CertificatePaths,
    sessions: int,
) -> None:
    kv = synthetic_kv(len(TOKENS), LAYOUT, seed=21)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            name = await _publish(net, kv)
            single = await net.subscriber(CHUNK)
            expected = torch.zeros_like(kv)
            alone = await single.load(MODEL, TOKENS, expected, 30)
            assert alone.stopped is StopReason.COMPLETE and alone.prompt == name
            assert alone.loaded_tokens == (range(0, len(TOKENS)),)

            subscribers = [await net.subscriber(CHUNK) for _ in range(sessions)]
            written: list[range] = []
            out = torch.zeros_like(kv)

            def sink(span: range, chunk: torch.Tensor) -> None:
                written.append(span)
                out[:, :, span.start : span.stop] = chunk

            result = await load_parallel(subscribers, MODEL, TOKENS, sink, 30)
            assert _report(result) == _report(alone)
            assert torch.equal(out, expected)
            assert sorted(written, key=lambda span: span.start) == [c.tokens for c in alone.loaded]

    run(main)


def test_a_rejected_chunk_is_reported_as_a_single_load_reports_it(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    """Chunk 3's objects fail its digest on the only track offered: both loads leave the
    same hole, report the same rejection and write nothing of it."""
    kv = synthetic_kv(len(TOKENS), LAYOUT, seed=22)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            await _publish(net, kv, corrupt=BROKEN)
            expected = torch.zeros_like(kv)
            alone = await (await net.subscriber(CHUNK)).load(MODEL, TOKENS, expected, 30)
            subscribers = [await net.subscriber(CHUNK) for _ in range(2)]
            out = torch.zeros_like(kv)
            result = await load_parallel(subscribers, MODEL, TOKENS, out, 30)
            assert _report(result) == _report(alone)
            assert [c.index for c in result.rejected] == [BROKEN]
            assert "digest differs from the catalog" in result.rejected[0].reason
            hole = range(BROKEN * CHUNK, (BROKEN + 1) * CHUNK)
            assert result.loaded_tokens == (range(0, hole.start), range(hole.stop, len(TOKENS)))
            assert torch.equal(out, expected)
            assert not out[:, :, hole.start : hole.stop].any()

    run(main)


def test_worker_processes_load_into_shared_memory(
    relay: RelayProcess,
    cert: CertificatePaths,
) -> None:
    kv = synthetic_kv(len(TOKENS), LAYOUT, seed=23)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            await _publish(net, kv)
            expected = torch.zeros_like(kv)
            alone = await (await net.subscriber(CHUNK)).load(MODEL, TOKENS, expected, 30)
            settings = settings_for(cert)
            with shared_destination(LAYOUT, len(TOKENS)) as (handle, out):
                async with LoadWorkers(relay.url, settings, 2, chunk_size=CHUNK) as workers:
                    result = await workers.load(MODEL, TOKENS, handle, 30)
                    assert _report(result) == _report(alone)
                    assert torch.equal(out, expected)
                    # a destination that does not fit the layout: the worker's error, raised
                    with (
                        shared_destination(LAYOUT, CHUNK) as (small, _),
                        pytest.raises(WorkerFailed, match="destination holds"),
                    ):
                        await workers.load(MODEL, TOKENS, small, 30)
                    with pytest.raises(WorkerFailed, match="not running"):
                        await workers.load(MODEL, TOKENS, handle, 30)

    run(main)


def test_shares_cover_every_chunk_once() -> None:
    for total in range(0, 40):
        for count in range(1, 9):
            parts = [Share(index, count).chunks(total) for index in range(count)]
            assert [i for part in parts for i in part] == list(range(total))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
    with pytest.raises(ValueError):
        Share(2, 2)


def test_merge_keeps_the_first_incomplete_reason_and_every_chunk() -> None:
    name = PromptName(MODEL, "0" * 64)
    first = LoadResult(
        name, 48, (LoadedChunk(0, range(0, 16), "int8", 10, 0.1, 1e-4),), (), StopReason.COMPLETE
    )
    second = LoadResult(
        name,
        48,
        (LoadedChunk(2, range(32, 48), "int8", 10, 0.1, 1e-4),),
        (RejectedChunk(1, range(16, 32), "int8", "digest"),),
        StopReason.DEADLINE,
    )
    merged = merge_results([second, first])
    assert [c.index for c in merged.loaded] == [0, 2]
    assert merged.loaded_tokens == (range(0, 16), range(32, 48))
    assert [c.index for c in merged.rejected] == [1]
    assert merged.stopped is StopReason.DEADLINE
    assert merge_results([first, first]).stopped is StopReason.COMPLETE


def test_only_the_share_that_ends_the_load_weights_its_last_chunk(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """Three sessions take chunks [0, 2), [2, 4), [4, 6). Each share's first chunk is chosen
    at the same prior throughput (1000 B/s) with 8.2 s: the first two shares split their time
    in 2 (4100 B: room for int8, 3280 B, not fp16), the one that ends the load in 1 + 2 for
    its most recent chunk (2733 B: int4, 1936 B). A lookup slower than 1.6 s would change it."""
    kv = synthetic_kv(len(TOKENS), LAYOUT, seed=22)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            prompt = await net.published(
                LAYOUT, TOKENS, kv, tracks=("fp16", "int8", "int4"), chunk_size=CHUNK
            )
            assert prompt.catalog is not None
            sizes = prompt.catalog.chunk_bytes(0)
            assert (sizes["fp16"], sizes["int8"], sizes["int4"]) == (6160, 3280, 1936)
            subscribers = [await net.subscriber(CHUNK) for _ in range(3)]
            for subscriber in subscribers:
                subscriber.throughput = ThroughputEstimate(bytes_per_second=1000.0)
            out = torch.zeros_like(kv)
            no_floor = TrackChoice(max_kl=math.inf)  # the deadline rule alone
            result = await load_parallel(subscribers, MODEL, TOKENS, out, 8.2, choice=no_floor)
            assert result.stopped is StopReason.COMPLETE
            first = {chunk.index: chunk.track for chunk in result.loaded if chunk.index % 2 == 0}
            assert first == {0: "int8", 2: "int8", 4: "int4"}

    run(main)
