"""`kvmoq bench load` at a tiny size: a real relay, publisher and loader processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvmoq_client.buffers import orphaned_shared_memory_files

from tests.support.bench_run import run_bench

TOKENS = 256


@pytest.mark.slow
def test_load_bench_verifies_every_load_and_reports_every_process(tmp_path: Path) -> None:
    orphans_before = orphaned_shared_memory_files()
    run = run_bench(
        "load",
        tmp_path / "load.json",
        *("--tokens", str(TOKENS), "--fanout", "4", "--publishers", "2", "--per-publisher", "2"),
        *("--cache-bytes", str(64 << 20)),
    )
    report, result = run.report, run.result
    alone, one, many = report["rows"]
    assert (alone["round"], alone["decoders"], alone["vs_alone"]) == ("alone", 1, 1.0)
    assert (one["round"], one["publishers"], one["decoders"]) == ("one prompt", 1, 4)
    assert (many["round"], many["publishers"], many["decoders"]) == ("many publishers", 2, 4)
    for row in (alone, one, many):
        assert row["verified_loads"] == row["decoders"]
        assert row["vs_alone"] == pytest.approx(row["mbps"] / alone["mbps"])
        assert row["objects_per_s"] == pytest.approx(row["decoders"] * TOKENS / row["seconds"])
        assert 0 < row["load_p50_s"] <= row["load_p99_s"] <= row["seconds"]
        assert 1 <= len(row["loader_peak_rss"]) <= 2 and min(row["loader_peak_rss"]) > 0
    assert len(report["publishers"]) == 4  # one alone, one for one prompt, two for many
    for publisher in report["publishers"]:
        assert publisher["peak_rss"] > publisher["baseline_rss"] > 0
        assert publisher["kv_bytes"] == TOKENS * 30 * 2 * 3 * 64 * 2
        # The sidecar read the model server's whole buffer: mapped, and counted apart.
        assert publisher["kv_bytes"] <= publisher["mapped_shared"] < publisher["peak_rss"]
    goals = report["goals"]
    held = [p["peak_rss"] - p["baseline_rss"] - p["mapped_shared"] for p in report["publishers"]]
    worst = max(h / p["kv_bytes"] for h, p in zip(held, report["publishers"], strict=True))
    assert goals["publisher_memory"]["worst"] == pytest.approx(worst)
    relay_over = (report["relay_peak_rss"] - (64 << 20)) / (1 << 20)
    assert goals["relay_memory"]["worst"] == pytest.approx(relay_over)
    assert goals["relay_memory"]["met"] == (relay_over <= 256)
    assert report["goals_met"] == all(goal["met"] for goal in goals.values())
    assert "goal publisher_memory" in result.stdout
    assert run.leftovers() == []
    assert orphaned_shared_memory_files() <= orphans_before  # the model servers removed theirs
