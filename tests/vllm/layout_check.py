"""Run in `.venv-vllm` by test_cache_layout.py: `BlockLayout` against vLLM's own kernel.

vLLM's `cpu_attn_reshape_and_cache` writes random K and V for three blocks (one partly
filled); `BlockLayout.read` must give them back, and `write` must leave the blocks exactly
as the kernel did, through the layout's fast path (strided or tiled views) and through the
index gather alike. The layouts: the ISA vLLM picks on this CPU for each dtype, and on x86
the AMX layout too (its writer moves bytes with plain stores, so any x86 CPU can probe it).
Prints one JSON line: {"ISA dtype": {"isa": ..., "path": ..., "fast": ok, "gather": ok}}.
"""

from __future__ import annotations

import dataclasses
import json
import platform

import torch
from kvmoq_client.vllm.cache_layout import BlockLayout
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

BLOCKS, HEADS, BLOCK_SIZE, HEAD_SIZE = 6, 3, 128, 64


def check(layout: BlockLayout, dtype: torch.dtype, isa: str) -> bool:
    cache = torch.zeros((BLOCKS, HEADS, BLOCK_SIZE, 2 * HEAD_SIZE), dtype=dtype)
    tokens = 2 * BLOCK_SIZE + 5
    key = torch.randn(tokens, HEADS, HEAD_SIZE).to(dtype)
    value = torch.randn(tokens, HEADS, HEAD_SIZE).to(dtype)
    blocks = torch.tensor([4, 1, 3])
    slots = (blocks.view(-1, 1) * BLOCK_SIZE + torch.arange(BLOCK_SIZE)).reshape(-1)[:tokens]
    key_cache, value_cache = cache.view(BLOCKS, HEADS, 2 * BLOCK_SIZE, HEAD_SIZE).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)
    read = layout.read(cache, blocks)
    rewritten = torch.zeros_like(cache)
    layout.write(rewritten, blocks, read)
    return (
        torch.equal(read[0, :tokens], key)
        and torch.equal(read[1, :tokens], value)
        and torch.equal(rewritten, cache)
    )


def main() -> None:
    layouts = [
        (_get_attn_isa(dtype, BLOCK_SIZE, HEAD_SIZE), dtype)
        for dtype in (torch.float16, torch.bfloat16, torch.float32)
    ]
    if platform.machine() == "x86_64":
        layouts.append(("amx", torch.bfloat16))
    results = {}
    for isa, dtype in dict.fromkeys(layouts):
        probe = torch.empty((1, HEADS, BLOCK_SIZE, 2 * HEAD_SIZE), dtype=dtype)
        layout = BlockLayout.probe(probe, isa)
        results[f"{isa} {dtype}"] = {
            "isa": isa,
            "path": layout.path,
            "fast": layout.tiles is not None and check(layout, dtype, isa),
            "gather": check(dataclasses.replace(layout, tiles=None), dtype, isa),
        }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
