"""`kvmoq bench codec` end to end on a short prompt: the figures it writes are the codecs' own."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.kvcache.codecs.int4 import INT4
from sidecar.kvcache.layout import KVLayout
from sidecar.transfer.track_quality import MEASURED

pytestmark = [pytest.mark.model, pytest.mark.slow]

FIGURES = {"bits_per_element", "ratio_vs_fp16", "kl", "top1", "encode_mbps", "decode_mbps"}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = Path(tmp_path_factory.mktemp("bench")) / "codec.json"
    argv = ["bench", "codec", "--codecs", "fp16,int4", "--tokens", "320", "--context", "256"]
    argv += ["--score", "64", "--texts", "pydoc,code", "--repeats", "1", "--json", str(path)]
    assert main(argv) == 0
    return json.loads(path.read_text())


def test_every_compression_has_every_figure(result: dict[str, Any]) -> None:
    assert set(result["codecs"]) == {"fp16", "int4"}
    for figures in [*result["codecs"].values(), result["baseline_cachegen"]]:
        assert set(figures) >= FIGURES
        assert all(math.isfinite(figures[key]) for key in FIGURES)
        assert figures["encode_mbps"] > 0 and figures["decode_mbps"] > 0


def test_sizes_are_the_payload_sizes(result: dict[str, Any]) -> None:
    layout = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, dtype="float16")
    int4 = result["codecs"]["int4"]
    expected_bits = 8 * INT4.payload_size(layout) / layout.elements_per_token
    assert int4["bits_per_element"] == pytest.approx(expected_bits)
    assert int4["ratio_vs_fp16"] == pytest.approx(16 / expected_bits)


def test_quality_orders_the_compressions(result: dict[str, Any]) -> None:
    fp16, int4 = result["codecs"]["fp16"], result["codecs"]["int4"]
    assert fp16["kl"] < 1e-4 and fp16["top1"] >= 0.98
    for text in ("pydoc", "code"):
        scored = fp16["quality"][text]["after256"]
        assert scored["ppl"] == pytest.approx(
            result["setup"]["reference_ppl"][text]["after256"], rel=1e-3
        )
    assert int4["kl"] > fp16["kl"]
    worst = max(q["kl"] for places in int4["quality"].values() for q in places.values())
    assert int4["kl"] == worst
    assert result["baseline_cachegen"]["bits_per_element"] < 16


def test_each_track_is_measured_as_served_and_checked_against_the_floor_table(
    result: dict[str, Any],
) -> None:
    """As served (the context's last chunk on int8), int4 does better than alone; the JSON
    says whether the figures loads plan by still hold for what was measured."""
    int4 = result["codecs"]["int4"]
    worst = max(q["kl"] for places in int4["served_quality"].values() for q in places.values())
    assert int4["served_kl"] == worst < int4["kl"]
    floor = result["floor_figures"]
    assert floor["tracks"]["int4"]["table"] == asdict(MEASURED["int4"])
    assert floor["tracks"]["int4"]["served"] == int4["served_kl"]
    assert floor["holds"] == all(entry["holds"] for entry in floor["tracks"].values())


def test_turboquant_is_measured_at_each_width_and_compared_as_served(
    result: dict[str, Any],
) -> None:
    """TurboQuant's payloads are b bits per coordinate and a float32 norm per head vector of
    64: b + 0.5 bits per element; each track meets the width that spends at least as much."""
    turboquant = result["baseline_turboquant"]
    assert set(turboquant) == {"2", "3", "4"}
    for bits, figures in turboquant.items():
        assert figures["bits_per_element"] == pytest.approx(int(bits) + 0.5, abs=1e-3)
        assert figures["served_kl"] < figures["kl"]
    assert turboquant["2"]["kl"] > turboquant["3"]["kl"] > turboquant["4"]["kl"]
    int4 = result["versus_turboquant"]["tracks"]["int4"]
    assert int4["turboquant_bits"] == 4
    assert int4["met"] == (int4["served_kl"] <= turboquant["4"]["served_kl"])
    assert "fp16" not in result["versus_turboquant"]["tracks"]  # wider than every width
