"""Which track to fetch each chunk on, so that a whole load meets its deadline.

CacheGen's rule (§5.3 of the paper, `config_selection` in its artifact): the time left is
shared among the chunks left, and each chunk takes the best quality whose bytes arrive
within its share at the throughput measured so far. A chunk finished early leaves its slack to
the ones after it. The KV cache must be a contiguous prefix (attention is causal), so
skipping one chunk would waste every chunk after it; the model server recomputes whatever
the load leaves from the token ids.

One change to CacheGen's stop: where no track fits a chunk's share, the chunk still loads on
the track that lands soonest if it lands before the deadline, and the load stops only when
nothing can. The deadline is what the caller lets a load take instead of computing, so a
chunk in by then is a chunk fewer to compute; the share only spreads quality over the
chunks. Stopping at the share let one slow throughput sample end a whole load with most of
its deadline unused.

One addition: where the model server says how fast it computes a prompt itself (its prefill
rate), a chunk prefers the tracks whose bytes arrive sooner than the server would compute
its tokens (`paying_tracks`). The server computes whatever a load leaves after the load
ends, so a chunk that arrives later than its compute would take makes the first token later
than leaving it would. A load whose first chunk no track brings in that time loads nothing
(every later chunk is as large, and the KV must stay a contiguous prefix); the subscriber
decides that once, at the first chunk, on the rates earlier loads measured, as a load's own
first samples are its slowest. Without the rate, a slow link spends the whole deadline on
chunks that cost more than they save.

One change to CacheGen's equal shares: the load's most recent chunk weighs `RECENT_WEIGHT`
shares, because the tokens a decode server generates first attend hardest to the most recent
ones (KIVI keeps a recent window in full precision for the same reason): a 4-bit load with
its last chunk on int8 keeps about half the KL of one all on 4 bits (docs/benchmarks.md,
"Codecs").

Pure functions of measurements, and the estimates built on them (Lookup's seconds for a load);
the subscriber owns the clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.transfer.track_quality import DEFAULT_CHOICE, QUALITY_ORDER, TrackChoice

if TYPE_CHECKING:
    # Only its methods are used: adapt stays importable without torch.
    from sidecar.kvcache.catalog import Catalog

RECENT_WEIGHT = 2.0
"""Shares of the time left that the load's most recent chunk may take: enough for an 8-bit
chunk while the others go on 4 bits, at 3% less time for each of the other 31 of a
4096-token load."""

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


def time_share(time_left: float, chunks_left: int, *, last_is_recent: bool = True) -> float:
    """This chunk's seconds: the time left over the shares of the chunks left, where the
    last chunk, when it is the load's most recent, counts `RECENT_WEIGHT` shares. The last
    chunk itself gets all the time left.

    `chunks_left` counts this chunk. A load spread over several sessions passes
    `last_is_recent=False` for every part but the one that ends the load.
    """
    if chunks_left < 1:
        raise ValueError(f"chunks_left counts this chunk, got {chunks_left}")
    if chunks_left == 1:
        return max(time_left, 0.0)
    last = RECENT_WEIGHT if last_is_recent else 1.0
    return max(time_left, 0.0) / (chunks_left - 1 + last)


def choose_track(
    chunk_bytes: Mapping[str, int],
    bytes_per_second: float,
    time_left: float,
    chunks_left: int,
    quality_order: Sequence[str] = QUALITY_ORDER,
    *,
    last_is_recent: bool = True,
    track_rates: Mapping[str, float] | None = None,
) -> str | None:
    """The best track whose bytes for this chunk fit its share of the time left
    (`time_share`); where none does, the one that lands soonest if it lands within the time
    left; None: nothing lands in time, so stop and leave this chunk and all after it to
    recompute.

    `chunk_bytes` is the catalog's size of this chunk per track on offer; `chunks_left`
    counts this chunk. Tracks missing from `quality_order` are never chosen, so a subscriber
    narrows the choice by passing a shorter order. Each track is timed at its own measured
    rate (`track_rates`, bytes per second) where there is one, else at `bytes_per_second`:
    `ac`'s decoding makes its bytes arrive ten times slower than fp16's on loopback, and a
    rate that mixes the two refused fp16 loads that fitted with room to spare.
    """
    share = time_share(time_left, chunks_left, last_is_recent=last_is_recent)
    seconds = _Timing(chunk_bytes, bytes_per_second, track_rates or {})
    offered = [track for track in quality_order if track in chunk_bytes]
    best = next((track for track in offered if seconds(track) <= share), None)
    if best is not None:
        return best
    soonest = min(offered, key=seconds, default=None)
    return soonest if soonest is not None and seconds(soonest) <= time_left else None


def paying_tracks(
    chunk_bytes: Mapping[str, int],
    bytes_per_second: float,
    tracks: Sequence[str],
    compute_seconds: float,
    track_rates: Mapping[str, float] | None = None,
) -> list[str]:
    """Those of `tracks` on offer (`chunk_bytes`) that bring this chunk within
    `compute_seconds`, the time the model server would take to compute its tokens, each
    timed as `choose_track` times it; in `tracks`' order."""
    seconds = _Timing(chunk_bytes, bytes_per_second, track_rates or {})
    return [t for t in tracks if t in chunk_bytes and seconds(t) <= compute_seconds]


