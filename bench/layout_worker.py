"""Run in vLLM's environment by `kvmoq bench layout` (bench/layout.py): the connector's block
copies between vLLM's CPU cache and the sidecar's staging, on every layout vLLM's own
`cpu_attn_reshape_and_cache` writes here, through the layout's fast path and the gather.

The layout is the kernel's arrangement of bytes, not its instructions: the `amx` writer moves
bytes with ordinary stores, so the AMX layout is probed and copied on any x86 CPU. Prints
one JSON object: the ISA vLLM picks here for bf16, and a row per layout and path.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from functools import partial

import torch
from kvmoq_client.vllm.cache_layout import BlockLayout
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

LAYOUTS = (("amx", torch.bfloat16), ("vec", torch.bfloat16), ("vec", torch.float16))
BLOCK_SIZE = 128


def blocks_per_second(copy: Callable[[], object], blocks: int, seconds: float) -> float:
    """Best of three timed stretches of repeated copies of `blocks` blocks."""
    best = 0.0
    for _ in range(3):
        copy()
        started, done = time.perf_counter(), 0
        while (elapsed := time.perf_counter() - started) < seconds / 3:
            copy()
            done += blocks
        best = max(best, done / elapsed)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--head-size", type=int, required=True)
    parser.add_argument("--blocks", type=int, required=True, help="blocks per copy")
    parser.add_argument("--seconds", type=float, required=True, help="per figure")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the connector copies on vLLM's worker thread
    torch.manual_seed(0)
    rows = []
    for isa, dtype in LAYOUTS:
        shape = (4 * args.blocks, args.heads, BLOCK_SIZE, 2 * args.head_size)
        cache = torch.randn(shape).to(dtype)
        layout = BlockLayout.probe(cache[:1], isa)
        blocks = torch.randperm(shape[0])[: args.blocks]  # scattered, as a busy engine's are
        kv = layout.read(cache, blocks)
        for path in (layout, dataclasses.replace(layout, tiles=None)):
            target = torch.zeros_like(cache)
            path.write(target, blocks, kv)
            exact = torch.equal(path.read(cache, blocks), kv) and torch.equal(
                target[blocks], cache[blocks]
            )
            rows.append(
                {
                    "isa": isa,
                    "dtype": str(dtype).removeprefix("torch."),
                    "path": path.path,
                    "exact": exact,
                    "read_blocks_s": blocks_per_second(
                        partial(path.read, cache, blocks), args.blocks, args.seconds
                    ),
                    "write_blocks_s": blocks_per_second(
                        partial(path.write, target, blocks, kv), args.blocks, args.seconds
                    ),
                }
            )
    isa_here = _get_attn_isa(torch.bfloat16, BLOCK_SIZE, args.head_size)
    print(json.dumps({"bf16_isa_here": isa_here, "rows": rows}))


if __name__ == "__main__":
    main()
