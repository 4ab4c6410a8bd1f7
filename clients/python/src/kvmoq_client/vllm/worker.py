"""The connector's worker side: copies between vLLM's KV cache and a shared-memory staging
area the sidecar reads and writes, and the Load and Publish calls that go with them.

On a CPU node vLLM keeps its cache in the worker's private memory, which the sidecar cannot
map, so every transfer goes through staging: one copy each way (`BlockLayout.read/write`).
Loads run in a thread pool, so the engine keeps stepping while a load is under way; a
block is handed to vLLM only once the sidecar reported its tokens written and verified,
and every other block of the load is reported as failed, for vLLM to recompute.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from kvmoq_client.errors import SidecarError
from kvmoq_client.requests import paged_blocks
from kvmoq_client.v1 import kv_cache_pb2
from kvmoq_client.vllm.cache_layout import BlockLayout
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


class WorkerSide:
    def __init__(
        self,
        settings: ConnectorSettings,
        registration: Registration,
        caches: list[torch.Tensor],
        layout: BlockLayout,
        block_size: int,
    ) -> None:
        self._settings = settings
        self._registration = registration
        self._caches = caches
        self._layout = layout
        self._block_size = block_size
        self._staging = registration.buffers.tensors  # per layer [2, blocks, size, H, D]
        self._free = StagingBlocks(self._staging[0].shape[1])
        self._pool = ThreadPoolExecutor(TRANSFER_THREADS, thread_name_prefix="kvmoq")
        self._lock = threading.Condition()
        self._loading = 0
        self._loaded: set[str] = set()
        self._failed_blocks: set[int] = set()

    # Loads ------------------------------------------------------------------------------

    def start_loads(self, jobs: Sequence[LoadJob]) -> None:
        for job in jobs:
            with self._lock:
                self._loading += 1
            self._pool.submit(self._load, job)

    def _load(self, job: LoadJob) -> None:
        landed: list[int] = []
        staging = self._free.take(-(-len(job.token_ids) // self._block_size))
        try:
            if staging is None:
                log.warning("kvmoq staging full: request %s computes its prompt", job.request_id)
            else:
                landed = self._load_into(job, staging)
        except SidecarError as exc:
            log.warning("kvmoq load of request %s failed: %s", job.request_id, exc)
        except Exception:
            log.exception("kvmoq load of request %s failed", job.request_id)
        finally:
            if staging is not None:
                self._free.give(staging)
            failed = set(job.block_ids[job.first_block :]) - set(landed)
            with self._lock:
                self._failed_blocks |= failed
                self._loaded.add(job.request_id)
                self._loading -= 1
                self._lock.notify_all()

    def _load_into(self, job: LoadJob, staging: list[int]) -> list[int]:
        """The vLLM blocks written: those whose every token the sidecar reported loaded."""
        size = self._block_size

        def load(set_id: str) -> kv_cache_pb2.LoadFinished:
            client = self._registration.client
            return client.load(
                set_id, job.token_ids, paged_blocks(staging),
                tracks=job.tracks or self._settings.tracks,
                timeout=min(job.deadline or math.inf, self._settings.load_deadline),
                held_tokens=job.first_block * size,
            ).wait()  # fmt: skip

        finished = self._registration.call(load)
        whole = [
            index
            for index in range(job.first_block, len(job.block_ids))
            if any(r.start <= index * size and (index + 1) * size <= r.end for r in finished.loaded)
        ]
        if whole:
            source = torch.tensor([staging[i] for i in whole])
            target = torch.tensor([job.block_ids[i] for i in whole])
            for cache, buffer in zip(self._caches, self._staging, strict=True):
                kv = buffer[:, source].reshape(2, -1, *buffer.shape[3:])
                self._layout.write(cache, target, kv)
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

    def save(self, jobs: Sequence[SaveJob]) -> None:
        """Copy each prompt's blocks to staging now (vLLM may reuse them after this step),
        then publish from staging in the background."""
        for job in jobs:
            staging = self._free.take(len(job.block_ids))
            if staging is None:
                log.warning("kvmoq staging full: request %s is not published", job.request_id)
                continue
            source = torch.tensor(job.block_ids)
            target = torch.tensor(staging)
            for cache, buffer in zip(self._caches, self._staging, strict=True):
                kv = self._layout.read(cache, source)
                buffer[:, target] = kv.view(2, len(staging), *buffer.shape[2:])
            self._pool.submit(self._publish, job, staging)

    def _publish(self, job: SaveJob, staging: list[int]) -> None:
        def publish(set_id: str) -> kv_cache_pb2.PublishResponse:
            return self._registration.client.publish(
                set_id, job.token_ids, paged_blocks(staging),
                tracks=self._settings.tracks, default_track=self._settings.default_track,
            )  # fmt: skip

        try:
            self._registration.call(publish)
        except SidecarError as exc:
            log.warning("kvmoq publish of request %s failed: %s", job.request_id, exc)
        except Exception:
            log.exception("kvmoq publish of request %s failed", job.request_id)
        finally:
            self._free.give(staging)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._registration.close()
