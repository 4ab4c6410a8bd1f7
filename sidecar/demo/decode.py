"""The demo's decode node: recompute vs load per compression, quality, and prefix reuse.

Quality is judged the way a decode server experiences it: the KV of the prompt's first
N-1 tokens comes from the load, the last prompt token is fed, and then (a) the next
`SCORED_TOKENS` tokens of the real text are scored against the recomputed run (KL, top-1),
and (b) `GENERATED_TOKENS` tokens are generated greedily and compared with the recomputed
generation.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sidecar.kvcache.layout import KVLayout
from sidecar.models.kv import cache_from_kv, extract_kv, forward_with_kv, kv_from_cache
from sidecar.models.quality import mean_kl
from sidecar.transfer.subscriber import KVSubscriber, LoadResult, expected_kl
from sidecar.transfer.track_quality import DEFAULT_CHOICE, TrackChoice

SCORED_TOKENS = 64
GENERATED_TOKENS = 24
WARMUP_TOKENS = 16

Progress = Callable[[int], None]
"""Told the number of tokens written so far."""


@dataclass(frozen=True, slots=True)
class Reference:
    """The recomputed prompt: what every load is compared with."""

    kv: torch.Tensor
    seconds: float
    logits: torch.Tensor
    generated: list[int]


@dataclass(frozen=True, slots=True)
class TrackRun:
    label: str
    load_s: float
    wire_bytes: int
    loaded_tokens: int
    kl: float
    top1: float
    generated: list[int]
    tracks_used: dict[str, int]
    stopped: str
    compute_s: float = 0.0
    """Seconds computing the prompt's tokens the load did not bring, before scoring."""
    expected_kl: float = 0.0
    """What the load said its KV costs, from the measured figures of its tracks."""

    def same_text(self, reference: Reference) -> bool:
        return self.generated == reference.generated


@dataclass(frozen=True, slots=True)
class PrefixRun:
    """A longer prompt: the shared prefix loaded, the rest computed here."""

    prompt_tokens: int
    reused_tokens: int
    load_s: float
    compute_s: float
    recompute_s: float
    same_text: bool


@torch.inference_mode()
def greedy(model: torch.nn.Module, kv: torch.Tensor, feed: Sequence[int], steps: int) -> list[int]:
    """Feed `feed` after the KV `kv`, then generate `steps` tokens greedily."""
    cache = cache_from_kv(model, kv)
    tokens: list[int] = []
    step_input = torch.tensor([list(feed)], dtype=torch.long)
    for _ in range(steps):
        out = model(step_input, cache=cache, use_cache=True, logits_to_keep=1)
        tokens.append(int(out.logits[0, -1].argmax()))
        step_input = torch.tensor([[tokens[-1]]], dtype=torch.long)
    return tokens


def recompute(
    model: torch.nn.Module,
    prompt: Sequence[int],
    continuation: Sequence[int],
    *,
    repeat: int = 1,
) -> Reference:
    """The reference; its seconds are the fastest of `repeat` prefills (other load on the
    machine only ever slows one down)."""
    # A process's first forward pays one-time setup (on a busy 2-core machine a first
    # 512-token prefill took 35 s, a later 712-token one 2.4 s); a serving model is warm.
    extract_kv(model, prompt[:WARMUP_TOKENS])
    seconds = math.inf
    for _ in range(repeat):
        started = time.perf_counter()
        kv, _ = extract_kv(model, prompt)
        seconds = min(seconds, time.perf_counter() - started)
    head = kv[:, :, : len(prompt) - 1]
    logits = forward_with_kv(model, head, [prompt[-1], *continuation])
    generated = greedy(model, head, [prompt[-1]], GENERATED_TOKENS)
    return Reference(kv, seconds, logits, generated)


def _agreement(reference: torch.Tensor, logits: torch.Tensor) -> tuple[float, float]:
    """Mean KL(p_ref || p) over positions and top-1 agreement."""
    kl = mean_kl(F.log_softmax(reference.float(), dim=-1), F.log_softmax(logits.float(), dim=-1))
    top1 = (reference.argmax(-1) == logits.argmax(-1)).float().mean().item()
    return max(kl, 0.0), top1


async def load(
    subscriber: KVSubscriber,
    model_name: str,
    token_ids: Sequence[int],
    layout: KVLayout,
    *,
    deadline: float,
    choice: TrackChoice = DEFAULT_CHOICE,
    progress: Progress,
) -> tuple[LoadResult, torch.Tensor, float]:
    """Load the prompt's KV into a fresh tensor; the result, the tensor and the seconds taken."""
    destination = torch.zeros(layout.shape(len(token_ids)), dtype=layout.torch_dtype)
    written = 0

    def sink(tokens: range, kv: torch.Tensor) -> None:
        nonlocal written
        destination[:, :, tokens.start : tokens.stop] = kv
        written += len(tokens)
        progress(written)

    started = time.perf_counter()
    result = await subscriber.load(model_name, token_ids, sink, deadline, choice=choice)
    return result, destination, time.perf_counter() - started


