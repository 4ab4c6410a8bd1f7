"""Two sidecar processes and a relay process: one model server publishes the KV held in its
shared-memory buffers, another looks it up and loads it into its own, paged, buffers."""

from __future__ import annotations

import time
from pathlib import Path
from tempfile import mkdtemp

import grpc
import pytest
import torch
from google.protobuf.timestamp_pb2 import Timestamp
from kvmoq_client.v1 import kv_cache_pb2 as pb

from sidecar.cli import main as kvmoq
from sidecar.kvcache.layout import KVLayout
from sidecar.models.kv_store import PromptKV
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.transfer.adapt import DEFAULT_PRIOR_BYTES_PER_SECOND
from sidecar.transfer.track_quality import DEFAULT_MAX_KL, MEASURED
from tests.support.relay import DEFAULTS, RelayProcess, running_relay
from tests.support.sidecar import (
    CHUNK,
    LAYOUT,
    MODEL,
    ContiguousKV,
    PagedKV,
    load,
    publish_whole,
    running_sidecar,
    shm_directory,
    spans,
    synthetic_kv,
)


@pytest.mark.slow
def test_a_draft_14_sidecar_publishes_and_a_draft_18_one_loads_through_one_relay(
    cert: CertificatePaths,
) -> None:
    """One relay (as users run it, speaking every draft) carries the KV between a sidecar
    held to draft 14 and one on its defaults, which takes the newest (18); every element
    loaded is the one published."""
    prompt = list(range(2000, 2050))
    kv = synthetic_kv(LAYOUT, len(prompt))
    flags = ("--chunk-size", str(CHUNK))
    with (
        running_relay(cert, backend=DEFAULTS) as relay,
        shm_directory() as shm,
        running_sidecar(relay.url, cert, *flags, "--drafts", "14", datagram_size=None) as old,
        running_sidecar(relay.url, cert, *flags, datagram_size=None) as new,
    ):
        old.wait_ready()
        new.wait_ready()
        assert old.wait_log("relay_connected")["draft"] == 14
        assert new.wait_log("relay_connected")["draft"] == 18
        published = publish_whole(old, MODEL, LAYOUT, kv, prompt, shm, ["fp16"], "fp16")
        destination = ContiguousKV(LAYOUT, max_tokens=len(prompt), directory=shm)
        set_id = new.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
        found = new.stub.Lookup(pb.LookupRequest(buffer_set_id=set_id, token_ids=prompt))
        assert (found.prompt_id, found.available_tokens) == (published.prompt_id, len(prompt))
        every_token = pb.KVLocation(token_range=pb.TokenRange(start=0, end=len(prompt)))
        request = pb.LoadRequest(buffer_set_id=set_id, token_ids=prompt, destination=every_token)
        _, finished = load(new.stub, request, timeout=60)
        assert finished.stop_reason == pb.STOP_REASON_COMPLETE
        assert spans(finished.loaded) == [(0, len(prompt))]
        assert torch.equal(destination.get(0, len(prompt)), kv)  # fp16 on float16: lossless


