"""The connector's worker side: the Load and Publish calls for vLLM's KV cache.

On a GPU the sidecar maps vLLM's cache itself (CUDA IPC) and reads and writes its blocks in
place. On a CPU node vLLM keeps its cache in the worker's private memory, which the sidecar
cannot map, so every transfer goes through a shared-memory staging area: one copy each way
(`Staging`). Loads run in a thread pool, so the engine keeps stepping while a load is under
way; a block is handed to vLLM only once the sidecar reported its tokens written and
verified, and every other block of the load is reported as failed, for vLLM to recompute.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from kvmoq_client.errors import SidecarError
from kvmoq_client.requests import paged_blocks
from kvmoq_client.v1 import kv_cache_pb2
from kvmoq_client.vllm.blocks import loaded_blocks
from kvmoq_client.vllm.cache_layout import BlockCopies
from kvmoq_client.vllm.compute_rate import ComputeRate
from kvmoq_client.vllm.jobs import LoadJob, SaveJob
from kvmoq_client.vllm.registration import Registration
from kvmoq_client.vllm.settings import ConnectorSettings

log = logging.getLogger(__name__)

TRANSFER_THREADS = 4
"""Loads and publishes under way at once; more wait for a thread."""


class StagingBlocks:
    """Which blocks of the staging area are free; a transfer takes what it needs at once."""

    def __init__(self, count: int) -> None:
        self._free = list(range(count))
        self._lock = threading.Lock()

    def take(self, count: int) -> list[int] | None:
        with self._lock:
            if count > len(self._free):
                return None
            taken, self._free = self._free[:count], self._free[count:]
            return taken

    def give(self, blocks: Sequence[int]) -> None:
        with self._lock:
            self._free += blocks


class Staging:
    """vLLM's cache and the shared staging area the sidecar maps, block by block: every load
    and publish goes through it, one copy each way (`BlockCopies`: vLLM's CPU layout as
    probed, or a GPU cache the sidecar cannot map)."""

    def __init__(
        self, caches: list[torch.Tensor], copies: BlockCopies, staging: list[torch.Tensor]
    ) -> None:
        self._caches = caches
        self._copies = copies
        self._staging = staging  # per layer [2, blocks, size, H, D]
        self.free = StagingBlocks(staging[0].shape[1])

    def to_cache(self, staged: Sequence[int], blocks: Sequence[int]) -> None:
        """Staging blocks `staged` into vLLM's blocks `blocks` (a load's, once verified)."""
        source, target = torch.tensor(staged), torch.tensor(blocks)
        for cache, buffer in zip(self._caches, self._staging, strict=True):
            kv = buffer[:, source].reshape(2, -1, *buffer.shape[3:])
            self._copies.write(cache, target, kv)

    def from_cache(self, blocks: Sequence[int], staged: Sequence[int]) -> None:
        """vLLM's blocks `blocks` into staging blocks `staged` (a prompt to publish)."""
        source, target = torch.tensor(blocks), torch.tensor(staged)
        for cache, buffer in zip(self._caches, self._staging, strict=True):
            kv = self._copies.read(cache, source)
            buffer[:, target] = kv.view(2, len(staged), *buffer.shape[2:])


