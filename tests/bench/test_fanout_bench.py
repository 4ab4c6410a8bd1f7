"""`kvmoq bench fanout` at a tiny size: real relays (one, and a root with edges), worker
processes of decoders, verified loads, and the figures its goals are judged on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.test_demo import processes_with_marker

TOKENS = 256
EDGES = 2
DECODERS = (1, 4)


@pytest.mark.slow
def test_fanout_bench_reports_both_topologies_and_leaves_nothing_running(tmp_path: Path) -> None:
    marker = f"KVMOQ_FANOUT_TEST={uuid.uuid4().hex}"
    key, value = marker.split("=")
    report_path, plot_path = tmp_path / "fanout.json", tmp_path / "fanout.png"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "sidecar.cli", "bench", "fanout", "--tokens", str(TOKENS)),
            *("--subscribers", ",".join(map(str, DECODERS)), "--edges", str(EDGES)),
            *("--loaders", "2", "--json", str(report_path), "--plot", str(plot_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, key: value},
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
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
    assert processes_with_marker(marker) == []
