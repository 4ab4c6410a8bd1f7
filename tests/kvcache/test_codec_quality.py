"""Every codec against its quality bound on SmolLM2's real KV, on every text and at both places.

Slow: a model forward per codec, text and place. Each text's context is compressed chunk by
chunk (ac tables fitted on its first chunk only, as a publisher must while prefill runs),
decompressed, loaded into the model, and the tokens after it are scored against the
uncompressed run (sidecar.models.quality): the 64 right after a 4096-token prompt and 1024
after a 3072-token one. The bounds are the issue's goals where they are met and, where not
yet, the measured worst case with a small margin (docs/benchmarks.md, "Codecs"), so a change
that makes any text or place worse fails here.
"""

from __future__ import annotations

import functools

import pytest
import torch

from bench.cachegen_baseline import cachegen_roundtrip
from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.layout import KVLayout, iter_chunks
from sidecar.models.corpus import TEXTS
from sidecar.models.quality import LONG_RUN, PLACES, Place, Quality, evaluate_at

pytestmark = [pytest.mark.slow, pytest.mark.model]

KL_BOUNDS = {
    "fp16": 1e-5,
    "bf16": 5e-4,
    "int8": 2e-4,
    "fp8": 1e-3,
    "int4": 0.02,
    "fp4": 0.022,
    "ac": 0.1,
}
"""Worst KL allowed over every text and place."""


class CodecRoundTrip:
    """kv -> payloads -> kv through one codec, counting the bytes it would ship."""

    def __init__(self, name: str) -> None:
        self.codec = get_codec(name)
        self.shipped = 0

    def __call__(self, kv: torch.Tensor) -> torch.Tensor:
        layout = KVLayout(kv.shape[0], kv.shape[3], kv.shape[4], dtype="float32")
        tables = self.codec.fit_tables(layout, kv[:, :, :128])
        self.shipped = len(tables or b"")
        restored = torch.empty_like(kv)
        start = 0
        for chunk in iter_chunks(kv, layout):
            payloads = self.codec.encode(chunk, layout, tables)
            self.shipped += sum(len(p) for p in payloads)
            stop = start + chunk.shape[2]
            self.codec.decode(payloads, layout, tables, out=restored[:, :, start:stop])
            start = stop
        return restored

    def ratio_vs_fp16(self, kv_elements: int) -> float:
        return 2 * kv_elements / self.shipped


@functools.cache
def judged(name: str, text: str, place: Place) -> tuple[Quality, CodecRoundTrip]:
    """A codec's quality at one text and place, and its round trip (bytes shipped): each
    costs a model forward of up to 1024 tokens, so the tests below that judge the same
    codec at the same place share one (the whole file runs in one process)."""
    roundtrip = CodecRoundTrip(name)
    return evaluate_at(roundtrip, text, place), roundtrip


@pytest.mark.parametrize("name", CODEC_NAMES)
@pytest.mark.parametrize("text", list(TEXTS))
@pytest.mark.parametrize("place", PLACES, ids=lambda place: place.name)
def test_kl_within_bound(name: str, text: str, place: Place) -> None:
    quality, _ = judged(name, text, place)
    assert quality.kl <= KL_BOUNDS[name]


def test_the_rotation_at_least_halves_int4s_kl() -> None:
    """The same int4 grid without the Hadamard rotation (one scale per head) is far worse."""

    def unrotated_int4(kv: torch.Tensor) -> torch.Tensor:
        heads = kv.half().float()
        scale = (heads.abs().amax(dim=-1, keepdim=True) / 7).half().float().clamp_min(2**-24)
        return torch.round(heads / scale).clamp(-7, 7) * scale

    rotated, _ = judged("int4", "pydoc", LONG_RUN)
    plain = evaluate_at(unrotated_int4, "pydoc", LONG_RUN)
    assert rotated.kl * 2 < plain.kl


def test_ac_beats_cachegen_by_half_again_at_no_worse_kl() -> None:
    """Both on the pydoc text's long run."""
    ac_quality, ac = judged("ac", "pydoc", LONG_RUN)
    baseline: dict[str, int] = {}

    def cachegen(kv: torch.Tensor) -> torch.Tensor:
        result = cachegen_roundtrip(kv)
        baseline["bytes"] = result.total_bytes
        baseline["elements"] = kv.numel()
        return result.kv

    cachegen_quality = evaluate_at(cachegen, "pydoc", LONG_RUN)
    ac_ratio = ac.ratio_vs_fp16(baseline["elements"])
    cachegen_ratio = 2 * baseline["elements"] / baseline["bytes"]
    assert ac_ratio >= 5.5
    assert ac_ratio >= 1.5 * cachegen_ratio
    assert ac_quality.kl <= cachegen_quality.kl * 1.01