@dataclass(frozen=True, slots=True)
class _Timing:
    """Seconds a chunk's bytes take on a track: at the track's own measured rate where
    there is one, else at the rate measured over all tracks."""

    chunk_bytes: Mapping[str, int]
    bytes_per_second: float
    track_rates: Mapping[str, float]

    def __call__(self, track: str) -> float:
        return self.chunk_bytes[track] / self.track_rates.get(track, self.bytes_per_second)


def chunk_sizes(catalog: Catalog, chunks: int) -> list[dict[str, int]]:
    """The bytes of each of the first `chunks` chunks on every track: the catalog's where the
    chunk is described, else (prefill still running upstream) at the bytes per token of
    the chunks that are. The catalog must describe at least one chunk."""
    ready = min(chunks, catalog.ready_chunks)
    sizes = [catalog.chunk_bytes(index) for index in range(ready)]
    if ready == chunks:
        return sizes
    described = range(catalog.ready_chunks)
    tokens = catalog.chunk_span(described[-1]).stop
    per_token = {
        track.name: sum(catalog.chunk_bytes(i)[track.name] for i in described) / tokens
        for track in catalog.tracks
    }
    for index in range(ready, chunks):
        span = len(catalog.chunk_span(index))
        sizes.append({track: round(rate * span) for track, rate in per_token.items()})
    return sizes


def load_seconds_estimate(
    chunk_bytes: Sequence[Mapping[str, int]],
    bytes_per_second: float,
    budget: float,
    choice: TrackChoice = DEFAULT_CHOICE,
    track_rates: Mapping[str, float] | None = None,
) -> float:
    """Seconds to fetch these chunks, each on the track the deadline rule
    (`transfer.adapt.choose_track`) picks among those `choice` admits for it (the last
    chunk is the most recent) for a load given `budget` seconds, and taking as long as that
    track's own measured rate says (`track_rates`, bytes per second by track) where there is
    one, else `bytes_per_second`, as the rule times it.

    Where the rule would stop because nothing lands within the budget, the remaining chunks
    count at their quickest admitted track: the estimate then exceeds the budget, which
    tells a model server that a load in that time would leave the rest to compute. A chunk
    that no track on offer may take ends the load there (the rest is computed).
    """
    rates = track_rates or {}
    elapsed = 0.0
    for index, sizes in enumerate(chunk_bytes):
        admitted = choice.admitted(recent=index == len(chunk_bytes) - 1)
        offered = [name for name in admitted if name in sizes]
        if not offered:
            break
        track = choose_track(
            sizes,
            bytes_per_second,
            budget - elapsed,
            len(chunk_bytes) - index,
            offered,
            track_rates=rates,
        )
        seconds = _Timing(sizes, bytes_per_second, rates)
        elapsed += seconds(track if track is not None else min(offered, key=seconds))
    return elapsed
