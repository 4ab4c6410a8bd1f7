"""`KVMoqConnector`: vLLM's KV connector API (`KVConnectorBase_V1`) on top of the sidecar.

vLLM makes one instance per role: the scheduler's (`SchedulerSide`: Lookup, and the books
of what to load and publish) and each worker's (`WorkerSide`: the copies, Load and
Publish); they talk only through the per-step `StepJobs` vLLM carries between them. This
class maps vLLM's calls onto those two and holds nothing else.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KVMoqConnector",
        "kv_connector_module_path": "kvmoq_client.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"sidecar": "unix:///run/kvmoq/sidecar.sock"}}'

`kv_role`: `kv_producer` publishes prompts once their prefill is done, `kv_consumer` loads
the longest prefix the sidecar can supply, `kv_both` does both. The extra config's keys are
`ConnectorSettings`'. Supported: one worker (no tensor or pipeline parallelism), vLLM's CPU
attention backend (through staging), FlashAttention's and FlashInfer's CUDA caches (in
place, over CUDA IPC), and a cache dtype of the model's own (float16, bfloat16, float32).
"""

from __future__ import annotations

import logging
import math
import re
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from kvmoq_client.buffers import allocate_shared_kv, share_cuda_kv
from kvmoq_client.client import KVCacheClient
from kvmoq_client.errors import FailedPrecondition, InvalidArgument, SidecarError
from kvmoq_client.v1 import kv_cache_pb2
from kvmoq_client.vllm.cache_layout import (
    BlockCopies,
    BlockLayout,
    PagedBlockCopies,
    paged_kv_view,
)
from kvmoq_client.vllm.jobs import StepJobs
from kvmoq_client.vllm.registration import Registration
from kvmoq_client.vllm.scheduler import SchedulerSide
from kvmoq_client.vllm.settings import ConnectorSettings
from kvmoq_client.vllm.worker import Staging, WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 120.0
"""Publish answers once the default track is encoded: seconds for a long prompt."""
IDLE_STEP_WAIT_S = 0.01
"""Longest a step with nothing to compute waits for a load to end (`StepJobs.idle`); an
ending load wakes it at once, so a load is noticed no later than without the wait."""


