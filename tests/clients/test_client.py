"""The sync and asyncio clients against a real sidecar process and relay, over the Unix socket.

The model server's buffers come from `kvmoq_client.buffers` in this process, the sidecar
maps them in its own: a publish reads what this process wrote, a load writes what this
process then reads.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch
from kvmoq_client import (
    AsyncKVCacheClient,
    DeadlineExceeded,
    InvalidArgument,
    KVCacheClient,
    NotFound,
    Unavailable,
    paged_blocks,
    token_slots,
)
from kvmoq_client.buffers import KVBuffers, allocate_shared_kv
from kvmoq_client.client import RECONNECT_WITHIN_S
from kvmoq_client.requests import ANSWER_GRACE_S, load_call_timeout, load_request
from kvmoq_client.v1 import kv_cache_pb2 as pb

from sidecar.demo.children import Children
from sidecar.demo.nodes import start_sidecar
from sidecar.moqt.aio.tls import CertificatePaths
from tests.support.relay import RelayProcess
from tests.support.sidecar import CHUNK, SidecarProcess

DOWN_S = 20.0
"""Down this long, gRPC's default backoff made a client find the restarted sidecar only
4.9 s later (0.4 s with `CHANNEL_OPTIONS`)."""

MODEL = "SmolLM2-135M"
LAYERS, HEADS, HEAD_DIM = 3, 2, 8
PROMPT = list(range(500, 540))  # two whole chunks of 16 and a partial one


def _buffers(shm: Path, arrangement: pb.ContiguousLayout | pb.PagedLayout) -> KVBuffers:
    return allocate_shared_kv(LAYERS, HEADS, HEAD_DIM, torch.float16, arrangement, shm)


def _synthetic_kv(tokens: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    shape = (LAYERS, 2, tokens, HEADS, HEAD_DIM)
    return torch.randn(shape, generator=generator).to(torch.float16)


def _paged_tokens(buffers: KVBuffers, blocks: list[int], tokens: int) -> torch.Tensor:
    """`[L, 2, tokens, H, D]` from per-layer `[2, blocks, block, H, D]` buffers."""
    return torch.stack([layer[:, blocks].flatten(1, 2)[:, :tokens] for layer in buffers.tensors])


def test_publish_lookup_and_load_with_progress(
    prefill: SidecarProcess, decode: SidecarProcess, shm: Path
) -> None:
    kv = _synthetic_kv(len(PROMPT), seed=1)
    with (
        KVCacheClient(prefill.grpc, timeout=60) as client,
        KVCacheClient(decode.grpc, timeout=60) as loader,
        _buffers(shm, pb.ContiguousLayout(max_tokens=64)) as source,
        _buffers(shm, pb.PagedLayout(block_size=8, num_blocks=8)) as destination,
    ):
        for layer, tensor in enumerate(source.tensors):
            tensor[:, 10 : 10 + len(PROMPT)] = kv[layer]
        source_id = client.register_buffers(source.register_request(MODEL))
        published = client.publish(source_id, PROMPT, token_slots(10, 50), default_track="fp16")
        assert published.chunks == 3

        destination_id = loader.register_buffers(destination.register_request(MODEL))
        found = loader.lookup(destination_id, PROMPT)
        assert (found.available_tokens, found.prompt_id) == (len(PROMPT), published.prompt_id)

        blocks = [6, 0, 3, 5, 1]
        load = loader.load(destination_id, PROMPT, paged_blocks(blocks), tracks=["fp16"])
        chunks = [(chunk.tokens.start, chunk.tokens.end) for chunk in load]
        assert chunks == [(0, CHUNK), (CHUNK, 2 * CHUNK), (2 * CHUNK, len(PROMPT))]
        assert load.finished is not None
        assert (load.finished.prefix_tokens, load.finished.compute_tokens) == (len(PROMPT), 0)
        assert torch.equal(_paged_tokens(destination, blocks, len(PROMPT)), kv)
        assert not any(layer[:, [2, 4, 7]].any() for layer in destination.tensors)

        client.unregister_buffers(source_id)
        loader.unregister_buffers(destination_id)
        with pytest.raises(NotFound):
            loader.lookup(destination_id, PROMPT)


def test_refusals_arrive_as_typed_exceptions(decode: SidecarProcess, shm: Path) -> None:
    with (
        KVCacheClient(decode.grpc, timeout=30) as client,
        _buffers(shm, pb.ContiguousLayout(max_tokens=16)) as buffers,
    ):
        with pytest.raises(NotFound, match="no-such-set"):
            client.publish("no-such-set", PROMPT, token_slots(0, len(PROMPT)))
        with pytest.raises(NotFound):
            client.load("no-such-set", PROMPT, token_slots(0, len(PROMPT))).wait()

        request = buffers.register_request(MODEL)
        request.buffers[0].handle.shared_memory.size += 1 << 20
        with pytest.raises(InvalidArgument, match="past the end"):
            client.register_buffers(request)

        set_id = client.register_buffers(buffers.register_request(MODEL))
        with pytest.raises(InvalidArgument) as refused:
            client.publish(set_id, PROMPT, token_slots(0, len(PROMPT)))
        assert "16 slots" in refused.value.details
        client.unregister_buffers(set_id)


def test_a_relay_wait_goes_into_the_request_as_a_duration_and_is_checked() -> None:
    where = token_slots(0, 4)
    assert not load_request("set", [1, 2, 3, 4], where, ()).HasField("relay_wait")
    request = load_request("set", [1, 2, 3, 4], where, (), relay_wait=2.5)
    assert request.relay_wait.ToNanoseconds() == 2_500_000_000
    for bad in (-0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="relay_wait"):
            load_request("set", [1, 2, 3, 4], where, (), relay_wait=bad)


def test_a_load_deadline_goes_into_the_request_and_the_call_waits_a_grace_past_it() -> None:
    where = token_slots(0, 4)
    assert not load_request("set", [1, 2, 3, 4], where, ()).HasField("deadline")
    before = time.time()
    request = load_request("set", [1, 2, 3, 4], where, (), deadline=1.5)
    assert before + 1.5 <= request.deadline.ToNanoseconds() / 1e9 <= time.time() + 1.5
    for bad in (-0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="deadline"):
            load_request("set", [1, 2, 3, 4], where, (), deadline=bad)
    assert load_call_timeout(None, 1.5, 30.0) == 1.5 + ANSWER_GRACE_S
    assert load_call_timeout(4.0, 1.5, 30.0) == 4.0
    assert load_call_timeout(None, None, 30.0) == 30.0


def test_no_sidecar_is_unavailable_unless_the_client_waits_for_one(tmp_path: Path) -> None:
    target = f"unix://{tmp_path}/absent.sock"
    with KVCacheClient(target, timeout=10) as client, pytest.raises(Unavailable):
        client.lookup("any", PROMPT)
    with (
        KVCacheClient(target, timeout=1, wait_for_ready=True) as waiting,
        pytest.raises(DeadlineExceeded),
    ):
        waiting.lookup("any", PROMPT)


@pytest.mark.slow
def test_a_restarted_sidecar_is_found_again_within_a_second(
    module_relay: RelayProcess, cert: CertificatePaths, tmp_path: Path
) -> None:
    """A container restart keeps the socket path; the client's channel must not back off
    for longer than `RECONNECT_WITHIN_S` (gRPC's own backoff grows to minutes)."""
    with Children() as children, KVCacheClient(f"unix://{tmp_path}/sidecar.sock") as client:
        first = start_sidecar(children, "sidecar", module_relay.url, cert.cert, tmp_path)
        with pytest.raises(NotFound):
            client.unregister_buffers("none")
        first.child.process.kill()
        first.child.process.wait()
        end = time.monotonic() + DOWN_S  # long enough for gRPC's default backoff to grow
        while time.monotonic() < end:
            with pytest.raises(Unavailable):
                client.unregister_buffers("none")
            time.sleep(0.2)
        start_sidecar(children, "sidecar", module_relay.url, cert.cert, tmp_path)
        time.sleep(RECONNECT_WITHIN_S + 0.5)
        with pytest.raises(NotFound):  # answered by the new sidecar
            client.unregister_buffers("none")


def test_the_asyncio_client_does_the_same_round_trip(
    prefill: SidecarProcess, decode: SidecarProcess, shm: Path
) -> None:
    prompt = list(range(900, 932))
    kv = _synthetic_kv(len(prompt), seed=2)

    async def round_trip() -> tuple[list[tuple[int, int]], pb.LoadFinished]:
        async with (
            AsyncKVCacheClient(prefill.grpc, timeout=60) as client,
            AsyncKVCacheClient(decode.grpc, timeout=60) as loader,
        ):
            source_id = await client.register_buffers(source.register_request(MODEL))
            await client.publish(source_id, prompt, token_slots(0, len(prompt)))
            destination_id = await loader.register_buffers(destination.register_request(MODEL))
            load = loader.load(destination_id, prompt, token_slots(0, len(prompt)))
            chunks = [(chunk.tokens.start, chunk.tokens.end) async for chunk in load]
            assert load.finished is not None
            with pytest.raises(NotFound):
                await loader.unregister_buffers("no-such-set")
            return chunks, load.finished

    with (
        _buffers(shm, pb.ContiguousLayout(max_tokens=32)) as source,
        _buffers(shm, pb.ContiguousLayout(max_tokens=32)) as destination,
    ):
        for layer, tensor in enumerate(source.tensors):
            tensor.copy_(kv[layer])
        chunks, finished = asyncio.run(round_trip())
        assert chunks == [(0, CHUNK), (CHUNK, 2 * CHUNK)]
        assert finished.prefix_tokens == len(prompt)
        assert torch.equal(torch.stack(destination.tensors), kv)
