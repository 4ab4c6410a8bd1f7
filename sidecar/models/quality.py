"""How much a KV compression hurts the model that continues from it.

The test mirrors the product: a decode server loads a context's KV (here: the first
`context` tokens of a corpus text, passed through the compression round trip) and computes
the next `score` tokens on top of it in one forward pass. Against the same run on the
uncompressed KV we report the perplexity of the true next tokens, the mean
KL(p_ref || p_test) of the next-token distributions and how often the most likely next token
stays the same.

Two places matter (`PLACES`): the 64 tokens right after a 4096-token prompt, which is what a
decode server produces first and where the most recent tokens of the context weigh most,
and 1024 tokens after a 3072-token context, a long continuation where the per-token figures
average out. A codec is judged at both, on every text of `corpus.TEXTS`, by the worst.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sidecar.models.corpus import text_token_ids
from sidecar.models.kv import forward_with_kv
from sidecar.models.kv_store import text_kv
from sidecar.models.smollm2 import load_model

RoundTrip = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Quality:
    ppl: float
    kl: float
    top1: float


@dataclass(frozen=True)
class Place:
    """Where quality is measured: `score` tokens after a `context`-token KV."""

    name: str
    context: int
    score: int


AFTER_PROMPT = Place("next64", context=4096, score=64)
LONG_RUN = Place("long1024", context=3072, score=1024)
PLACES: tuple[Place, ...] = (AFTER_PROMPT, LONG_RUN)


@dataclass(frozen=True)
class _Reference:
    context_kv: torch.Tensor
    scored_ids: list[int]
    targets: torch.Tensor
    log_probs: torch.Tensor
    top1: torch.Tensor


def _prefill_tokens(context: int, score: int) -> int:
    """How many tokens of a text to prefill for a reference of `score` tokens after `context`.

    The context KV is sliced from a cached prefill (causal attention: the first `context`
    tokens' KV does not depend on what follows), so a reference that lies within one of
    `PLACES` and starts no earlier than its context reads that place's prefill: a text is
    prefilled once per place, not once per scored length.
    """
    covering = [
        place.context + place.score
        for place in PLACES
        if place.context <= context and context + score <= place.context + place.score
    ]
    return min(covering, default=context + score)


@functools.cache
def _reference(text: str, context: int, score: int) -> _Reference:
    # Token `context + score` is only a target, never fed.
    ids = text_token_ids(text, context + score + 1)
    context_kv = text_kv(text, _prefill_tokens(context, score)).kv[:, :, :context].clone()
    scored_ids = ids[context : context + score]
    log_probs = torch.log_softmax(forward_with_kv(load_model(), context_kv, scored_ids), dim=-1)
    return _Reference(
        context_kv=context_kv,
        scored_ids=scored_ids,
        targets=torch.tensor(ids[context + 1 :]),
        log_probs=log_probs,
        top1=log_probs.argmax(dim=-1),
    )


def mean_kl(reference_log_probs: torch.Tensor, log_probs: torch.Tensor) -> float:
    """KL(p_ref || p) of `[positions, vocab]` next-token log-probabilities, averaged over
    positions: the one measure of drift that the quality harness, the demo and the vLLM
    bench all report, so their figures compare."""
    kl = torch.sum(reference_log_probs.exp() * (reference_log_probs - log_probs), dim=-1)
    return kl.mean().item()


def _score(log_probs: torch.Tensor, ref: _Reference) -> Quality:
    nll = -log_probs.gather(1, ref.targets[:, None]).mean().item()
    kl = mean_kl(ref.log_probs, log_probs)
    top1 = (log_probs.argmax(dim=-1) == ref.top1).float().mean().item()
    return Quality(ppl=math.exp(nll), kl=kl, top1=top1)


def reference_quality(context: int = 3072, score: int = 1024, text: str = "pydoc") -> Quality:
    """The uncompressed run's own figures (its KL is 0 and top-1 is 1 by definition)."""
    ref = _reference(text, context, score)
    return _score(ref.log_probs, ref)


@torch.inference_mode()
def evaluate(
    roundtrip: RoundTrip, context: int = 3072, score: int = 1024, text: str = "pydoc"
) -> Quality:
    """Quality of the model continuing from `roundtrip(context KV)` of a corpus text.

    `roundtrip` gets a copy of the fp32 context KV `[layers, 2, context, kv_heads, head_dim]`
    and returns the decompressed KV of the same shape, in any float dtype. The uncompressed
    reference run is computed once per process and (text, context, score).
    """
    ref = _reference(text, context, score)
    restored = roundtrip(ref.context_kv.clone())
    if restored.shape != ref.context_kv.shape:
        raise ValueError(
            f"round trip changed the KV shape: {tuple(ref.context_kv.shape)} -> "
            f"{tuple(restored.shape)}"
        )
    logits = forward_with_kv(load_model(), restored, ref.scored_ids)
    return _score(torch.log_softmax(logits.float(), dim=-1), ref)


def evaluate_at(roundtrip: RoundTrip, text: str, place: Place) -> Quality:
    """`evaluate` at one of `PLACES`."""
    return evaluate(roundtrip, context=place.context, score=place.score, text=text)