class KVMoqConnector(KVConnectorBase_V1):
    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = self._kv_transfer_config
        self._settings = ConnectorSettings.from_extra_config(transfer.kv_connector_extra_config)
        _check_supported(vllm_config)
        model_config = vllm_config.model_config
        self._model = self._settings.model or _served_name(model_config.served_model_name)
        self._block_size = vllm_config.cache_config.block_size
        self._dtype = _cache_dtype(vllm_config)
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            parallel = vllm_config.parallel_config
            # The scheduler holds no KV: its buffer set is one token, for Lookup only.
            buffers = allocate_shared_kv(
                model_config.get_num_layers(parallel), model_config.get_num_kv_heads(parallel),
                model_config.get_head_size(), self._dtype,
                kv_cache_pb2.ContiguousLayout(max_tokens=1),
            )  # fmt: skip
            client = KVCacheClient(self._settings.sidecar, timeout=self._settings.lookup_timeout)
            self._scheduler = SchedulerSide(
                Registration(client, buffers, self._model), self._block_size,
                loads=transfer.is_kv_consumer, saves=transfer.is_kv_producer,
                keep_published_blocks=_on_gpu(vllm_config),
            )  # fmt: skip

    # Scheduler side ---------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._scheduling().matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._scheduling().allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._scheduling().step_jobs(scheduler_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduling().finished(request), None

    def _scheduling(self) -> SchedulerSide:
        assert self._scheduler is not None, "a scheduler-side call on a worker's connector"
        return self._scheduler

    # Worker side ------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        caches = [kv_caches[name] for name in sorted(kv_caches, key=_layer_index)]
        if caches[0].device.type == "cuda":
            self._worker = self._in_place(caches)
        else:
            self._worker = self._staged(caches)

    def _in_place(self, caches: list[torch.Tensor]) -> WorkerSide:
        """A GPU cache: the sidecar maps every layer's blocks over CUDA IPC and reads and
        writes them in place; where it cannot (another GPU, a container without IPC), the
        blocks go through shared-memory staging, said here once."""
        model = self._vllm_config.model_config
        parallel = self._vllm_config.parallel_config
        views = [
            paged_kv_view(
                cache, self._block_size, model.get_num_kv_heads(parallel), model.get_head_size()
            )
            for cache in caches
        ]
        client = KVCacheClient(self._settings.sidecar, timeout=PUBLISH_TIMEOUT_S)
        registration = Registration(client, share_cuda_kv(views), self._model)
        try:
            registration.call(lambda set_id: set_id)
        except (InvalidArgument, FailedPrecondition) as exc:
            log.warning("kvmoq: the sidecar cannot map vLLM's CUDA cache (%s); loads and"
                        " publishes copy through shared-memory staging", exc)  # fmt: skip
            registration.close()
            _, _, block_size, heads, head_size = views[0].shape
            return self._with_staging(views, PagedBlockCopies(), heads, head_size, block_size)
        except SidecarError:
            pass  # not up yet: the registration is made on first use
        log.info("kvmoq: vLLM's %s CUDA cache, %d blocks of %d, shared in place over CUDA IPC",
                 views[0].dtype, views[0].shape[1], self._block_size)  # fmt: skip
        return WorkerSide(
            self._settings, registration, self._block_size, None, keep_published_blocks=True
        )

    def _staged(self, caches: list[torch.Tensor]) -> WorkerSide:
        """vLLM's CPU attention backend: copies through shared-memory staging."""
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        first = caches[0]
        if first.device.type != "cpu" or first.dim() != 4:
            raise ValueError(
                "kvmoq connector: a cache of vLLM's CPU attention backend, FlashAttention or"
                f" FlashInfer is supported, not one of {tuple(first.shape)} on {first.device}"
            )
        _, heads, block_size, double_head = first.shape
        cache_dtype = self._vllm_config.cache_config.cache_dtype
        isa = _get_attn_isa(first.dtype, block_size, double_head // 2, cache_dtype)
        layout = BlockLayout.probe(first, isa, cache_dtype)
        log.info("kvmoq: vLLM's %s cache blocks (ISA %s) copied by the %s path",
                 first.dtype, isa, layout.path)  # fmt: skip
        return self._with_staging(caches, layout, heads, double_head // 2, block_size)

    def _with_staging(
        self,
        caches: list[torch.Tensor],
        copies: BlockCopies,
        heads: int,
        head_size: int,
        block_size: int,
    ) -> WorkerSide:
        """Loads and publishes through a shared-memory staging area of vLLM's blocks."""
        blocks = math.ceil(self._settings.staging_tokens / block_size)
        staging = allocate_shared_kv(
            len(caches), heads, head_size, caches[0].dtype,
            kv_cache_pb2.PagedLayout(num_blocks=blocks, block_size=block_size),
        )  # fmt: skip
        client = KVCacheClient(self._settings.sidecar, timeout=PUBLISH_TIMEOUT_S)
        registration = Registration(client, staging, self._model)
        on_gpu = _on_gpu(self._vllm_config)
        return WorkerSide(
            self._settings, registration, block_size,
            Staging(caches, copies, staging.tensors),
            keep_published_blocks=on_gpu, measures_compute=not on_gpu,
        )  # fmt: skip

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """vLLM binds each step's jobs before its forward, and calls `start_load_kv` before
        or after it (after, for asynchronous loads), then `wait_for_save`: the forward is
        timed from here to there."""
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, StepJobs):
            self._worker.step_started(connector_metadata.computed_tokens)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        jobs = self._step_jobs()
        if jobs is not None:
            self._working().start_loads(jobs.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: a loading request is not in any forward

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return  # whole prompts are copied after the forward, in wait_for_save

    def wait_for_save(self) -> None:
        if self._worker is not None:
            self._worker.step_ended()
        jobs = self._step_jobs()
        if jobs is not None:
            self._working().save(jobs.saves, jobs.kept)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is None:
            return None, None
        jobs = self._step_jobs()
        wait = IDLE_STEP_WAIT_S if jobs is not None and jobs.idle else 0.0
        loads = self._worker.finished_loads(wait)
        return self._worker.finished_saves() or None, loads or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set() if self._worker is None else self._worker.failed_blocks()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._scheduler is not None:
            self._scheduler.close()

    def _step_jobs(self) -> StepJobs | None:
        if not self.has_connector_metadata():
            return None
        jobs = self._get_connector_metadata()
        assert isinstance(jobs, StepJobs)
        return jobs

    def _working(self) -> WorkerSide:
        assert self._worker is not None, "register_kv_caches was not called"
        return self._worker


def _on_gpu(config: VllmConfig) -> bool:
    """Whether vLLM's cache is on a GPU, where a published request's blocks are kept past
    its end until read (in place, or into staging): the rule both sides follow."""
    return config.device_config.device_type == "cuda"


def _check_supported(config: VllmConfig) -> None:
    parallel = config.parallel_config
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        raise ValueError("kvmoq connector: tensor and pipeline parallelism are not supported yet")


def _cache_dtype(config: VllmConfig) -> torch.dtype:
    if config.cache_config.cache_dtype != "auto":
        raise ValueError(
            f"kvmoq connector: cache dtype {config.cache_config.cache_dtype!r} is not supported;"
            " use the model's own (--kv-cache-dtype auto)"
        )
    dtype = config.model_config.dtype
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"kvmoq connector: a KV cache of {dtype} is not supported")
    return dtype


def _served_name(name: str | list[str] | None) -> str:
    if isinstance(name, list):
        return name[0]
    return name or ""


def _layer_index(name: str) -> int:
    """vLLM's layer names (`model.layers.12.self_attn.attn`) in model order."""
    numbers = re.findall(r"\.(\d+)\.", name)
    if not numbers:
        raise ValueError(f"kvmoq connector: no layer number in {name!r}")
    return int(numbers[0])
