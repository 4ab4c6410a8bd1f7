"""`kvmoq bench fanout` at a tiny size: real relays (one, and a root with edges), worker
processes of decoders, verified loads, and the figures its goals are judged on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench_run import run_bench

TOKENS = 256
EDGES = 2
DECODERS = (1, 4)


@pytest.mark.slow
def test_fanout_bench_reports_both_topologies_and_leaves_nothing_running(tmp_path: Path) -> None:
    report_path, plot_path = tmp_path / "fanout.json", tmp_path / "fanout.png"
    run = run_bench(
        "fanout",
        report_path,
        *("--tokens", str(TOKENS), "--subscribers", ",".join(map(str, DECODERS))),
        *("--edges", str(EDGES), "--loaders", "2", "--plot", str(plot_path)),
    )
    report, result = run.report, run.result
    assert plot_path.stat().st_size > 0

    rows = report["rows"]
    assert [(r["subscribers"], r["topology"]) for r in rows] == [
        (n, t) for n in DECODERS for t in ("one relay", f"root + {EDGES} edges")
    ]
    prompt = report["prompt_bytes"]
    for single, cluster in zip(rows[::2], rows[1::2], strict=True):
        n = single["subscribers"]
        (relay,) = single["relays"]
        assert relay["bytes_sent"] >= n * prompt  # every decoder got a whole copy from it
        root, *edges = cluster["relays"]
        # The fan-out happens at the edges: one copy from the root to each edge that has
        # decoders (catalogs ride along), and each edge sends its decoders theirs.
        assert prompt * min(n, EDGES) <= root["bytes_sent"] < 1.01 * prompt * min(n, EDGES)
        assert sum(edge["bytes_sent"] for edge in edges) >= n * prompt
        for row in (single, cluster):
            assert row["aggregate_mbps"] == pytest.approx(n * prompt / 1e6 / row["seconds"])
            assert 0 < row["load_p50_s"] <= row["load_p99_s"] <= row["seconds"]
    goals = report["goals"]
    assert goals["root_sends_one_copy_per_edge"]["met"]
    assert goals["root_cpu_per_mb_at_8_plus"] == {
        "goal": goals["root_cpu_per_mb_at_8_plus"]["goal"],
        "worst": None,  # no round had 8 decoders
        "met": False,
    }
    assert report["goals_met"] is False
    assert "vs 1 relay" in result.stdout
    assert run.leftovers() == []
