"""The vLLM connector's measure of its engine's prefill rate (`kvmoq_client.vllm.compute_rate`),
which loads send the sidecar: a chunk must arrive sooner than the engine computes it."""

from __future__ import annotations

import pytest
from kvmoq_client.vllm.compute_rate import ALPHA, MIN_PREFILL_TOKENS, ComputeRate


def test_nothing_is_known_before_a_prefill_step_was_timed() -> None:
    rate = ComputeRate()
    assert rate.tokens_per_second is None
    rate.step_ended(5.0)  # no step started
    assert rate.tokens_per_second is None


def test_a_prefill_step_gives_its_tokens_over_its_time() -> None:
    rate = ComputeRate()
    rate.step_started(4096, now=10.0)
    rate.step_ended(now=12.0)
    assert rate.tokens_per_second == 2048.0


def test_decode_steps_and_idle_steps_do_not_count() -> None:
    """A step of a few tokens takes about as long as one of none: its rate says nothing of
    how fast a prompt is computed."""
    rate = ComputeRate()
    rate.step_started(4096, now=0.0)
    rate.step_ended(now=2.0)
    for tokens in (0, 1, MIN_PREFILL_TOKENS - 1):
        rate.step_started(tokens, now=3.0)
        rate.step_ended(now=3.1)
    assert rate.tokens_per_second == 2048.0


def test_later_steps_are_weighted_by_alpha() -> None:
    rate = ComputeRate()
    for tokens, seconds in ((1000, 1.0), (3000, 1.0)):
        rate.step_started(tokens, now=0.0)
        rate.step_ended(now=seconds)
    assert rate.tokens_per_second == pytest.approx(ALPHA * 3000 + (1 - ALPHA) * 1000)


def test_a_step_is_timed_once() -> None:
    rate = ComputeRate()
    rate.step_started(1000, now=0.0)
    rate.step_ended(now=1.0)
    rate.step_ended(now=100.0)  # a second end with no start: ignored
    assert rate.tokens_per_second == 1000.0
