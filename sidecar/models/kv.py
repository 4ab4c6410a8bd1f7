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

from sidecar.kvcache.layout import KVLayout

if TYPE_CHECKING:
    # Imported where used: transformers takes seconds to import, and this module is
    # imported by commands (`kvmoq bench`) long before any model is needed.
    from transformers import DynamicCache, PreTrainedModel

K, V = 0, 1


def kv_layout(model: PreTrainedModel) -> KVLayout:
    """The layout of the model's KV cache; its dtype is the model's (fp32 for the CPU model)."""
    config = model.config.get_text_config(decoder=True)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return KVLayout(
        num_layers=config.num_hidden_layers,
        num_kv_heads=config.num_key_value_heads,
        head_dim=head_dim,
        dtype=str(model.dtype).removeprefix("torch."),
    )


def _batch_of_one(token_ids: Sequence[int]) -> torch.Tensor:
    return torch.tensor([list(token_ids)], dtype=torch.long)


def kv_from_cache(cache: DynamicCache) -> torch.Tensor:
    """Stack a batch-of-one HF cache ([1, heads, tokens, dim] per layer) into the kvmoq layout."""
    layers = [torch.stack((layer.keys[0], layer.values[0])) for layer in cache.layers]
    return torch.stack(layers).transpose(2, 3).contiguous()


def cache_from_kv(model: PreTrainedModel, kv: torch.Tensor) -> DynamicCache:
    """The model's cache object filled from a kvmoq KV tensor, ready for generation to continue.

    The tensor is cast to the model's dtype (a decoded KV may come as fp16 or bf16); one
    that does not fit the model raises `TensorError`.
    """
    from transformers import DynamicCache

    layout = kv_layout(model)
    layout.check(kv)
    per_layer = kv.to(dtype=model.dtype, device=model.device).transpose(2, 3).unsqueeze(2)
    return DynamicCache(
        ddp_cache_data=[(layer[K], layer[V]) for layer in per_layer], config=model.config
    )


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
