"""Run in `.venv-vllm` by test_connector.py: the connector's in-place path (a GPU cache the
sidecar maps) with CPU tensors shaped as FlashAttention's cache, in shared memory so two
real sidecars can map them as they map a CUDA cache over IPC.

The scheduler side publishes a prompt whose prefill is done and keeps the blocks of a
request that finishes while it is published; the worker side publishes from vLLM's own
blocks through sidecar P, says the blocks may be freed only once the sidecar has read them
and the request finished, and loads the prompt through sidecar D into other blocks, in
place; a load of a prompt nobody published reports every block failed.

    python in_place_check.py P_GRPC D_GRPC    prints one JSON line of findings
"""

from __future__ import annotations

import json
import logging
import sys
import time

import torch
from kvmoq_client.buffers import KVBuffers, allocate_shared_kv
from kvmoq_client.client import KVCacheClient
from kvmoq_client.v1 import kv_cache_pb2
from kvmoq_client.vllm.cache_layout import PagedBlockCopies, paged_kv_view
from kvmoq_client.vllm.jobs import LoadJob, SaveJob
from kvmoq_client.vllm.registration import Registration
from kvmoq_client.vllm.scheduler import SchedulerSide
from kvmoq_client.vllm.settings import ConnectorSettings
from kvmoq_client.vllm.worker import Staging, WorkerSide
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.request import Request

LAYERS, HEADS, HEAD_DIM, BLOCK, BLOCKS = 2, 2, 8, 16, 64
MODEL = "in-place-check"
PROMPT = 300  # 19 blocks, the last partly used
WAIT_S = 60.0


def caches() -> KVBuffers:
    """FlashAttention-shaped caches `[2, blocks, 16, heads, dim]` per layer, in shared memory."""
    buffers = allocate_shared_kv(
        LAYERS, HEADS, HEAD_DIM, torch.float16,
        kv_cache_pb2.PagedLayout(num_blocks=BLOCKS, block_size=BLOCK),
    )  # fmt: skip
    return buffers


def scheduler_output(request: Request, blocks: list[int]) -> SchedulerOutput:
    new = NewRequestData(
        req_id=request.request_id, prompt_token_ids=request.prompt_token_ids, mm_features=[],
        sampling_params=request.sampling_params, pooling_params=None, block_ids=(blocks,),
        num_computed_tokens=0, lora_request=None,
    )  # fmt: skip
    return SchedulerOutput(
        scheduled_new_reqs=[new],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens={request.request_id: PROMPT},
        total_num_scheduled_tokens=PROMPT,
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        num_common_prefix_blocks=[],
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
    )


def check_views() -> list[str]:
    """What `paged_kv_view` makes of each CUDA backend's cache shape."""
    flash_attn = torch.zeros(2, 7, BLOCK, HEADS, HEAD_DIM)
    flashinfer = torch.zeros(7, 2, BLOCK, HEADS, HEAD_DIM)
    seen = []
    for cache in (flash_attn, flashinfer):
        view = paged_kv_view(cache, BLOCK, HEADS, HEAD_DIM)
        same_memory = view.data_ptr() == cache.data_ptr() and view.shape == flash_attn.shape
        view[1, 3, 2] = 1.0  # V of token 2 in block 3
        placed = cache[1, 3, 2] if cache is flash_attn else cache[3, 1, 2]
        seen.append("view" if same_memory and bool(placed.all()) else "copy")
    for wrong in ((2, 2, BLOCK, HEADS, HEAD_DIM), (7, 2, BLOCK, HEADS + 1, HEAD_DIM)):
        try:
            paged_kv_view(torch.zeros(wrong), BLOCK, HEADS, HEAD_DIM)
            seen.append("accepted")
        except ValueError as exc:
            seen.append("2 blocks" if "2 blocks" in str(exc) else "neither")
    return seen