@pytest.mark.slow
@pytest.mark.parametrize("relay", ["aioquic", DEFAULTS], indirect=True)
def test_kv_published_by_one_sidecar_loads_bit_exact_through_another(
    relay: RelayProcess, cert: CertificatePaths, request: pytest.FixtureRequest
) -> None:
    """On loopback-size packets, and as users run the relay and sidecars: no flags but
    where the relay is."""
    prompt = list(range(1000, 1050))  # 3 whole chunks of 16 and a partial one
    query = [*prompt, *range(7, 27)]  # shares the prompt's first 3 chunks (48 tokens)
    kv = synthetic_kv(LAYOUT, len(prompt))
    flags = ("--chunk-size", str(CHUNK))
    size = None if request.node.callspec.params["relay"] == DEFAULTS else 16384
    with (
        shm_directory() as shm,
        running_sidecar(relay.url, cert, *flags, datagram_size=size) as prefill,
        running_sidecar(relay.url, cert, *flags, datagram_size=size) as decode,
    ):
        prefill.wait_ready()
        decode.wait_ready()
        source = ContiguousKV(LAYOUT, max_tokens=64, directory=shm)
        source.put(5, kv)
        source_id = prefill.stub.RegisterBuffers(source.request(MODEL)).buffer_set_id
        published = prefill.stub.Publish(
            pb.PublishRequest(
                buffer_set_id=source_id,
                token_ids=prompt,
                source=pb.KVLocation(token_range=pb.TokenRange(start=5, end=55)),
                tracks=["fp16", "int8"],
                default_track="fp16",
            ),
            metadata=(("x-request-id", "publish-1"),),
        )
        assert published.chunks == 4
        assert list(published.namespace) == ["kvcache.moq.arpa/v1", MODEL, published.prompt_id]

        destination = PagedKV(LAYOUT, block_size=8, num_blocks=16, directory=shm)
        destination_id = decode.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
        found = decode.stub.Lookup(pb.LookupRequest(buffer_set_id=destination_id, token_ids=prompt))
        assert (found.available_tokens, found.ready_tokens) == (50, 50)
        assert (found.prompt_id, found.relay_url) == (published.prompt_id, relay.url)
        assert found.estimated_seconds > 0

        # The query extends the prompt: its first three chunks are the prompt's (the lookup
        # taught the sidecar the prompt's chunk hashes), the rest must be computed.

        blocks = [9, 2, 14, 0, 5, 11, 7, 3, 12]  # 70 tokens in blocks of 8
        chunks, finished = load(
            decode.stub,
            pb.LoadRequest(
                buffer_set_id=destination_id,
                token_ids=query,
                destination=pb.KVLocation(blocks=pb.BlockList(block_ids=blocks)),
                tracks=["fp16"],
            ),
            timeout=60,
        )
        assert [(c.tokens.start, c.tokens.end) for c in chunks] == [(0, 16), (16, 32), (32, 48)]
        assert spans(finished.loaded) == [(0, 48)]
        assert (finished.prefix_tokens, finished.compute_tokens) == (48, 22)
        assert finished.stop_reason == pb.STOP_REASON_COMPLETE
        assert not finished.rejected
        assert finished.prompt_id == published.prompt_id
        assert dict(finished.track_bytes).keys() == {"fp16"}

        loaded = destination.gather(blocks, len(query))
        assert torch.equal(loaded[:, :, :48], kv[:, :, :48])  # fp16 on float16: lossless
        assert not loaded[:, :, 48:].any(), "tokens past the loaded prefix were written"
        unused = sorted(set(range(16)) - set(blocks))
        assert not any(destination.keys[0][b].any() for b in unused)

        assert prefill.metric("kvmoq_published_chunks_total", track="fp16") == 4
        assert decode.metric("kvmoq_loaded_chunks_total", track="fp16") == 3
        assert decode.metric("kvmoq_loaded_bytes_total", track="fp16") == sum(
            finished.track_bytes.values()
        )
        assert decode.metric("kvmoq_cache_lookups_total", result="hit") == 2
        published_lines = [e for e in prefill.logs() if e.get("request_id") == "publish-1"]
        assert {"prompt_published"} <= {e["event"] for e in published_lines}

        # A model server that holds the first 20 tokens itself (its own prefix cache): the
        # load starts at the chunk that holds token 20 and leaves the first chunk untouched.
        def load_holding(held: int) -> tuple[list[pb.ChunkLoaded], pb.LoadFinished, torch.Tensor]:
            """A load into fresh buffers: what it reported and what it wrote."""
            fresh = PagedKV(LAYOUT, block_size=8, num_blocks=16, directory=Path(mkdtemp(dir=shm)))
            set_id = decode.stub.RegisterBuffers(fresh.request(MODEL)).buffer_set_id
            every_block = pb.KVLocation(blocks=pb.BlockList(block_ids=list(range(9))))
            request = pb.LoadRequest(
                buffer_set_id=set_id, token_ids=query, destination=every_block, held_tokens=held
            )
            chunks, finished = load(decode.stub, request, timeout=60)
            return chunks, finished, fresh.gather(list(range(9)), len(query))

        chunks, finished, written = load_holding(20)
        assert [(c.tokens.start, c.tokens.end) for c in chunks] == [(16, 32), (32, 48)]
        assert spans(finished.loaded) == [(16, 48)]
        assert (finished.prefix_tokens, finished.compute_tokens) == (48, 22)
        assert torch.equal(written[:, :, 16:48], kv[:, :, 16:48])
        assert not written[:, :, :16].any() and not written[:, :, 48:].any()
        assert decode.metric("kvmoq_loaded_chunks_total", track="fp16") == 5
        # Holding more than the relay has: nothing to fetch, and the held tokens still count.
        chunks, finished, written = load_holding(60)
        assert (chunks, spans(finished.loaded), written.any().item()) == ([], [], False)
        assert (finished.prefix_tokens, finished.compute_tokens) == (60, 10)
        assert finished.stop_reason == pb.STOP_REASON_COMPLETE
        with pytest.raises(grpc.RpcError) as refused:
            load_holding(len(query))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "held_tokens" in (refused.value.details() or "")


