"""How fast this engine computes prompts itself, measured on its own prefill steps.

A load pays for a chunk only if the chunk arrives sooner than the engine would compute its
tokens (the sidecar's rule, `LoadRequest.compute_tokens_per_second`): on a slow link the
engine is better off computing the rest of a prompt than waiting for it. The worker knows
how many tokens each step computes (the scheduler says so in the step's jobs), and vLLM
binds a step's jobs before its forward and calls `wait_for_save` after it (`start_load_kv`
comes after the forward too, for asynchronous loads): on vLLM's CPU backend the wall time
between the two is the step's compute. Steps of fewer than
`MIN_PREFILL_TOKENS` tokens are not counted: a decode step's time is the model's weights read
once, not a prompt's tokens computed. Kept free of vLLM, so it is unit-tested without it.
"""

from __future__ import annotations

MIN_PREFILL_TOKENS = 256
"""Fewest tokens a step computes for its time to count: two of vLLM's CPU blocks, well past
where a step's time stops being mostly fixed cost."""

ALPHA = 0.3
"""Weight of the newest step in the estimate: a few steps of memory, as the link's estimate
in the sidecar keeps."""


class ComputeRate:
    """The engine's prefill rate in tokens per second, an exponentially weighted mean over
    its prefill steps; None until one was timed."""

    def __init__(self) -> None:
        self.tokens_per_second: float | None = None
        self._step: tuple[int, float] | None = None

    def step_started(self, tokens: int, now: float) -> None:
        """A step that computes `tokens` tokens starts its forward at `now` (seconds)."""
        self._step = (tokens, now) if tokens >= MIN_PREFILL_TOKENS else None

    def step_ended(self, now: float) -> None:
        """The forward of the step last started ended at `now`."""
        if self._step is None:
            return
        tokens, started = self._step
        self._step = None
        if now <= started:
            return
        rate = tokens / (now - started)
        previous = self.tokens_per_second
        self.tokens_per_second = rate if previous is None else ALPHA * rate + (1 - ALPHA) * previous
