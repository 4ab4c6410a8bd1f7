"""Every codec against its quality goal on SmolLM2's real KV (slow: a model forward per codec).

A 3072-token pydoc context is compressed chunk by chunk (ac tables fitted on the first chunk
only, as a publisher must while prefill runs), decompressed, loaded into the model, and the
next 1024 tokens are scored against the uncompressed run (sidecar.models.quality).
"""

from __future__ import annotations

import pytest
import torch

from bench.cachegen_baseline import cachegen_roundtrip
from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.layout import KVLayout, iter_chunks
from sidecar.models.quality import evaluate

pytestmark = [pytest.mark.slow, pytest.mark.model]

KL_GOALS = {
    "fp16": 1e-5,
    "bf16": 5e-4,
    "int8": 2e-4,
    "fp8": 2e-3,
    "int4": 0.04,
    "fp4": 0.04,
    "ac": 0.03,
}


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


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_kl_within_goal(name: str) -> None:
    quality = evaluate(CodecRoundTrip(name))
    assert quality.kl <= KL_GOALS[name]
    if name == "ac":
        assert quality.top1 >= 0.92


def test_ac_beats_cachegen_by_half_again_at_no_worse_kl() -> None:
    ac = CodecRoundTrip("ac")
    baseline: dict[str, int] = {}

    def cachegen(kv: torch.Tensor) -> torch.Tensor:
        result = cachegen_roundtrip(kv)
        baseline["bytes"] = result.total_bytes
        baseline["elements"] = kv.numel()
        return result.kv

    ac_quality = evaluate(ac)
    cachegen_quality = evaluate(cachegen)
    ac_ratio = ac.ratio_vs_fp16(baseline["elements"])
    cachegen_ratio = 2 * baseline["elements"] / baseline["bytes"]
    assert ac_ratio >= 5.5
    assert ac_ratio >= 1.5 * cachegen_ratio
    assert ac_quality.kl <= cachegen_quality.kl * 1.01
