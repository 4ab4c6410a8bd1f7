"""The quality floor: which tracks a chunk may take, from the measured figures."""

from __future__ import annotations

import math
import re

import pytest

from sidecar.kvcache.naming import PAYLOAD_TRACKS
from sidecar.transfer.track_quality import (
    DEFAULT_CHOICE,
    MEASURED,
    QUALITY_ORDER,
    TrackChoice,
    chunk_kl,
)

NEAR_LOSSLESS = ("fp16", "bf16", "int8", "fp8")


def test_every_track_is_measured_and_served_is_never_worse_than_alone() -> None:
    assert sorted(MEASURED) == sorted(PAYLOAD_TRACKS)
    for track, quality in MEASURED.items():
        assert 0 < quality.served <= quality.alone, track


def test_the_default_floor_admits_the_near_lossless_tracks_only() -> None:
    for recent in (True, False):
        assert DEFAULT_CHOICE.admitted(recent) == NEAR_LOSSLESS


def test_a_looser_floor_admits_4_bits_everywhere_but_the_most_recent_chunk() -> None:
    """As served, a 4-bit load with its last chunk on int8 keeps under 0.01; all on 4 bits
    does not, so the most recent chunk stays near-lossless."""
    choice = TrackChoice(max_kl=0.01)
    assert choice.admitted(recent=True) == NEAR_LOSSLESS
    assert choice.admitted(recent=False) == (*NEAR_LOSSLESS, "int4", "fp4")
    assert TrackChoice(max_kl=0.1).admitted(recent=False) == QUALITY_ORDER
    assert TrackChoice.only("ac").admitted(recent=True) == ("ac",)


def test_the_order_asked_for_is_kept_within_the_floor() -> None:
    choice = TrackChoice(("int4", "int8", "fp16"), max_kl=0.01)
    assert choice.admitted(recent=False) == ("int4", "int8", "fp16")
    assert choice.admitted(recent=True) == ("int8", "fp16")


def test_the_floor_refuses_a_chunk_only_when_a_named_track_is_offered_outside_it() -> None:
    assert DEFAULT_CHOICE.refuses({"int4", "ac"}, recent=False)
    assert not DEFAULT_CHOICE.refuses({"int4", "int8"}, recent=False)
    assert not TrackChoice(("fp16",), math.inf).refuses({"int4"}, recent=False)  # not named


@pytest.mark.parametrize(
    ("order", "max_kl", "words"),
    [
        (("ac",), 1e-3, "no track of ['ac'] is within max_kl 0.001"),
        (QUALITY_ORDER, 1e-9, "within max_kl 1e-09"),
        (QUALITY_ORDER, 0.0, "max_kl is a KL bound > 0"),
        (QUALITY_ORDER, math.nan, "max_kl is a KL bound > 0"),
        (QUALITY_ORDER, -1.0, "max_kl is a KL bound > 0"),
    ],
)
def test_a_floor_no_track_meets_is_refused_with_the_figures(
    order: tuple[str, ...], max_kl: float, words: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        TrackChoice(order, max_kl)


def test_a_track_never_measured_costs_infinitely() -> None:
    assert chunk_kl("zstd", recent=False) == math.inf
    assert chunk_kl("int4", recent=True) == MEASURED["int4"].alone
    assert chunk_kl("int4", recent=False) == MEASURED["int4"].served
