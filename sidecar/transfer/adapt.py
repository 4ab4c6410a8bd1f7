"""Which track to fetch each chunk on, so that a whole load meets its deadline.

CacheGen's rule (§5.3 of the paper, `config_selection` in its artifact): the time left is
shared equally among the chunks left, and each chunk takes the best quality whose bytes arrive
within its share at the throughput measured so far. A chunk finished early leaves its slack to
the ones after it. When even the smallest track does not fit, loading stops: the KV cache must
be a contiguous prefix (attention is causal), so skipping one chunk would waste every chunk
after it, and the model server recomputes the rest from the token ids.

Pure functions of measurements; the subscriber owns the clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

QUALITY_ORDER: tuple[str, ...] = ("fp16", "bf16", "int8", "fp8", "ac", "int4", "fp4")
"""Best first. fp16 keeps 10 mantissa bits against bf16's 7, and KV values stay far inside
fp16's range; int8 resolves 255 levels per (token, layer, K|V) scale where fp8 (e4m3) has 3
mantissa bits; `ac` quantizes to 16-32 levels before entropy coding, so it sits between 8 and
4 bits; int4 (15 uniform levels) beats fp4 (e2m1), whose levels crowd near zero. Revisit with
the codecs' measured KL on real KV."""

DEFAULT_PRIOR_BYTES_PER_SECOND = 125e6
"""1 Gbit/s before the first measurement: the low end of a datacenter link, so the first
chunk errs towards a smaller track rather than a missed deadline."""

DEFAULT_ALPHA = 0.3
"""Weight of the newest sample: a few chunks of memory, enough to follow a link that changes
under load without jumping on one slow chunk."""


@dataclass(frozen=True, slots=True)
class ThroughputEstimate:
    """EWMA of the measured throughput of chunk transfers; the prior counts until replaced."""

    bytes_per_second: float = DEFAULT_PRIOR_BYTES_PER_SECOND
    alpha: float = DEFAULT_ALPHA
    samples: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bytes_per_second) and self.bytes_per_second > 0):
            raise ValueError(f"throughput must be positive, got {self.bytes_per_second}")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")

    def observe(self, nbytes: int, seconds: float) -> ThroughputEstimate:
        """The estimate after `nbytes` arrived in `seconds`; the first sample replaces the prior."""
        if nbytes <= 0 or not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"a sample needs bytes > 0 and seconds > 0, got {nbytes}, {seconds}")
        rate = nbytes / seconds
        weight = self.alpha if self.samples else 1.0
        return dataclasses.replace(
            self,
            bytes_per_second=weight * rate + (1 - weight) * self.bytes_per_second,
            samples=self.samples + 1,
        )


def choose_track(
    chunk_bytes: Mapping[str, int],
    bytes_per_second: float,
    time_left: float,
    chunks_left: int,
    quality_order: Sequence[str] = QUALITY_ORDER,
) -> str | None:
    """The best track whose bytes for this chunk fit its share of the time left; None: stop
    and leave this chunk and all after it to recompute.

    `chunk_bytes` is the catalog's size of this chunk per track on offer; `chunks_left`
    counts this chunk. Tracks missing from `quality_order` are never chosen, so a subscriber
    narrows the choice by passing a shorter order.
    """
    if chunks_left < 1:
        raise ValueError(f"chunks_left counts this chunk, got {chunks_left}")
    budget = max(time_left, 0.0) / chunks_left * bytes_per_second
    return next(
        (track for track in quality_order if track in chunk_bytes and chunk_bytes[track] <= budget),
        None,
    )
