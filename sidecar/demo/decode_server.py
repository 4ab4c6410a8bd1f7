"""The demo's decode model server: SmolLM2 loads a published prompt's KV cache through its
own sidecar (which fetches it from the relay) instead of recomputing it.

    python -m sidecar.demo.decode_server --sidecar unix:///tmp/b.sock --tokens 1024 \
        --tracks fp16,int8,ac

It recomputes the prompt once as the reference, looks the prompt up, loads it in each
compression and judges each load (KL, top-1, same generated text), loads it once more with
every track allowed under a deadline (the sidecar adapts), then serves a longer request
that extends the prompt: the published prefix is loaded, only the rest computed. Reports
its steps as JSON lines (`sidecar.demo.steps`), then `{"event": "report", ...}`, and exits.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from kvmoq_client import KVCacheClient, token_slots
from kvmoq_client.buffers import KVBuffers, allocate_shared_kv
from kvmoq_client.dynamic_cache import kv_dimensions
from kvmoq_client.v1 import kv_cache_pb2 as pb

from sidecar.demo.decode import (
    SCORED_TOKENS,
    PrefixRun,
    Reference,
    TrackRun,
    finish_prefix,
    recompute,
    score,
)
from sidecar.demo.steps import Progress, Steps, emit
from sidecar.models.corpus import pydoc_token_ids
from sidecar.models.smollm2 import MODEL_NAME, load_model

EXTENSION_TOKENS = 200
"""Tokens the second request adds after the published prompt."""
LOAD_TIMEOUT_S = 120.0
"""A per-track load's deadline: generous, so that a busy machine slows it but never cuts it."""
ADAPTIVE = "adaptive"
RECOMPUTE_REPEAT = 2
"""The reference time is the faster of two prefills: other work on a shared machine only
ever slows one down, and a slowed recompute would flatter every load."""


@dataclass(frozen=True, slots=True)
class Loaded:
    finished: pb.LoadFinished
    kv: torch.Tensor
    """The verified prefix `[layers, 2, prefix_tokens, kv_heads, head_dim]`, copied out."""
    seconds: float


class DecodeNode:
    """One registered buffer set and the sidecar client that loads into it."""

    def __init__(self, client: KVCacheClient, buffers: KVBuffers, set_id: str) -> None:
        self.client = client
        self.buffers = buffers
        self.set_id = set_id

    def load(
        self, token_ids: Sequence[int], tracks: Sequence[str], timeout: float, progress: Progress
    ) -> Loaded:
        started = time.perf_counter()
        call = self.client.load(
            self.set_id, token_ids, token_slots(0, len(token_ids)), tracks=tracks, timeout=timeout
        )
        written = 0
        for chunk in call:
            written += chunk.tokens.end - chunk.tokens.start
            progress(written)
        seconds = time.perf_counter() - started
        assert call.finished is not None  # the iteration raised otherwise
        tokens = call.finished.prefix_tokens
        # stack copies: the next load overwrites the same slots.
        kv = torch.stack([buffer[:, :tokens] for buffer in self.buffers.tensors])
        return Loaded(call.finished, kv, seconds)


def judge_load(
    model: torch.nn.Module,
    label: str,
    loaded: Loaded,
    prompt: Sequence[int],
    continuation: Sequence[int],
    reference: Reference,
) -> TrackRun:
    """A load as `sidecar.demo.decode.judge` sees one, from the sidecar's LoadFinished."""
    finished = loaded.finished
    kl, top1, generated = (
        score(model, loaded.kv, prompt, continuation, reference)
        if finished.prefix_tokens >= len(prompt)
        else (math.nan, math.nan, [])
    )
    return TrackRun(
        label,
        loaded.seconds,
        sum(finished.track_bytes.values()),
        finished.prefix_tokens,
        kl,
        top1,
        generated,
        dict(finished.track_bytes),
        pb.StopReason.Name(finished.stop_reason),
    )


