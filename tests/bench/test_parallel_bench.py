"""`kvmoq bench parallel` at a tiny size: a real relay, sessions and worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.test_demo import processes_with_marker

TOKENS = 512
FP16_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2
WAYS = [("single", 1), ("sessions", 2), ("processes", 2)]


def test_parallel_bench_reports_every_way_and_leaves_nothing_running(tmp_path: Path) -> None:
    marker = f"KVMOQ_PARALLEL_TEST={uuid.uuid4().hex}"
    key, value = marker.split("=")
    report_path = tmp_path / "parallel.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "sidecar.cli", "bench", "parallel"),
            *("--tokens", str(TOKENS), "--tracks", "int8,fp16", "--connections", "2"),
            *("--repeat", "1", "--json", str(report_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, key: value},
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())

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
    assert "vs 1" in result.stdout
    assert processes_with_marker(marker) == []
