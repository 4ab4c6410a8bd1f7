"""The API of one running sidecar process: every bad request gets the status and message the
contract promises, the sidecar keeps serving, and its health, readiness and metrics show."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from kvmoq_client.v1 import kv_cache_pb2 as pb
from kvmoq_client.v1 import kv_cache_pb2_grpc as pb_grpc
from kvmoq_client.v1 import tensor_handle_pb2 as handle_pb

from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.aio.tls import CertificatePaths
from tests.support.relay import RelayProcess
from tests.support.sidecar import (
    ContiguousKV,
    PagedKV,
    SidecarProcess,
    load,
    running_sidecar,
    shm_directory,
    spans,
)

MODEL = "SmolLM2-135M"
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float16")
MAX_TOKENS = 256


@pytest.fixture(scope="module")
def sidecar(module_relay: RelayProcess, cert: CertificatePaths) -> Iterator[SidecarProcess]:
    flags = ("--chunk-size", "16", "--max-request-tokens", str(MAX_TOKENS))
    with running_sidecar(module_relay.url, cert, *flags) as process:
        process.wait_ready()
        yield process


@pytest.fixture(scope="module")
def peer(module_relay: RelayProcess, cert: CertificatePaths) -> Iterator[SidecarProcess]:
    """A second sidecar on the relay: a relay routes no request back to the session it
    came from, so what one sidecar publishes, another one loads."""
    with running_sidecar(module_relay.url, cert, "--chunk-size", "16") as process:
        process.wait_ready()
        yield process


@pytest.fixture(scope="module")
def shm() -> Iterator[Path]:
    with shm_directory() as directory:
        yield directory


@pytest.fixture(scope="module")
def contiguous(sidecar: SidecarProcess, shm: Path) -> tuple[str, ContiguousKV]:
    buffers = ContiguousKV(LAYOUT, max_tokens=64, directory=shm)
    return sidecar.stub.RegisterBuffers(buffers.request(MODEL)).buffer_set_id, buffers


@pytest.fixture(scope="module")
def paged(sidecar: SidecarProcess, shm: Path) -> tuple[str, PagedKV]:
    buffers = PagedKV(LAYOUT, block_size=8, num_blocks=16, directory=shm)
    return sidecar.stub.RegisterBuffers(buffers.request(MODEL)).buffer_set_id, buffers


def refused(call: Callable[[], Any], code: grpc.StatusCode, *words: str) -> None:
    """`call` fails with `code` and a message naming `words` (a stream: once read)."""
    with pytest.raises(grpc.RpcError) as caught:
        result = call()
        if not isinstance(result, Message):
            list(result)
    error = caught.value
    assert error.code() == code, error.details()
    for word in words:
        assert word in error.details(), error.details()


def contiguous_request(shm: Path, max_tokens: int = 16) -> pb.RegisterBuffersRequest:
    """A registration of fresh contiguous buffers (their own files), to spoil."""
    directory = Path(tempfile.mkdtemp(dir=shm))
    return ContiguousKV(LAYOUT, max_tokens=max_tokens, directory=directory).request(MODEL)


def blocks(*ids: int) -> pb.KVLocation:
    return pb.KVLocation(blocks=pb.BlockList(block_ids=ids))


def token_range(start: int, end: int) -> pb.KVLocation:
    return pb.KVLocation(token_range=pb.TokenRange(start=start, end=end))


def test_unknown_buffer_set_is_not_found(sidecar: SidecarProcess) -> None:
    stub = sidecar.stub
    nf = grpc.StatusCode.NOT_FOUND
    refused(lambda: stub.Lookup(pb.LookupRequest(buffer_set_id="nope", token_ids=[1])), nf, "nope")
    refused(
        lambda: stub.Publish(
            pb.PublishRequest(buffer_set_id="nope", token_ids=[1], source=token_range(0, 1))
        ),
        nf,
        "register",
    )
    refused(
        lambda: stub.Load(
            pb.LoadRequest(buffer_set_id="nope", token_ids=[1], destination=blocks(0))
        ),
        nf,
    )
    refused(lambda: stub.UnregisterBuffers(pb.UnregisterBuffersRequest(buffer_set_id="nope")), nf)


@pytest.mark.parametrize("method", ["RegisterBuffers", "Lookup", "Publish", "Load"])
def test_a_request_that_is_not_a_valid_message_is_invalid_argument(
    sidecar: SidecarProcess, method: str
) -> None:
    """Bytes that do not parse as the method's message (0xff: field 31 with wire type 7)
    are the client's error, named as such, and the sidecar goes on serving."""
    path = f"/kvmoq.v1.KVCacheService/{method}"
    if method == "Load":
        call = sidecar.channel.unary_stream(path)
        with pytest.raises(grpc.RpcError) as error:
            list(call(b"\xff\xff", timeout=10))
    else:
        with pytest.raises(grpc.RpcError) as error:
            sidecar.channel.unary_unary(path)(b"\xff\xff", timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid kvmoq.v1." in (error.value.details() or "")
    test_unknown_buffer_set_is_not_found(sidecar)  # still serving, with proper statuses


def test_destination_blocks_outside_the_buffers_are_refused(
    sidecar: SidecarProcess, paged: tuple[str, PagedKV]
) -> None:
    set_id, buffers = paged
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    tokens = list(range(20))  # 3 blocks of 8

    def load_into(location: pb.KVLocation) -> object:
        return sidecar.stub.Load(
            pb.LoadRequest(buffer_set_id=set_id, token_ids=tokens, destination=location)
        )

    refused(lambda: load_into(blocks(1, 2, 16)), invalid, "[16]", "16 blocks")
    refused(lambda: load_into(blocks(1, 2)), invalid, "need 3 blocks")
    refused(lambda: load_into(blocks(1, 2, 1)), invalid, "twice")
    refused(lambda: load_into(token_range(0, 20)), invalid, "block list")
    refused(lambda: load_into(pb.KVLocation()), invalid, "destination")
    assert not any(tensor.any() for tensor in buffers.keys + buffers.values)


def test_a_negative_relay_wait_is_refused(
    sidecar: SidecarProcess, paged: tuple[str, PagedKV]
) -> None:
    set_id, _ = paged
    request = pb.LoadRequest(
        buffer_set_id=set_id,
        token_ids=list(range(20)),
        destination=blocks(1, 2, 3),
        relay_wait=Duration(seconds=-1),
    )
    refused(
        lambda: sidecar.stub.Load(request, timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT,
        "relay_wait is -1.000 s",
    )


def test_token_ranges_outside_contiguous_buffers_are_refused(
    sidecar: SidecarProcess, contiguous: tuple[str, ContiguousKV]
) -> None:
    set_id, _ = contiguous
    invalid = grpc.StatusCode.INVALID_ARGUMENT

    def publish(location: pb.KVLocation, tokens: int = 10) -> object:
        return sidecar.stub.Publish(
            pb.PublishRequest(buffer_set_id=set_id, token_ids=list(range(tokens)), source=location)
        )

    refused(lambda: publish(token_range(60, 70)), invalid, "outside the 64 slots")
    refused(lambda: publish(token_range(0, 9)), invalid, "9 slots for 10 tokens")
    refused(lambda: publish(blocks(0)), invalid, "token range")
    refused(lambda: publish(token_range(0, 10), 0), invalid, "0 tokens")


def test_token_lists_beyond_the_limit_are_refused(
    sidecar: SidecarProcess, paged: tuple[str, PagedKV]
) -> None:
    set_id, _ = paged
    too_many = list(range(MAX_TOKENS + 1))
    refused(
        lambda: sidecar.stub.Lookup(pb.LookupRequest(buffer_set_id=set_id, token_ids=too_many)),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"send 1 to {MAX_TOKENS}",
    )
    refused(
        lambda: sidecar.stub.Lookup(pb.LookupRequest(buffer_set_id=set_id, token_ids=[])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "0 tokens",
    )


def test_a_deadline_in_the_past_is_deadline_exceeded(
    sidecar: SidecarProcess, paged: tuple[str, PagedKV]
) -> None:
    set_id, buffers = paged
    past = Timestamp()
    past.GetCurrentTime()
    past.seconds -= 5
    refused(
        lambda: sidecar.stub.Load(
            pb.LoadRequest(
                buffer_set_id=set_id, token_ids=[1, 2], destination=blocks(3), deadline=past
            )
        ),
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "deadline passed",
    )
    assert not buffers.keys[0][3].any()


def test_buffers_that_do_not_match_the_layout_are_refused(
    sidecar: SidecarProcess, shm: Path
) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    wide = KVLayout(LAYOUT.num_layers, LAYOUT.num_kv_heads, 2 * LAYOUT.head_dim, LAYOUT.dtype)
    request = contiguous_request(shm)
    request.layout.head_dim = wide.head_dim
    refused(lambda: sidecar.stub.RegisterBuffers(request), invalid, "shape", "need")

    one_layer = contiguous_request(shm)
    del one_layer.buffers[1]
    refused(lambda: sidecar.stub.RegisterBuffers(one_layer), invalid, "no buffer holds layer 1")

    bf16 = contiguous_request(shm)
    bf16.layout.dtype = handle_pb.DTYPE_BFLOAT16
    refused(lambda: sidecar.stub.RegisterBuffers(bf16), invalid, "bfloat16")

    no_arrangement = contiguous_request(shm)
    no_arrangement.ClearField("contiguous")
    refused(lambda: sidecar.stub.RegisterBuffers(no_arrangement), invalid, "contiguous")


def test_a_handle_that_does_not_open_is_refused(sidecar: SidecarProcess, shm: Path) -> None:
    request = contiguous_request(shm)
    request.buffers[0].handle.shared_memory.path = str(shm / "gone")
    refused(
        lambda: sidecar.stub.RegisterBuffers(request),
        grpc.StatusCode.INVALID_ARGUMENT,
        "SharedMemoryHandle does not open",
        "no such file",
    )
    outside = contiguous_request(shm)
    outside.buffers[0].handle.shared_memory.path = "/etc/passwd"
    refused(
        lambda: sidecar.stub.RegisterBuffers(outside),
        grpc.StatusCode.INVALID_ARGUMENT,
        "outside the shared-memory roots",
    )
    short = contiguous_request(shm)
    short.buffers[0].handle.shared_memory.size = 64  # the view needs 1 KiB
    refused(lambda: sidecar.stub.RegisterBuffers(short), grpc.StatusCode.INVALID_ARGUMENT)


def test_a_cuda_handle_on_a_node_without_that_gpu_is_failed_precondition(
    sidecar: SidecarProcess, shm: Path
) -> None:
    request = contiguous_request(shm)
    request.buffers[0].handle.CopyFrom(
        handle_pb.TensorHandle(
            cuda_ipc=handle_pb.CudaIpcHandle(
                device_uuid="GPU-00000000-0000-0000-0000-000000000000",
                ipc_handle=bytes(64),
                storage_size_bytes=2 * 16 * 2 * 8 * 2,
                dtype=handle_pb.DTYPE_FLOAT16,
                shape=[2, 16, 2, 8],
                stride=[256, 16, 8, 1],
                ref_counter_handle=b"/torch_0_0",
                event_handle=bytes(64),
            )
        )
    )
    refused(
        lambda: sidecar.stub.RegisterBuffers(request),
        grpc.StatusCode.FAILED_PRECONDITION,
        "CudaIpcHandle does not open",
    )


def test_a_load_with_nothing_published_asks_for_every_token(
    sidecar: SidecarProcess, paged: tuple[str, PagedKV]
) -> None:
    set_id, buffers = paged
    chunks, finished = load(
        sidecar.stub,
        pb.LoadRequest(
            buffer_set_id=set_id, token_ids=list(range(900, 920)), destination=blocks(4, 5, 6)
        ),
        timeout=60,
    )
    assert not chunks and not spans(finished.loaded)
    assert finished.stop_reason == pb.STOP_REASON_NOT_FOUND
    assert (finished.prefix_tokens, finished.compute_tokens) == (0, 20)
    assert not any(buffers.keys[0][b].any() for b in (4, 5, 6))


def test_unregister_forgets_the_buffer_set(sidecar: SidecarProcess, shm: Path) -> None:
    request = contiguous_request(shm)
    set_id = sidecar.stub.RegisterBuffers(request).buffer_set_id
    sidecar.stub.UnregisterBuffers(pb.UnregisterBuffersRequest(buffer_set_id=set_id))
    refused(
        lambda: sidecar.stub.Lookup(pb.LookupRequest(buffer_set_id=set_id, token_ids=[1])),
        grpc.StatusCode.NOT_FOUND,
    )


def test_health_readiness_and_metrics(sidecar: SidecarProcess) -> None:
    assert sidecar.get("/healthz") == (200, "ok\n")
    assert sidecar.get("/readyz") == (200, "ready\n")
    assert sidecar.get("/nope")[0] == 404
    assert sidecar.metric("kvmoq_relay_up") == 1
    assert sidecar.metric("kvmoq_relay_reconnects_total") == 0
    assert "kvmoq_load_seconds_bucket" in sidecar.get("/metrics")[1]

    with grpc.insecure_channel(sidecar.probe) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "kvmoq.v1.KVCacheService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        [reply] = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
        names = {s.name for s in reply.list_services_response.service}
        assert "grpc.health.v1.Health" in names
        # The probe port is TCP: the KV API is on the Unix socket only (unless --probe-api).
        assert "kvmoq.v1.KVCacheService" not in names
        with pytest.raises(grpc.RpcError) as error:
            pb_grpc.KVCacheServiceStub(channel).Lookup(pb.LookupRequest(), timeout=10)
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_the_api_socket_is_for_the_model_servers_group_only(sidecar: SidecarProcess) -> None:
    socket = Path(sidecar.grpc.removeprefix("unix://"))
    assert socket.stat().st_mode & 0o777 == 0o660


def test_a_load_of_kv_with_another_layout_is_refused_before_any_write(
    sidecar: SidecarProcess, peer: SidecarProcess, contiguous: tuple[str, ContiguousKV], shm: Path
) -> None:
    """Same model name, other KV geometry (say, a fine-tune with more KV heads): the first
    chunk shows it, nothing is written, FAILED_PRECONDITION says what differs."""
    source_id, source = contiguous
    tokens = list(range(300, 332))
    source.put(0, torch.ones(LAYOUT.shape(len(tokens)), dtype=LAYOUT.torch_dtype))
    sidecar.stub.Publish(
        pb.PublishRequest(buffer_set_id=source_id, token_ids=tokens, source=token_range(0, 32))
    )
    wider = KVLayout(LAYOUT.num_layers, 2 * LAYOUT.num_kv_heads, LAYOUT.head_dim, LAYOUT.dtype)
    destination = PagedKV(wider, 8, 4, Path(tempfile.mkdtemp(dir=shm)))
    set_id = peer.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
    refused(
        lambda: peer.stub.Load(
            pb.LoadRequest(buffer_set_id=set_id, token_ids=tokens, destination=blocks(0, 1, 2, 3)),
            timeout=60,
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "another model or layout",
    )
    assert not any(tensor.any() for tensor in destination.keys + destination.values)


def test_a_prompt_published_here_loads_from_this_sidecars_memory(
    sidecar: SidecarProcess, contiguous: tuple[str, ContiguousKV], shm: Path
) -> None:
    source_id, source = contiguous
    destination = PagedKV(LAYOUT, 8, 16, Path(tempfile.mkdtemp(dir=shm)))
    set_id = sidecar.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
    tokens = list(range(700, 740))  # 2 whole chunks of 16 and a partial one
    kv = torch.randn(LAYOUT.shape(len(tokens)), generator=torch.Generator().manual_seed(7))
    source.put(10, kv.to(LAYOUT.torch_dtype))
    sidecar.stub.Publish(
        pb.PublishRequest(
            buffer_set_id=source_id, token_ids=tokens, source=token_range(10, 50), tracks=["int4"]
        )
    )
    found = sidecar.stub.Lookup(pb.LookupRequest(buffer_set_id=set_id, token_ids=tokens))
    assert (found.available_tokens, found.relay_url) == (40, "")
    query = [*tokens[:32], 1, 2, 3]  # the first two chunks only
    ids = [15, 8, 3, 10, 12]
    chunks, finished = load(
        sidecar.stub,
        pb.LoadRequest(buffer_set_id=set_id, token_ids=query, destination=blocks(*ids)),
        timeout=60,
    )
    assert [(c.tokens.start, c.tokens.end) for c in chunks] == [(0, 16), (16, 32)]
    assert (spans(finished.loaded), finished.compute_tokens) == ([(0, 32)], 3)
    assert finished.stop_reason == pb.STOP_REASON_COMPLETE
    loaded = destination.gather(ids, len(query))
    assert torch.equal(loaded[:, :, :32], kv[:, :, :32].to(LAYOUT.torch_dtype))  # not int4
    assert not loaded[:, :, 32:].any()
    # Holding the first chunk: only the second is copied.
    fresh = PagedKV(LAYOUT, 8, 16, Path(tempfile.mkdtemp(dir=shm)))
    fresh_id = sidecar.stub.RegisterBuffers(fresh.request(MODEL)).buffer_set_id
    chunks, finished = load(
        sidecar.stub,
        pb.LoadRequest(
            buffer_set_id=fresh_id, token_ids=query, destination=blocks(*ids), held_tokens=16
        ),
        timeout=60,
    )
    assert [(c.tokens.start, c.tokens.end) for c in chunks] == [(16, 32)]
    assert (finished.prefix_tokens, finished.compute_tokens) == (32, 3)
    assert not fresh.gather(ids, len(query))[:, :, :16].any()


@pytest.mark.slow
def test_a_query_that_extends_a_prompt_published_here_loads_the_rest_through_the_relay(
    sidecar: SidecarProcess, peer: SidecarProcess, shm: Path
) -> None:
    """This sidecar published a prompt's first two chunks, the peer the whole prompt: the
    lookup finds the peer's, longer, and a load takes the first two chunks from this
    sidecar's memory and only the other two through the relay."""
    from tests.support.sidecar import publish_whole, synthetic_kv

    def own() -> Path:
        return Path(tempfile.mkdtemp(dir=shm))

    longer = list(range(900, 964))  # 4 chunks of 16
    kv = synthetic_kv(LAYOUT, len(longer), seed=9)
    publish_whole(sidecar, MODEL, LAYOUT, kv[:, :, :32], longer[:32], own(), tracks=["fp16"])
    published = publish_whole(peer, MODEL, LAYOUT, kv, longer, own(), tracks=["fp16"])
    destination = ContiguousKV(LAYOUT, max_tokens=64, directory=own())
    set_id = sidecar.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
    found = sidecar.stub.Lookup(pb.LookupRequest(buffer_set_id=set_id, token_ids=longer))
    assert (found.available_tokens, found.prompt_id) == (64, published.prompt_id)
    fetched = sidecar.metric("kvmoq_loaded_chunks_total", track="fp16")
    request = pb.LoadRequest(buffer_set_id=set_id, token_ids=longer, destination=token_range(0, 64))
    chunks, finished = load(sidecar.stub, request, timeout=60)
    assert [c.tokens.start for c in chunks] == [0, 16, 32, 48]
    assert (spans(finished.loaded), finished.stop_reason) == ([(0, 64)], pb.STOP_REASON_COMPLETE)
    assert (finished.prompt_id, finished.available_tokens) == (published.prompt_id, 64)
    assert torch.equal(destination.get(0, 64), kv)
    assert sidecar.metric("kvmoq_loaded_chunks_total", track="fp16") == fetched + 2


def test_write_tokens_writes_only_the_tokens_with_slots(
    sidecar: SidecarProcess, contiguous: tuple[str, ContiguousKV], shm: Path
) -> None:
    """A GPU cache loaded in place has blocks for the tokens vLLM will not compute: the
    prompt's last tokens name its last chunk (its digest covers them) but are not written."""
    source_id, source = contiguous
    tokens = list(range(900, 940))  # chunks of 16: 16 + 16 + 8
    kv = torch.randn(LAYOUT.shape(len(tokens)), generator=torch.Generator().manual_seed(9))
    source.put(10, kv.to(LAYOUT.torch_dtype))
    sidecar.stub.Publish(
        pb.PublishRequest(buffer_set_id=source_id, token_ids=tokens, source=token_range(10, 50))
    )
    destination = PagedKV(LAYOUT, 8, 16, Path(tempfile.mkdtemp(dir=shm)))
    set_id = sidecar.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
    ids = [4, 9, 1, 12, 7]  # 36 tokens' slots: the last block half used

    def request(write_tokens: int, *block_ids: int, held: int = 0) -> pb.LoadRequest:
        return pb.LoadRequest(
            buffer_set_id=set_id, token_ids=tokens, destination=blocks(*block_ids),
            held_tokens=held, write_tokens=write_tokens,
        )  # fmt: skip

    chunks, finished = load(sidecar.stub, request(36, *ids), timeout=60)
    assert [(c.tokens.start, c.tokens.end) for c in chunks] == [(0, 16), (16, 32), (32, 36)]
    assert (spans(finished.loaded), finished.compute_tokens) == ([(0, 36)], 4)
    loaded = destination.gather(ids, 40)
    assert torch.equal(loaded[:, :, :36], kv[:, :, :36].to(LAYOUT.torch_dtype))
    assert not loaded[:, :, 36:].any()
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    refused(lambda: load(sidecar.stub, request(41, *ids, 2)), invalid, "write_tokens 41")
    refused(lambda: load(sidecar.stub, request(16, 4, 9, held=16)), invalid, "held_tokens 16")
    refused(lambda: load(sidecar.stub, request(36, *ids, 2)), invalid, "36 tokens need 5 blocks")
