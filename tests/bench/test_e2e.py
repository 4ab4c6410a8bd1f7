"""`kvmoq bench e2e` at a tiny size: real relay, prefill process and SmolLM2, no link limits,
internet-sized packets; its JSON and its plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.demo.children import python_with
from sidecar.moqt.aio.quic_backend import INTERNET_DATAGRAM_SIZE, fastest_relay_backend
from tests.support.bench_run import assert_png, run_bench

pytestmark = [pytest.mark.slow, pytest.mark.model]

TOKENS = 256
LOADS = {"int8", "ac", "adaptive"}


def test_e2e_reports_every_figure_with_sane_values(tmp_path: Path) -> None:
    report_path, plot_path = tmp_path / "e2e.json", tmp_path / "e2e.png"
    run = run_bench(
        "e2e",
        report_path,
        *("--tokens", str(TOKENS), "--limits", "none", "--repeat", "1", "--plot", str(plot_path)),
        *("--max-datagram-size", str(INTERNET_DATAGRAM_SIZE)),
        timeout=900,
    )
    report, result = run.report, run.result

    # Every session at 1350 bytes, the relay on the fastest stack installed for that size.
    assert report["datagram_size"] == INTERNET_DATAGRAM_SIZE
    assert report["relay_backend"] == fastest_relay_backend(
        INTERNET_DATAGRAM_SIZE, lambda name: python_with(name) is not None
    )

    assert report["tokens"] == TOKENS
    assert report["recompute_s"] > 0
    for figure in ("load_s", "wire_bytes", "kl", "speedup", "loaded_tokens", "tracks_used"):
        assert set(report[figure]) == LOADS, figure
    assert all(report["loaded_tokens"][load] == TOKENS for load in LOADS)
    assert all(0 < report["load_s"][load] < 60 for load in LOADS)
    assert all(0 <= report["kl"][load] < 1 for load in LOADS)
    assert report["tracks_used"]["int8"] == {"int8": TOKENS // 128}
    assert report["wire_bytes"]["ac"] < report["wire_bytes"]["int8"]
    assert report["kl"]["int8"] < 1e-3
    best = report["best_track"]
    assert best in LOADS
    assert report["speedup_vs_recompute"] == pytest.approx(
        report["recompute_s"] / report["load_s"][best]
    )
    assert report["goal"]["met"] == (report["speedup_vs_recompute"] >= 5)
    assert report["links"] == {}
    assert report["links_skipped"] == "--limits none"
    assert set(report["lookup_estimates"]) == {"loopback"}
    estimate = report["lookup_estimates"]["loopback"]
    assert estimate["load_s"] == report["load_s"]["adaptive"] and estimate["estimate_s"] > 0
    assert estimate["error"] == pytest.approx(estimate["estimate_s"] / estimate["load_s"] - 1)
    goal = report["estimate_goal"]
    assert goal["met"] == (abs(estimate["error"]) <= 0.3) and goal["worst"] == abs(
        estimate["error"]
    )
    assert "recompute" in result.stdout and "Goal:" in result.stdout
    assert_png(plot_path)
    assert run.leftovers() == []