def judge(
    model: torch.nn.Module,
    label: str,
    result: LoadResult,
    kv: torch.Tensor,
    seconds: float,
    prompt: Sequence[int],
    continuation: Sequence[int],
    reference: Reference,
) -> TrackRun:
    """Quality of a load into `kv` as its decode server sees it (`quality_after`)."""
    tracks = Counter(chunk.track for chunk in result.loaded)
    wire = sum(chunk.nbytes for chunk in result.loaded)
    loaded = result.prefix_tokens
    kl, top1, generated, compute_s = quality_after(
        model, kv, loaded, prompt, continuation, reference
    )
    return TrackRun(
        label,
        seconds,
        wire,
        loaded,
        kl,
        top1,
        generated,
        dict(tracks),
        result.stopped.value,
        compute_s,
        expected_kl(result.loaded),
    )


def quality_after(
    model: torch.nn.Module,
    kv: torch.Tensor,
    loaded: int,
    prompt: Sequence[int],
    continuation: Sequence[int],
    reference: Reference,
) -> tuple[float, float, list[int], float]:
    """KL, top-1 and greedy text after a load that wrote `kv`'s first `loaded` tokens, and
    the seconds spent computing the rest of the prompt first, as a decode server does when a
    deadline stopped the load (0 for a whole load)."""
    if loaded >= len(prompt):
        return (*score(model, kv, prompt, continuation, reference), 0.0)
    head, compute_s = complete_prompt(model, kv[:, :, :loaded], prompt)
    return (*score(model, head, prompt, continuation, reference), compute_s)


def score(
    model: torch.nn.Module,
    kv: torch.Tensor,
    prompt: Sequence[int],
    continuation: Sequence[int],
    reference: Reference,
) -> tuple[float, float, list[int]]:
    """KL, top-1 and greedy text after a whole loaded prompt `kv`, however it was loaded
    (through a KVSubscriber here, through a sidecar in the demo's decode server)."""
    head = kv[:, :, : len(prompt) - 1]
    logits = forward_with_kv(model, head, [prompt[-1], *continuation])
    kl, top1 = _agreement(reference.logits, logits)
    return kl, top1, greedy(model, head, [prompt[-1]], GENERATED_TOKENS)


async def reuse_prefix(
    subscriber: KVSubscriber,
    model: torch.nn.Module,
    model_name: str,
    layout: KVLayout,
    longer: Sequence[int],
    track: str,
    progress: Progress,
) -> PrefixRun:
    """Load what the relay has of `longer`, compute only the rest, compare with recomputing all."""
    available = await subscriber.lookup(model_name, longer)
    if available.tokens == 0:
        kv, load_s, reused = torch.empty(layout.shape(0), dtype=layout.torch_dtype), 0.0, 0
    else:
        result, kv, load_s = await load(
            subscriber,
            model_name,
            longer[: available.tokens],
            layout,
            deadline=60.0,
            choice=TrackChoice.only(track),
            progress=progress,
        )
        reused = result.prefix_tokens
    return await asyncio.to_thread(finish_prefix, model, kv[:, :, :reused], longer, load_s)


def finish_prefix(
    model: torch.nn.Module, loaded: torch.Tensor, longer: Sequence[int], load_s: float
) -> PrefixRun:
    """Compute what `loaded` (the KV of `longer`'s first tokens) lacks, generate, and
    compare with recomputing all of `longer`."""
    reused = loaded.shape[2]
    generated, compute_s = continue_prompt(model, loaded, longer, GENERATED_TOKENS)

    started = time.perf_counter()
    full_kv, _ = extract_kv(model, longer)
    recompute_s = time.perf_counter() - started
    expected = greedy(model, full_kv[:, :, : len(longer) - 1], [longer[-1]], GENERATED_TOKENS)
    return PrefixRun(len(longer), reused, load_s, compute_s, recompute_s, generated == expected)


def continue_prompt(
    model: torch.nn.Module, loaded: torch.Tensor, prompt: Sequence[int], steps: int
) -> tuple[list[int], float]:
    """What a decode server does after a load: compute the KV `loaded` (of `prompt`'s first
    tokens) lacks, then generate `steps` tokens greedily; the tokens and the seconds the
    computing took."""
    head, compute_s = complete_prompt(model, loaded, prompt)
    return greedy(model, head, [prompt[-1]], steps), compute_s


def complete_prompt(
    model: torch.nn.Module, loaded: torch.Tensor, prompt: Sequence[int]
) -> tuple[torch.Tensor, float]:
    """The KV of all of `prompt` but its last token (which a decode server feeds to get the
    first new one), from `loaded`, the KV of its first tokens: what is missing is computed.
    Also the seconds that took."""
    reused = min(loaded.shape[2], len(prompt) - 1)
    rest = prompt[reused:-1]
    started = time.perf_counter()
    if reused == 0:
        head, _ = extract_kv(model, rest)
    else:
        head = _extend(model, loaded[:, :, :reused], rest) if rest else loaded[:, :, :reused]
    return head, time.perf_counter() - started


@torch.inference_mode()
def _extend(model: torch.nn.Module, kv: torch.Tensor, token_ids: Sequence[int]) -> torch.Tensor:
    """The KV of the loaded tokens plus `token_ids` computed after them (what the relay lacked)."""
    cache = cache_from_kv(model, kv)
    model(
        torch.tensor([list(token_ids)], dtype=torch.long),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return kv_from_cache(cache)
