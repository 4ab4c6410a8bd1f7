"""`kvmoq bench parallel` at a tiny size: a real relay, sessions and worker processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench_run import run_bench

TOKENS = 512
FP16_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2
WAYS = [("single", 1), ("sessions", 2), ("processes", 2)]


def test_parallel_bench_reports_every_way_and_leaves_nothing_running(tmp_path: Path) -> None:
    report_path = tmp_path / "parallel.json"
    run = run_bench(
        "parallel",
        report_path,
        *("--tokens", str(TOKENS), "--tracks", "int8,fp16", "--connections", "2"),
        *("--repeat", "1"),
    )
    report, result = run.report, run.result

    assert report["tokens"] == TOKENS and report["repeat"] == 1
    assert set(report["tracks"]) == {"int8", "fp16"}
    for figures in report["tracks"].values():
        rows = figures["loads"]
        assert [(row["how"], row["connections"]) for row in rows] == WAYS
        assert all(row["seconds"] > 0 and row["loaders_cpu_s"] > 0 for row in rows)
        assert all(row["relay_cpu_s"] >= 0 for row in rows)  # 10 ms ticks: may read 0
        for row in rows:
            mbps = figures["payload_bytes"] / row["seconds"] / 1e6
            assert row["mbps"] == pytest.approx(mbps)
            assert row["vs_single"] == pytest.approx(rows[0]["seconds"] / row["seconds"])
    fp16, int8 = (report["tracks"][t]["payload_bytes"] for t in ("fp16", "int8"))
    assert TOKENS * FP16_BYTES_PER_TOKEN <= fp16 < 1.01 * TOKENS * FP16_BYTES_PER_TOKEN
    assert int8 < 0.6 * fp16
    assert set(report["worker_start_s"]) == {"2"}
    speedups = [
        max(r["vs_single"] for r in f["loads"] if r["how"] == "processes")
        for f in report["tracks"].values()
    ]
    speedup = report["goals"]["processes_speedup"]
    assert speedup["worst"] == pytest.approx(min(speedups))
    assert speedup["met"] == (speedup["worst"] >= 1.2)
    assert report["goals_met"] == all(goal["met"] for goal in report["goals"].values())
    assert "vs 1" in result.stdout and "goal processes_speedup" in result.stdout
    assert run.leftovers() == []
