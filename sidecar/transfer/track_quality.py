"""What each track costs the model's answer, as measured, and the bound a load keeps to.

A load is judged as a decode server gets it, not track by track: the tokens a server
generates first attend hardest to the prompt's most recent tokens, so a 4-bit load whose
last chunk is on int8 keeps about half the KL of one all on 4 bits. Each track therefore has
two figures from `kvmoq bench codec` (worst over three texts and two places): **alone**,
every chunk on it, which is what the prompt's last chunk costs on that track; and **served**,
every chunk but the most recent on it and that one on int8, which is what any other chunk
costs. A load's expected KL is the worst figure among the chunks it wrote; the tokens it
leaves to compute cost nothing.

`TrackChoice.max_kl` is the floor: a chunk may go only on tracks whose figure for its place
is within it, and where none of those lands in time the load leaves the chunk, and all after
it, to compute. The default admits only near-lossless tracks, so nobody's model output moves
to a 4-bit or `ac` chunk without asking for it.

The figures are SmolLM2-135M's (30 layers, 3 KV heads, head dim 64), the one model the codec
bench measures here, and every model's loads plan by them: the rotation and per-token scales
make the error per element independent of a model's scale, but not its effect on another
model's answer, which only a bench on that model measures.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TrackQuality:
    alone: float
    """Worst KL with every chunk on the track."""
    served: float
    """Worst KL with every chunk but the most recent on the track and that one on int8, or the
    track alone where that is lower (a track better than int8)."""


SERVED_RECENT_TRACK = "int8"
"""The most recent chunk's track in the figures as served (`kvmoq bench codec` measures them
so): the better of the 8-bit tracks, the smallest any floor of 1e-3 or looser admits there."""

MEASURED: dict[str, TrackQuality] = {
    "fp16": TrackQuality(alone=2.5e-07, served=2.5e-07),
    "bf16": TrackQuality(alone=2.41e-05, served=2.41e-05),
    "int8": TrackQuality(alone=1.04e-04, served=1.04e-04),
    "fp8": TrackQuality(alone=3.07e-04, served=1.36e-04),
    "int4": TrackQuality(alone=1.55e-02, served=6.88e-03),
    "fp4": TrackQuality(alone=1.57e-02, served=6.92e-03),
    "ac": TrackQuality(alone=8.37e-02, served=3.18e-02),
}
"""Each track's figures as `kvmoq bench codec` measured them (docs/benchmarks.md, "Codecs"),
rounded up in the last digit shown; the bench says in its JSON whether its figures are still
within these (`KL_NOISE` aside)."""

KL_NOISE = 1e-6
"""The model's own run-to-run KL on the same KV (2.43e-07 to 2.47e-07 for fp16, an exact
cast): far under every lossy figure, but as large as the near-lossless ones, so a check of
measured figures against `MEASURED` allows it."""

DEFAULT_MAX_KL = 1e-3
"""Admits fp16, bf16, int8 and fp8 (the near-lossless tracks) everywhere, nothing else."""


def rank_by_quality(kl: Mapping[str, float]) -> tuple[str, ...]:
    """Tracks best first: lower KL first, and at equal KL the name, so the order is total.

    Size needs no place in the key: the deadline rule takes the first track that fits, so a
    track that is both larger and worse than another is never chosen whatever its rank.
    """
    return tuple(sorted(kl, key=lambda track: (kl[track], track)))


QUALITY_ORDER: tuple[str, ...] = rank_by_quality({t: q.alone for t, q in MEASURED.items()})
"""Best first, by measured quality alone: fp16 bf16 int8 fp8 int4 fp4 ac."""


def chunk_kl(track: str, recent: bool) -> float:
    """What a chunk on `track` costs the load: its `alone` figure if it is the prompt's most
    recent chunk, else its `served` one; infinite for a track never measured."""
    quality = MEASURED.get(track)
    if quality is None:
        return math.inf
    return quality.alone if recent else quality.served


@dataclass(frozen=True, slots=True)
class TrackChoice:
    """The tracks a load may take, best first, and the KL its chunks must keep within."""

    order: tuple[str, ...] = QUALITY_ORDER
    max_kl: float = DEFAULT_MAX_KL

    def __post_init__(self) -> None:
        if not self.max_kl > 0:  # also NaN
            raise ValueError(f"max_kl is a KL bound > 0 (inf: none), got {self.max_kl}")
        if not self.admitted(recent=False):
            measured = ", ".join(f"{t} {chunk_kl(t, False):.3g}" for t in self.order)
            raise ValueError(
                f"no track of {list(self.order) or 'none'} is within max_kl {self.max_kl:g}"
                f" (measured KL as served: {measured or '-'}); name better tracks or a"
                " larger max_kl"
            )

    @classmethod
    def only(cls, track: str) -> TrackChoice:
        """One track whatever it costs: a load that measures the track itself."""
        return cls((track,), math.inf)

    def admitted(self, recent: bool) -> tuple[str, ...]:
        """The tracks, best first, that a chunk may take: the prompt's most recent chunk
        (`recent`) or another."""
        return tuple(t for t in self.order if chunk_kl(t, recent) <= self.max_kl)

    def refuses(self, offered: Collection[str], recent: bool) -> bool:
        """Whether the floor alone stops a chunk offered on `offered`: a track named is on
        offer, none of those within the floor is."""
        named = any(t in offered for t in self.order)
        return named and not any(t in offered for t in self.admitted(recent))


DEFAULT_CHOICE = TrackChoice()
"""Every track, best first, within `DEFAULT_MAX_KL`."""