def until(condition, what: str):  # type: ignore[no-untyped-def]
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        if found := condition():
            return found
        time.sleep(0.02)
    raise SystemExit(f"in_place_check: gave up waiting for {what}")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    p_grpc, d_grpc = sys.argv[1:3]
    settings = ConnectorSettings(sidecar=p_grpc, tracks=("fp16",), default_track="fp16")
    findings: dict[str, object] = {}
    findings["views"] = check_views()
    token_ids = [1000 + 3 * i for i in range(PROMPT)]
    source = list(range(40, 40 + 19))[::-1]  # scattered: vLLM's blocks in any order
    target = list(range(3, 41, 2))

    # Scheduler: the prefill done in one step is published; its blocks outlive the request.
    lookups = allocate_shared_kv(
        LAYERS, HEADS, HEAD_DIM, torch.float16, kv_cache_pb2.ContiguousLayout(max_tokens=1)
    )
    scheduler = SchedulerSide(
        Registration(KVCacheClient(p_grpc), lookups, MODEL), BLOCK,
        loads=False, saves=True, keep_published_blocks=True,
    )  # fmt: skip
    published = Request("a", token_ids, SamplingParams(max_tokens=1), None)
    other = Request("b", token_ids[:50], SamplingParams(max_tokens=1), None)
    jobs = scheduler.step_jobs(scheduler_output(published, source))
    findings["save_jobs"] = [(job.request_id, job.block_ids == source) for job in jobs.saves]
    findings["finished_published_keeps_blocks"] = scheduler.finished(published)
    findings["finished_other_keeps_blocks"] = scheduler.finished(other)
    later = scheduler.step_jobs(scheduler_output(other, [0, 1, 2, 3]))
    findings["kept_next_step"] = later.kept

    # Worker at P: publish from vLLM's blocks in place; freed once read and finished.
    p_buffers = caches()
    for cache in p_buffers.tensors:
        cache[:, source] = torch.randn(cache[:, source].shape).half()
    expected = [cache[:, source].clone() for cache in p_buffers.tensors]
    p_registration = Registration(KVCacheClient(p_grpc), p_buffers, MODEL)
    p_worker = WorkerSide(settings, p_registration, BLOCK, None, keep_published_blocks=True)
    p_worker.save(jobs.saves)
    time.sleep(0.5)
    findings["freed_before_finished"] = sorted(p_worker.finished_saves())
    p_worker.save([], kept=later.kept)
    findings["freed_after_read"] = sorted(until(p_worker.finished_saves, "the publish"))
    for cache in p_buffers.tensors:
        cache[:, source] = -1.0  # vLLM reuses the freed blocks

    # Worker at D: load into other blocks in place; an unknown prompt fails every block.
    d_settings = ConnectorSettings(sidecar=d_grpc, tracks=("fp16",), load_deadline=30.0)
    d_buffers = caches()
    d_registration = Registration(KVCacheClient(d_grpc), d_buffers, MODEL)
    d_worker = WorkerSide(d_settings, d_registration, BLOCK, None, keep_published_blocks=True)
    # The scheduler side's Lookup comes first in vLLM.
    findings["ready_tokens"] = d_registration.call(
        lambda set_id: d_registration.client.lookup(set_id, token_ids)
    ).ready_tokens
    # Every token but the last (vLLM computes it): 18 blocks and 11 tokens of the 19th.
    d_worker.start_loads([LoadJob("c", token_ids, target[:19], 0, PROMPT - 1)])
    findings["loaded"] = sorted(until(lambda: d_worker.finished_loads(0.1), "the load"))
    findings["load_failed_blocks"] = sorted(d_worker.failed_blocks())
    tail = (PROMPT - 1) % BLOCK
    findings["exact"] = all(
        torch.equal(cache[:, target[:18]], want[:, :18])
        and torch.equal(cache[:, target[18], :tail], want[:, 18, :tail])
        and not cache[:, target[18], tail:].any()  # left for vLLM to compute
        for cache, want in zip(d_buffers.tensors, expected, strict=True)
    )
    unknown = [7, 9]
    d_worker.start_loads([LoadJob("d", [5] * 40, unknown, 0, 32)])
    until(lambda: d_worker.finished_loads(0.1), "the failed load")
    findings["unknown_failed_blocks"] = sorted(d_worker.failed_blocks()) == unknown

    # The fallback where the sidecar cannot map a GPU cache: vLLM's private cache (here on
    # the CPU) copied through staging; its blocks are read once copied there.
    staged_ids = [7 * i for i in range(PROMPT)]
    shape = (2, BLOCKS, BLOCK, HEADS, HEAD_DIM)
    sources = [torch.randn(shape).half() for _ in range(LAYERS)]
    targets = [torch.zeros(shape, dtype=torch.float16) for _ in range(LAYERS)]

    def staged(grpc: str, private: list[torch.Tensor]) -> WorkerSide:
        staging = caches()
        return WorkerSide(
            ConnectorSettings(sidecar=grpc, tracks=("fp16",), load_deadline=30.0),
            Registration(KVCacheClient(grpc), staging, MODEL), BLOCK,
            Staging(private, PagedBlockCopies(), staging.tensors), keep_published_blocks=True,
        )  # fmt: skip

    sp_worker, sd_worker = staged(p_grpc, sources), staged(d_grpc, targets)
    sp_worker.save([SaveJob("e", staged_ids, source)], kept=["e"])
    findings["staged_freed_once_copied"] = sorted(sp_worker.finished_saves())
    # The whole prompt published (a catalog still being revised lists fewer tokens).
    until(
        lambda: (
            d_registration.call(
                lambda set_id: d_registration.client.lookup(set_id, staged_ids)
            ).ready_tokens
            == PROMPT
        ),
        "the staged publish",
    )
    sd_worker.start_loads([LoadJob("f", staged_ids, target[:19], 0, PROMPT - 1)])
    until(lambda: sd_worker.finished_loads(0.1), "the staged load")
    findings["staged_failed_blocks"] = sorted(sd_worker.failed_blocks())
    findings["staged_exact"] = all(
        torch.equal(got[:, target[:18]], sent[:, source[:18]])
        and torch.equal(got[:, target[18], :tail], sent[:, source[18], :tail])
        for got, sent in zip(targets, sources, strict=True)
    )
    for closing in (sp_worker, sd_worker):
        closing.close()
    for closing in (p_worker, d_worker, scheduler):
        closing.close()
    print(json.dumps(findings))


if __name__ == "__main__":
    main()
