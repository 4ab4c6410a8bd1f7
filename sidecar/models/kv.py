"""A model's KV cache as one tensor, and back: what a sidecar ships and a decode server loads.

The tensor layout is `[num_layers, 2, num_tokens, num_kv_heads, head_dim]` (index 0 = K,
1 = V): token-major inside a layer, so a 128-token chunk or a single token's K/V is a
contiguous slice along dim 2. Keys are post-RoPE, as the transformers cache holds them, so a
loaded cache is used as is, with the positions continuing after the loaded tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from kvmoq_client import dynamic_cache

from sidecar.kvcache.layout import KVLayout

if TYPE_CHECKING:
    # Imported where used: transformers takes seconds to import, and this module is
    # imported by commands (`kvmoq bench`) long before any model is needed.
    from transformers import DynamicCache, PreTrainedModel

K, V = dynamic_cache.K, dynamic_cache.V
"""Indexes of keys and values along dim 1, the client library's."""


def kv_layout(model: PreTrainedModel) -> KVLayout:
    """The layout of the model's KV cache; its dtype is the model's (fp32 for the CPU model).

    The dimensions come from the client library's `kv_dimensions`, so the sidecar and a model
    server built on `kvmoq_client` cannot disagree on them.
    """
    num_layers, num_kv_heads, head_dim = dynamic_cache.kv_dimensions(model.config)
    return KVLayout(
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=str(model.dtype).removeprefix("torch."),
    )


def _batch_of_one(token_ids: Sequence[int]) -> torch.Tensor:
    return torch.tensor([list(token_ids)], dtype=torch.long)


def kv_from_cache(cache: DynamicCache) -> torch.Tensor:
    """Stack a batch-of-one HF cache ([1, heads, tokens, dim] per layer) into the kvmoq layout.

    The client library's conversion (a transposed view), made contiguous as it always was here.
    """
    return dynamic_cache.kv_from_cache(cache).contiguous()


def cache_from_kv(model: PreTrainedModel, kv: torch.Tensor) -> DynamicCache:
    """The model's cache object filled from a kvmoq KV tensor, ready for generation to continue.

    The tensor is cast to the model's dtype (a decoded KV may come as fp16 or bf16); one
    that does not fit the model raises `TensorError` (checked here, before the client
    library's conversion, which would raise `ValueError`).
    """
    kv_layout(model).check(kv)
    return dynamic_cache.cache_from_kv(kv.to(dtype=model.dtype, device=model.device), model.config)


@torch.inference_mode()
def extract_kv(
    model: PreTrainedModel, token_ids: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill `token_ids`; return their KV and the logits of the last position only.

    Only the last position's logits are kept (they give the first generated token): all
    positions of a 4096-token prompt would be 800 MB of fp32 logits nobody reads.
    """
    out = model(_batch_of_one(token_ids), use_cache=True, logits_to_keep=1)
    return kv_from_cache(out.cache), out.logits[0, -1].clone()


@torch.inference_mode()
def forward_with_kv(
    model: PreTrainedModel, kv: torch.Tensor, token_ids: Sequence[int]
) -> torch.Tensor:
    """Logits `[len(token_ids), vocab]` of `token_ids` fed after a loaded KV, as a decode server would."""
    out = model(_batch_of_one(token_ids), cache=cache_from_kv(model, kv), use_cache=True)
    return out.logits[0]
