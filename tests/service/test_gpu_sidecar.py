"""A real sidecar on a GPU node: a model server's paged CUDA cache registered over CUDA IPC,
a prompt published from its blocks and loaded into others in place, through a relay.

The orderings across the two processes are what matter: Publish returns once the sidecar
has read the blocks (the model server may then reuse them at once), and a chunk reported
loaded is complete on the GPU (the model server reads it with no synchronisation of its
own). Both caches' layouts are tried: FlashAttention's `[2, blocks, ...]` and FlashInfer's
`[blocks, 2, ...]`, which reaches the sidecar as a view with permuted strides.
"""

from __future__ import annotations

import pytest
import torch
from kvmoq_client.buffers import share_cuda_kv
from kvmoq_client.client import KVCacheClient
from kvmoq_client.requests import paged_blocks

from sidecar.moqt.aio.tls import CertificatePaths
from tests.support.relay import running_relay
from tests.support.sidecar import running_sidecar

pytestmark = pytest.mark.cuda

LAYERS, HEADS, HEAD_DIM, BLOCK = 4, 2, 64, 16
TOKENS = 1000  # 63 blocks, the last one partly used
BLOCKS = -(-TOKENS // BLOCK)
BUSY_CYCLES = 2_000_000_000


def cuda_caches(flashinfer: bool) -> list[torch.Tensor]:
    """Each layer's cache in the backend's own shape, as `[2, blocks, ...]` views."""
    shape = (2 * BLOCKS + 5, 2, BLOCK, HEADS, HEAD_DIM)
    if flashinfer:
        return [torch.zeros(shape, dtype=torch.float16, device="cuda").transpose(0, 1)
                for _ in range(LAYERS)]  # fmt: skip
    return [torch.zeros((2, *shape[:1], *shape[2:]), dtype=torch.float16, device="cuda")
            for _ in range(LAYERS)]  # fmt: skip


@pytest.mark.parametrize("flashinfer", [False, True], ids=["flash_attn", "flashinfer"])
def test_a_prompt_published_and_loaded_in_place(cert: CertificatePaths, flashinfer: bool) -> None:
    caches = cuda_caches(flashinfer)
    order = torch.randperm(2 * BLOCKS + 5, generator=torch.Generator().manual_seed(2)).tolist()
    source, target = order[:BLOCKS], order[BLOCKS : 2 * BLOCKS]
    for layer, cache in enumerate(caches):
        cache[:, source] = torch.randn(cache[:, source].shape, device="cuda").half() + layer
    expected = [cache[:, source].clone() for cache in caches]
    token_ids = list(range(5, 5 + TOKENS))
    buffers = share_cuda_kv(caches)
    with (
        running_relay(cert) as relay,
        running_sidecar(relay.url, cert, "--tracks", "fp16,int8") as p,
        running_sidecar(relay.url, cert, "--tracks", "fp16,int8") as d,
    ):
        p.wait_ready()
        d.wait_ready()
        with KVCacheClient(p.grpc, timeout=60) as to_p, KVCacheClient(d.grpc, timeout=60) as to_d:
            p_set = to_p.register_buffers(buffers.register_request("gpu-test"))
            torch.cuda.synchronize()  # the model server's writes, before it names the blocks
            to_p.publish(p_set, token_ids, paged_blocks(source), default_track="fp16")
            # The sidecar has read the blocks: the model server reuses them at once.
            for cache in caches:
                cache[:, source] = -1.0
            d_set = to_d.register_buffers(buffers.register_request("gpu-test"))
            # The GPU kept busy by this process meanwhile (about a second of one kernel, on
            # a stream of its own): the sidecar's copies wait for their time slice, and must
            # still be complete when the chunks are reported.
            with torch.cuda.stream(torch.cuda.Stream()):
                torch.cuda._sleep(BUSY_CYCLES)
            finished = to_d.load(d_set, token_ids, paged_blocks(target), tracks=["fp16"]).wait()
            # No synchronisation here: the chunks reported loaded are complete on the GPU.
            loaded = [cache[:, target].clone() for cache in caches]
            to_p.unregister_buffers(p_set)
            to_d.unregister_buffers(d_set)
    assert [(r.start, r.end) for r in finished.loaded] == [(0, TOKENS)]
    for got, want in zip(loaded, expected, strict=True):
        used = TOKENS - (BLOCKS - 1) * BLOCK  # tokens of the last block
        assert torch.equal(got[:, :-1], want[:, :-1])
        assert torch.equal(got[:, -1, :used], want[:, -1, :used])
