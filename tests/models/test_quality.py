"""The quality measure separates a faithful KV from a damaged one on the real model."""

from __future__ import annotations

import pytest
import torch

from sidecar.models.quality import (
    AFTER_PROMPT,
    LONG_RUN,
    _prefill_tokens,
    evaluate,
    reference_quality,
)

pytestmark = pytest.mark.model

CONTEXT, SCORE = 256, 64


def test_identity_round_trip_is_the_reference() -> None:
    quality = evaluate(lambda kv: kv, context=CONTEXT, score=SCORE)
    assert quality.kl == pytest.approx(0.0, abs=1e-6)
    assert quality.top1 == 1.0
    assert 1.0 < quality.ppl < 100.0
    assert quality == reference_quality(context=CONTEXT, score=SCORE)


def test_fp16_round_trip_is_nearly_lossless() -> None:
    quality = evaluate(lambda kv: kv.half(), context=CONTEXT, score=SCORE)
    assert 0.0 <= quality.kl < 1e-4
    assert quality.top1 >= 0.98


def test_noisy_kv_scores_worse_than_coarse_kv() -> None:
    generator = torch.Generator().manual_seed(0)

    def noisy(kv: torch.Tensor) -> torch.Tensor:
        return kv + torch.randn(kv.shape, generator=generator) * kv.std()

    def coarse(kv: torch.Tensor) -> torch.Tensor:
        # 4-bit symmetric quantization per (layer, K/V, token).
        scale = kv.abs().amax(dim=(3, 4), keepdim=True) / 7
        return torch.round(kv / scale) * scale

    reference = reference_quality(context=CONTEXT, score=SCORE)
    damaged = evaluate(noisy, context=CONTEXT, score=SCORE)
    approximate = evaluate(coarse, context=CONTEXT, score=SCORE)
    assert damaged.kl > 0.5 and damaged.top1 < 0.8 and damaged.ppl > reference.ppl
    assert 0.0 < approximate.kl < damaged.kl
    assert approximate.top1 > damaged.top1


def test_zeroed_kv_destroys_the_prediction() -> None:
    quality = evaluate(torch.zeros_like, context=CONTEXT, score=SCORE)
    assert quality.kl > 1.0
    assert quality.top1 < 0.5


def test_shape_changing_round_trip_is_rejected() -> None:
    with pytest.raises(ValueError, match="shape"):
        evaluate(lambda kv: kv[:, :, 1:], context=CONTEXT, score=SCORE)


@pytest.mark.parametrize(
    ("context", "score", "prefill"),
    [
        (AFTER_PROMPT.context, AFTER_PROMPT.score, 4160),
        (LONG_RUN.context, LONG_RUN.score, 4096),
        (LONG_RUN.context, 256, 4096),  # within the long run: its prefill, not a 3328-token one
        (LONG_RUN.context + 512, 64, 4096),
        (CONTEXT, SCORE, CONTEXT + SCORE),  # before every place's context: its own
        (AFTER_PROMPT.context, 128, 4224),  # past every place: its own
    ],
)
def test_a_reference_within_a_place_reads_that_places_prefill(
    context: int, score: int, prefill: int
) -> None:
    assert _prefill_tokens(context, score) == prefill