def decode(
    args: argparse.Namespace, node: DecodeNode, model: torch.nn.Module, steps: Steps
) -> dict[str, Any]:
    tracks: list[str] = args.tracks.split(",")
    ids = pydoc_token_ids(args.tokens + EXTENSION_TOKENS)
    prompt, continuation = ids[: args.tokens], ids[args.tokens : args.tokens + SCORED_TOKENS]
    done = steps.start(f"decode server: recompute the {args.tokens}-token prompt (reference)")
    reference = recompute(model, prompt, continuation, repeat=RECOMPUTE_REPEAT)
    done(1)

    found = node.client.lookup(node.set_id, prompt)
    if found.available_tokens < len(prompt):
        raise SystemExit(
            f"decode server: the sidecar finds {found.available_tokens} of {len(prompt)} "
            "prompt tokens published"
        )
    runs: list[TrackRun] = []
    plans = [(track, [track], LOAD_TIMEOUT_S) for track in tracks]
    plans.append((ADAPTIVE, [], reference.seconds / 2))
    for label, allowed, timeout in plans:
        if allowed:
            # The prefill sidecar encodes a track on its first request; warm it so the
            # timed load is what every later decoder sees (served from the relay's cache).
            warm = steps.start(
                f"first {label} request: the prefill sidecar encodes it", len(prompt)
            )
            node.load(prompt, allowed, LOAD_TIMEOUT_S, warm)
        progress = steps.start(f"load {label} through the sidecar and the relay", len(prompt))
        loaded = node.load(prompt, allowed, timeout, progress)
        runs.append(judge_load(model, label, loaded, prompt, continuation, reference))

    longer = ids[: args.tokens + EXTENSION_TOKENS]
    reuse_track = "int8" if "int8" in tracks else tracks[0]
    available = node.client.lookup(node.set_id, longer).available_tokens
    progress = steps.start(f"longer prompt: load the published prefix ({reuse_track})", available)
    loaded = node.load(longer[:available], [reuse_track], LOAD_TIMEOUT_S, progress)
    done = steps.start(f"longer prompt: compute the other {len(longer) - available} tokens")
    prefix = finish_prefix(model, loaded.kv, longer, loaded.seconds)
    done(1)
    return report(args.tokens, found, reference, runs, prefix)


def report(
    tokens: int,
    found: pb.LookupResponse,
    reference: Reference,
    runs: list[TrackRun],
    prefix: PrefixRun,
) -> dict[str, Any]:
    """The figures `kvmoq demo` renders and writes with `--json` (keys are its contract)."""
    fp16_bytes = reference.kv[:, :, :tokens].numel() * 2
    return {
        "tokens": tokens,
        "recompute_s": reference.seconds,
        "lookup": {"available_tokens": found.available_tokens, "prompt_id": found.prompt_id},
        "tracks": {
            run.label: {
                "load_s": run.load_s,
                "wire_bytes": run.wire_bytes,
                "ratio_vs_fp16": fp16_bytes / run.wire_bytes if run.wire_bytes else None,
                "loaded_tokens": run.loaded_tokens,
                "speedup_vs_recompute": reference.seconds / run.load_s,
                "kl": None if math.isnan(run.kl) else run.kl,
                "top1": None if math.isnan(run.top1) else run.top1,
                "same_text": run.same_text(reference),
                "tracks_used": run.tracks_used,
                "stopped": run.stopped,
            }
            for run in runs
        },
        "prefix_reuse": {
            "prompt_tokens": prefix.prompt_tokens,
            "reused_tokens": prefix.reused_tokens,
            "computed_tokens": prefix.prompt_tokens - prefix.reused_tokens,
            "load_s": prefix.load_s,
            "compute_s": prefix.compute_s,
            "recompute_s": prefix.recompute_s,
            "same_text": prefix.same_text,
        },
    }


def serve(args: argparse.Namespace) -> None:
    emit("started")
    steps = Steps()
    done = steps.start("decode server: load SmolLM2")
    model = load_model()
    done(1)
    arrangement = pb.ContiguousLayout(max_tokens=args.tokens + EXTENSION_TOKENS)
    with (
        KVCacheClient(args.sidecar, timeout=LOAD_TIMEOUT_S, wait_for_ready=True) as client,
        allocate_shared_kv(*kv_dimensions(model.config), model.dtype, arrangement) as buffers,
    ):
        set_id = client.register_buffers(buffers.register_request(MODEL_NAME))
        try:
            figures = decode(args, DecodeNode(client, buffers, set_id), model, steps)
        finally:
            client.unregister_buffers(set_id)
    emit("report", **figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sidecar", required=True, help="the sidecar's API, unix://PATH")
    parser.add_argument("--tokens", type=int, required=True, help="the published prompt's length")
    parser.add_argument("--tracks", required=True, help="compressions to load, one at a time")
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
