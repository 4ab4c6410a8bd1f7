"""`kvmoq bench vllm` at a tiny size: four real vLLM engines, two sidecars and a relay, then
Mooncake's two vLLM servers, no link limits; its JSON, its goals and its plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import mooncake
from sidecar.demo.vllm_engines import unavailable_reason
from tests.support.bench_run import assert_png, run_bench

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(900)]

TOKENS = 512
TRACKS = ("fp16", "int8")
DEADLINE_S = 60
"""Loads this short are done long before; half the recompute time (0.4 s at this size) would
have the deadline rule refuse the fp16 load on a busy machine, and this test is about the
figures, not the rule."""


def test_vllm_bench_reports_every_row_with_sane_values(tmp_path: Path) -> None:
    if reason := unavailable_reason():
        pytest.skip(reason)
    assert mooncake.unavailable_reason() is None  # scripts/setup.sh installs it
    report_path, plot_path = tmp_path / "vllm.json", tmp_path / "vllm.png"
    run = run_bench(
        "vllm",
        report_path,
        "--tokens", str(TOKENS), "--tracks", ",".join(TRACKS), "--limits", "none",
        "--repeat", "1", "--deadline", str(DEADLINE_S), "--plot", str(plot_path),
        timeout=900,
    )  # fmt: skip
    report = run.report

    assert report["tokens"] == TOKENS and report["recompute_s"] > 0
    rows = {(row["method"], row["link"]): row for row in report["rows"]}
    kvmoq = [(f"kvmoq {label}", "loopback") for label in (*TRACKS, "adaptive")]
    assert set(rows) == {
        ("recompute", "-"),
        ("vLLM prefix cache, same engine", "local"),
        ("vLLM ExampleConnector, local files", "disk"),
        ("Mooncake, P to D", "loopback"),
        *kvmoq,
    }
    for row in report["rows"]:
        assert row["speedup"] == pytest.approx(report["recompute_s"] / row["ttft_s"])
    assert rows[("recompute", "-")]["tokens_loaded"] == 0
    for key in (
        ("vLLM prefix cache, same engine", "local"),
        ("vLLM ExampleConnector, local files", "disk"),
    ):
        assert 0 < rows[key]["tokens_loaded"] < TOKENS, rows[key]  # whole blocks, not the last
    for key in kvmoq:
        row = rows[key]
        # Every chunk arrived (the prompt is 4 chunks).
        assert sum(row["chunks"].values()) == TOKENS // 128, row
        # Every prompt token but the last, which vLLM computes to make the first new one.
        assert row["tokens_loaded"] == TOKENS - 1, row
        assert 0 <= row["kl"] < 0.05, row
    # Mooncake's D computes none of the prompt and gets vLLM's KV as it was (its KL is the
    # bf16 engine's own: a decode over a loaded KV against a whole prefill).
    peer = rows[("Mooncake, P to D", "loopback")]
    assert peer["tokens_loaded"] == TOKENS and peer["same_text"] and peer["kl"] < 0.01, peer
    assert rows[("kvmoq fp16", "loopback")]["chunks"] == {"fp16": TOKENS // 128}
    assert rows[("kvmoq int8", "loopback")]["chunks"] == {"int8": TOKENS // 128}
    mix = report["mix"]
    assert mix["requests"] == 8 and mix["hits"] == 4
    assert mix["tokens"] == TOKENS  # the mix's prompts are no longer than the main one
    assert mix["speedup"] == pytest.approx(mix["recompute_s"] / mix["kvmoq_s"])
    goals = report["goals"]
    assert goals["adaptive_never_worse"]["met"] == (
        rows[("kvmoq adaptive", "loopback")]["ttft_s"] <= report["recompute_s"]
    )
    # fp16 and int8 alone, and adaptive at the default floor: near-lossless tracks only.
    best = min((rows[key] for key in kvmoq), key=lambda row: row["ttft_s"])
    for name, factor in (("mooncake_loopback", 1.25), ("mooncake_relay", 2.0)):
        assert goals[name]["best"] == best["method"], goals[name]
        assert goals[name]["ratio"] == pytest.approx(best["ttft_s"] / peer["ttft_s"])
        assert goals[name]["met"] == (goals[name]["ratio"] <= factor)
    # No limited link ran, so nothing shows kvmoq ahead there.
    assert goals["mooncake_limited"]["speedup"] == {} and not goals["mooncake_limited"]["met"]
    assert report["links"] == {} and report["links_skipped"] == "--limits none"
    assert report["not_run_here"] == "LMCache and NIXL (they need CUDA)"
    assert "ExampleConnector" in run.result.stdout and "Mooncake" in run.result.stdout
    assert "Goal mooncake_relay" in run.result.stdout
    assert_png(plot_path)
    assert run.leftovers() == []
