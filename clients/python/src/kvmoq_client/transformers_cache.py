"""Publish a transformers model's prompt KV after prefill; load it before `generate()`.

The model's KV goes through one registered buffer set: per layer a KEY_VALUE buffer of
`max_tokens` slots (shared memory for a CPU model, CUDA IPC for a GPU one). A publish copies
the prompt's cache into slots `[0, n)` and the sidecar copies it out before answering; a load
has the sidecar write slots `[0, n)` and builds a DynamicCache of the verified prefix. Calls
take a lock, since every call uses the same slots.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from kvmoq_client._closing import ClosesOnExit
from kvmoq_client.buffers import DEFAULT_SHM_DIR, KVBuffers, allocate_cuda_kv, allocate_shared_kv
from kvmoq_client.client import KVCacheClient
from kvmoq_client.dynamic_cache import cache_from_kv, kv_dimensions, kv_from_cache
from kvmoq_client.requests import token_slots
from kvmoq_client.v1 import kv_cache_pb2

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel


@dataclass(frozen=True)
class LoadedCache:
    """A load's outcome: the cache to generate from (None when nothing loaded) and the
    sidecar's account of it. `tokens` leading prompt tokens are in the cache; `generate()`
    computes the rest."""

    cache: DynamicCache | None
    tokens: int
    finished: kv_cache_pb2.LoadFinished


class TransformersKV(ClosesOnExit):
    """One model's KV buffers registered with the sidecar; use as a context manager."""

    def __init__(
        self,
        client: KVCacheClient,
        model: PreTrainedModel,
        model_name: str,
        max_tokens: int,
        shm_dir: Path = DEFAULT_SHM_DIR,
    ) -> None:
        self._client = client
        self._model = model
        self._lock = threading.Lock()
        num_layers, num_kv_heads, head_dim = kv_dimensions(model.config)
        arrangement = kv_cache_pb2.ContiguousLayout(max_tokens=max_tokens)
        dimensions = (num_layers, num_kv_heads, head_dim, model.dtype, arrangement)
        self.buffers: KVBuffers = (
            allocate_cuda_kv(*dimensions, device=model.device)
            if model.device.type == "cuda"
            else allocate_shared_kv(*dimensions, directory=shm_dir)
        )
        try:
            self.buffer_set_id = client.register_buffers(self.buffers.register_request(model_name))
        except BaseException:
            self.buffers.close()
            raise

    def close(self) -> None:
        """Unregister, then release the buffers: the sidecar holds no view of them after."""
        try:
            self._client.unregister_buffers(self.buffer_set_id)
        finally:
            self.buffers.close()

    def publish(
        self,
        token_ids: Sequence[int],
        cache: DynamicCache,
        *,
        tracks: Sequence[str] = (),
        default_track: str = "",
    ) -> kv_cache_pb2.PublishResponse:
        """Publish the KV of `token_ids`, the first tokens `cache` holds (after prefill)."""
        kv = kv_from_cache(cache)
        if kv.shape[2] < len(token_ids):
            raise ValueError(f"the cache holds {kv.shape[2]} tokens, not {len(token_ids)}")
        with self._lock:
            for layer, buffer in enumerate(self.buffers.tensors):
                buffer[:, : len(token_ids)] = kv[layer, :, : len(token_ids)]
            if kv.device.type == "cuda":
                # The sidecar reads on its own streams: the copies must have landed.
                torch.cuda.current_stream(kv.device).synchronize()
            return self._client.publish(
                self.buffer_set_id,
                token_ids,
                token_slots(0, len(token_ids)),
                tracks=tracks,
                default_track=default_track,
            )

    def load(
        self,
        token_ids: Sequence[int],
        *,
        tracks: Sequence[str] = (),
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> LoadedCache:
        """Load the longest available prefix of `token_ids` as a cache for `generate()`
        (`timeout` and `deadline` as `KVCacheClient.load` takes them).

        At most all but the last token: `generate()` must compute at least one position to
        get the logits of the first new token.
        """
        with self._lock:
            load = self._client.load(
                self.buffer_set_id,
                token_ids,
                token_slots(0, len(token_ids)),
                tracks=tracks,
                timeout=timeout,
                deadline=deadline,
            )
            finished = load.wait()
            tokens = min(finished.prefix_tokens, len(token_ids) - 1)
            if tokens <= 0:
                return LoadedCache(None, 0, finished)
            # stack copies: the cache must not alias slots the next load overwrites.
            kv = torch.stack([buffer[:, :tokens] for buffer in self.buffers.tensors])
            cache = cache_from_kv(kv, self._model.config)
        return LoadedCache(cache, tokens, finished)