@pytest.mark.slow
def test_lookup_estimates_the_bytes_of_the_tracks_a_load_takes(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    """No fp16 on offer: the estimate is int8's bytes (the catalog's), which the deadline
    rule takes, at the prior throughput of a sidecar that has loaded nothing yet. Then what a
    request bounds a load's choice by: its quality floor, and the model server's compute
    rate."""
    prompt = list(range(2000, 2050))
    kv = synthetic_kv(LAYOUT, len(prompt), seed=1)
    flags = ("--chunk-size", str(CHUNK))
    with (
        shm_directory() as shm,
        shm_directory() as own,  # buffer files are named per layer: one directory a buffer
        running_sidecar(relay.url, cert, *flags) as prefill,
        running_sidecar(relay.url, cert, *flags) as decode,
    ):
        prefill.wait_ready()
        decode.wait_ready()
        publish_whole(
            prefill, MODEL, LAYOUT, kv, prompt, shm, tracks=["int8", "int4"], default_track="int8"
        )
        every_token = pb.KVLocation(token_range=pb.TokenRange(start=0, end=len(prompt)))
        destination = ContiguousKV(LAYOUT, max_tokens=64, directory=own)
        destination_id = decode.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
        found = decode.stub.Lookup(pb.LookupRequest(buffer_set_id=destination_id, token_ids=prompt))
        _, finished = load(
            decode.stub,
            pb.LoadRequest(buffer_set_id=destination_id, token_ids=prompt, destination=every_token),
            timeout=60,
        )
        assert finished.stop_reason == pb.STOP_REASON_COMPLETE
        int8_bytes = dict(finished.track_bytes)["int8"]
        assert dict(finished.track_bytes) == {"int8": int8_bytes}
        prior = DEFAULT_PRIOR_BYTES_PER_SECOND
        assert found.estimated_seconds == pytest.approx(int8_bytes / prior)
        assert found.estimated_seconds < 0.6 * len(prompt) * LAYOUT.fp16_bytes_per_token / prior
        # The sidecar's default quality floor, kept and reported with what the KV costs.
        assert finished.max_kl == DEFAULT_MAX_KL
        assert finished.expected_kl == MEASURED["int8"].alone

        # int4 alone is outside the default floor: refused, with the measured figures.
        int4_only = pb.LoadRequest(
            buffer_set_id=destination_id, token_ids=prompt, destination=every_token, tracks=["int4"]
        )
        with pytest.raises(grpc.RpcError) as refused:
            load(decode.stub, int4_only, timeout=60)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no track of ['int4'] is within max_kl 0.001" in str(refused.value.details())
        # Within 0.01 int4 takes every chunk but the most recent, which is left to compute.
        int4_only.max_kl = 0.01
        _, looser = load(decode.stub, int4_only, timeout=60)
        assert looser.stop_reason == pb.STOP_REASON_QUALITY_FLOOR
        assert spans(looser.loaded) == [(0, 3 * CHUNK)]
        assert looser.compute_tokens == len(prompt) - 3 * CHUNK
        assert (looser.max_kl, looser.expected_kl) == (0.01, MEASURED["int4"].served)
        for bad in (-1.0, float("nan")):
            with pytest.raises(grpc.RpcError) as refused:
                decode.stub.Lookup(
                    pb.LookupRequest(buffer_set_id=destination_id, token_ids=prompt, max_kl=bad)
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        # A model server that computes faster than the link brings a chunk gets none of it.
        every_track = pb.LoadRequest(
            buffer_set_id=destination_id, token_ids=prompt, destination=every_token,
            compute_tokens_per_second=1e15,
        )  # fmt: skip
        _, faster = load(decode.stub, every_track, timeout=60)
        assert faster.stop_reason == pb.STOP_REASON_COMPUTE_FASTER
        assert not faster.loaded and faster.compute_tokens == len(prompt)
        for bad in (-1.0, float("nan"), float("inf")):
            every_track.compute_tokens_per_second = bad
            with pytest.raises(grpc.RpcError) as refused:
                load(decode.stub, every_track, timeout=60)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "compute_tokens_per_second" in str(refused.value.details())
        assert decode.process.poll() is None and decode.get("/readyz")[0] == 200  # still up


@pytest.mark.slow
def test_decoders_load_only_catalogs_signed_by_a_trusted_key(
    relay: RelayProcess, cert: CertificatePaths, tmp_path: Path
) -> None:
    """--catalog-key signs what a prefill sidecar publishes; a decoder with --trusted-keys
    holding its public half loads it, one trusting another key finds nothing and counts the
    refusal in kvmoq_catalog_refusals."""
    keys = {name: (tmp_path / f"{name}.jwk", tmp_path / f"{name}.pub.jwk") for name in "ab"}
    for private, public in keys.values():
        assert kvmoq(["token", "generate", "--key", str(private), "--algorithm", "EdDSA",
                      "--public", str(public)]) == 0  # fmt: skip
    prompt = list(range(3000, 3040))
    kv = synthetic_kv(LAYOUT, len(prompt), seed=2)
    flags = ("--chunk-size", str(CHUNK))
    with (
        shm_directory() as shm,
        shm_directory() as own,
        running_sidecar(relay.url, cert, *flags, "--catalog-key", str(keys["a"][0])) as prefill,
        running_sidecar(relay.url, cert, *flags, "--trusted-keys", str(keys["a"][1])) as trusting,
        running_sidecar(relay.url, cert, *flags, "--trusted-keys", str(keys["b"][1])) as other,
    ):
        for sidecar in (prefill, trusting, other):
            sidecar.wait_ready()
        publish_whole(prefill, MODEL, LAYOUT, kv, prompt, shm, tracks=["fp16"])
        every_token = pb.KVLocation(token_range=pb.TokenRange(start=0, end=len(prompt)))
        destination = ContiguousKV(LAYOUT, max_tokens=len(prompt), directory=own)
        results = {}
        for name, decode in (("trusting", trusting), ("other", other)):
            set_id = decode.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
            request = pb.LoadRequest(
                buffer_set_id=set_id, token_ids=prompt, destination=every_token
            )
            results[name] = load(decode.stub, request, timeout=60)[1]
            if name == "trusting":
                assert torch.equal(destination.get(0, len(prompt)), kv)
        assert results["trusting"].stop_reason == pb.STOP_REASON_COMPLETE
        assert results["other"].stop_reason == pb.STOP_REASON_NOT_FOUND
        assert spans(results["other"].loaded) == []
        assert other.metric("kvmoq_catalog_refusals_total", reason="unknown_key") >= 1
        assert trusting.metric("kvmoq_catalog_refusals_total", reason="unknown_key") == 0


@pytest.mark.slow
@pytest.mark.model
def test_real_smollm2_kv_loads_bit_exact_into_vllm_style_blocks(
    relay: RelayProcess, cert: CertificatePaths, pydoc_kv: PromptKV
) -> None:
    """The 4096-token pydoc prompt's KV of SmolLM2-135M, as a model server keeps it (fp16),
    from contiguous buffers to 16-token paged blocks in reverse order."""
    kv = pydoc_kv.kv.to(torch.float16)
    layout = KVLayout(kv.shape[0], kv.shape[3], kv.shape[4], "float16")
    tokens = list(pydoc_kv.token_ids)
    block_ids = list(reversed(range(len(tokens) // 16)))
    with (
        shm_directory() as shm,
        running_sidecar(relay.url, cert) as prefill,
        running_sidecar(relay.url, cert) as decode,
    ):
        prefill.wait_ready()
        decode.wait_ready()
        source = ContiguousKV(layout, max_tokens=len(tokens), directory=shm)
        source.put(0, kv)
        source_id = prefill.stub.RegisterBuffers(source.request(MODEL)).buffer_set_id
        prefill.stub.Publish(
            pb.PublishRequest(
                buffer_set_id=source_id,
                token_ids=tokens,
                source=pb.KVLocation(token_range=pb.TokenRange(start=0, end=len(tokens))),
                tracks=["fp16"],
            ),
            timeout=120,
        )
        destination = PagedKV(layout, block_size=16, num_blocks=len(block_ids), directory=shm)
        destination_id = decode.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
        _, finished = load(
            decode.stub,
            pb.LoadRequest(
                buffer_set_id=destination_id,
                token_ids=tokens,
                destination=pb.KVLocation(blocks=pb.BlockList(block_ids=block_ids)),
                deadline=_in_seconds(120),
            ),
            timeout=180,
        )
        assert finished.stop_reason == pb.STOP_REASON_COMPLETE
        assert spans(finished.loaded) == [(0, len(tokens))]
        assert finished.compute_tokens == 0
        assert torch.equal(destination.gather(block_ids, len(tokens)), kv)


def _in_seconds(seconds: float) -> Timestamp:
    deadline = Timestamp()
    deadline.FromNanoseconds(time.time_ns() + int(seconds * 1e9))
    return deadline
