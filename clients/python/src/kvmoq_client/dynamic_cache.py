"""A transformers DynamicCache as one kvmoq KV tensor, and back.

The kvmoq layout is `[num_layers, 2, num_tokens, num_kv_heads, head_dim]` (0 = K, 1 = V),
token-major inside a layer, so a prompt's first tokens are a contiguous slice of the buffer
a sidecar reads. Keys are post-RoPE as the cache holds them: a loaded cache is used as is,
with positions continuing after the loaded tokens.

Kept in the client package (which never imports the sidecar); `sidecar/models/kv.py`
builds the sidecar's own tools on these functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import DynamicCache, PretrainedConfig

K, V = 0, 1


def kv_dimensions(config: PretrainedConfig) -> tuple[int, int, int]:
    """`(num_layers, num_kv_heads, head_dim)` of a decoder's KV cache."""
    text = config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return text.num_hidden_layers, text.num_key_value_heads, head_dim


def kv_from_cache(cache: DynamicCache) -> torch.Tensor:
    """Stack a batch-of-one cache (`[1, heads, tokens, dim]` per layer) into the kvmoq layout."""
    layers = [torch.stack((layer.keys[0], layer.values[0])) for layer in cache.layers]
    return torch.stack(layers).transpose(2, 3)


def cache_from_kv(kv: torch.Tensor, config: PretrainedConfig) -> DynamicCache:
    """A batch-of-one cache holding `kv`, ready for `generate()` to continue after it."""
    from transformers import DynamicCache

    expected = (kv_dimensions(config)[0], 2)
    if tuple(kv.shape[:2]) != expected or kv.dim() != 5:
        raise ValueError(f"KV of shape {tuple(kv.shape)} does not fit a {expected[0]}-layer model")
    per_layer = kv.transpose(2, 3).unsqueeze(2)
    return DynamicCache(ddp_cache_data=[(layer[K], layer[V]) for layer in per_layer], config=config)