class WorkerSide:
    """Loads and publishes for one worker: through `staging` (a CPU cache), or, without it,
    in place in vLLM's blocks, which the registration's buffers then are (a GPU cache the
    sidecar maps over CUDA IPC). With `keep_published_blocks` (vLLM on a GPU: the scheduler
    side keeps a published request's blocks past its end), the requests whose blocks were
    read are reported in `finished_saves`. With `measures_compute` (vLLM on a CPU, whose
    forward runs between the steps' hooks), the engine's prefill rate is measured and
    sent with every load, unless the settings fix one."""

    def __init__(
        self,
        settings: ConnectorSettings,
        registration: Registration,
        block_size: int,
        staging: Staging | None,
        *,
        keep_published_blocks: bool = False,
        measures_compute: bool = False,
    ) -> None:
        self._settings = settings
        self._registration = registration
        self._block_size = block_size
        self._staging = staging
        self._pool = ThreadPoolExecutor(TRANSFER_THREADS, thread_name_prefix="kvmoq")
        self._lock = threading.Condition()
        self._loading = 0
        self._loaded: set[str] = set()
        self._failed_blocks: set[int] = set()
        self._keep_published_blocks = keep_published_blocks
        self._read: set[str] = set()
        """Published requests whose blocks were read (in place by the sidecar, or into
        staging), kept only with `keep_published_blocks`."""
        self._kept: set[str] = set()
        """Finished requests whose blocks vLLM keeps until they are read."""
        self._compute = ComputeRate() if measures_compute else None

    # Steps ------------------------------------------------------------------------------

    def step_started(self, computed_tokens: int) -> None:
        """A step whose forward computes `computed_tokens` tokens is about to run it."""
        if self._compute is not None:
            self._compute.step_started(computed_tokens, time.perf_counter())

    def step_ended(self) -> None:
        """The forward of the step last started is done."""
        if self._compute is not None:
            self._compute.step_ended(time.perf_counter())

    def compute_rate(self) -> float | None:
        """The prefill rate loads send the sidecar: the settings' (0: none), else the one
        measured, if any."""
        fixed = self._settings.compute_rate
        if fixed is not None:
            return float(fixed) or None
        return None if self._compute is None else self._compute.tokens_per_second

    # Loads ------------------------------------------------------------------------------

    def start_loads(self, jobs: Sequence[LoadJob]) -> None:
        for job in jobs:
            with self._lock:
                self._loading += 1
            self._pool.submit(self._load, job)

    def _load(self, job: LoadJob) -> None:
        landed: list[int] = []
        staged: list[int] | None = None
        try:
            if self._staging is None:
                landed = self._load_into(job, job.block_ids)
            else:
                staged = self._staging.free.take(-(-len(job.token_ids) // self._block_size))
                if staged is None:
                    log.warning(
                        "kvmoq staging full: request %s computes its prompt", job.request_id
                    )
                else:
                    landed = self._load_into(job, staged)
        except SidecarError as exc:
            log.warning("kvmoq load of request %s failed: %s", job.request_id, exc)
        except Exception:
            log.exception("kvmoq load of request %s failed", job.request_id)
        finally:
            if staged is not None and self._staging is not None:
                self._staging.free.give(staged)
            failed = set(job.block_ids[job.first_block :]) - set(landed)
            with self._lock:
                self._failed_blocks |= failed
                self._loaded.add(job.request_id)
                self._loading -= 1
                self._lock.notify_all()

    def _load_into(self, job: LoadJob, blocks: list[int]) -> list[int]:
        """The vLLM blocks written: those whose every token of the job the sidecar reported
        loaded. `blocks` are staging blocks for every token, or vLLM's own (in place), where
        only the job's tokens are written: the ones after them name the prompt's last chunk,
        and vLLM computes them."""
        size = self._block_size
        writable = len(job.token_ids) if self._staging is not None else job.tokens

        def load(set_id: str) -> kv_cache_pb2.LoadFinished:
            client = self._registration.client
            return client.load(
                set_id, job.token_ids, paged_blocks(blocks),
                tracks=job.tracks or self._settings.tracks,
                deadline=min(job.deadline or math.inf, self._settings.load_deadline),
                held_tokens=job.first_block * size, write_tokens=writable,
                max_kl=job.max_kl or self._settings.max_kl,
                compute_tokens_per_second=self.compute_rate(),
            ).wait()  # fmt: skip

        finished = self._registration.call(load)
        whole = loaded_blocks(
            finished.loaded, job.first_block, len(job.block_ids), job.tokens, size
        )
        if whole and self._staging is not None:
            self._staging.to_cache([blocks[i] for i in whole], [job.block_ids[i] for i in whole])
        return [job.block_ids[i] for i in whole]

    def finished_loads(self, wait: float = 0.0) -> set[str]:
        """Requests whose load ended since the last call; with `wait`, up to that many
        seconds for one to end while loads are in flight and none has."""
        with self._lock:
            if wait > 0:
                self._lock.wait_for(lambda: self._loaded or not self._loading, wait)
            done, self._loaded = self._loaded, set()
        return done

    def failed_blocks(self) -> set[int]:
        with self._lock:
            failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    # Publishes --------------------------------------------------------------------------

    def save(self, jobs: Sequence[SaveJob], kept: Sequence[str] = ()) -> None:
        """Publish each prompt in the background. Through staging, its blocks are copied
        there first (vLLM may reuse them after this step); in place, vLLM's writes to them are
        finished first and the sidecar reads them meanwhile. `kept`: requests finished since
        the last step whose blocks vLLM keeps until `finished_saves` names them."""
        with self._lock:
            self._kept.update(kept)
        device = self._registration.buffers.tensors[0].device
        if jobs and self._staging is None and device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # this step's forward wrote them
        for job in jobs:
            if self._staging is None:
                self._pool.submit(self._publish, job, job.block_ids)
                continue
            staged = self._staging.free.take(len(job.block_ids))
            if staged is None:
                log.warning("kvmoq staging full: request %s is not published", job.request_id)
            else:
                self._staging.from_cache(job.block_ids, staged)
                self._pool.submit(self._publish, job, staged)
            self._blocks_read(job.request_id)

    def _publish(self, job: SaveJob, blocks: list[int]) -> None:
        def publish(set_id: str) -> kv_cache_pb2.PublishResponse:
            return self._registration.client.publish(
                set_id, job.token_ids, paged_blocks(blocks),
                tracks=self._settings.tracks, default_track=self._settings.default_track,
            )  # fmt: skip

        try:
            self._registration.call(publish)
        except SidecarError as exc:
            log.warning("kvmoq publish of request %s failed: %s", job.request_id, exc)
        except Exception:
            log.exception("kvmoq publish of request %s failed", job.request_id)
        finally:
            if self._staging is None:
                self._blocks_read(job.request_id)
            else:
                self._staging.free.give(blocks)

    def _blocks_read(self, request_id: str) -> None:
        if self._keep_published_blocks:
            with self._lock:
                self._read.add(request_id)

    def finished_saves(self) -> set[str]:
        """Finished requests whose blocks the sidecar no longer reads: vLLM may free them."""
        with self._lock:
            done = self._read & self._kept
            self._read -= done
            self._kept -= done
        return done

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._registration.close()
