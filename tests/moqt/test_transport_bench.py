"""`kvmoq bench transport` end to end: real processes, real QUIC, the JSON the docs rely on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.demo.children import python_with
from sidecar.moqt.protocol.drafts import SPOKEN


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "bench", "transport", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.slow
def test_bench_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "transport.json"
    result = run_bench("--mbytes", "4", "--backend", "aioquic", "--json", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert set(report) == {"draft", "tls_tcp_mbps", "rows", "goals_met", "stalled"}
    assert report["draft"] == SPOKEN[0].number
    tls = report["tls_tcp_mbps"]
    assert tls > 0 and report["stalled"] == []
    assert set(report["rows"]) == {"aioquic"}
    assert set(report["rows"]["aioquic"]) == {"1350", "16384"}
    goals = []
    for size, row in report["rows"]["aioquic"].items():
        ratios = {"direct_ratio", "relay_ratio", "moqt_bare_ratio"}
        figures = {"bare_mbps", "direct_mbps", "relay_mbps", "relay_cpu_s_per_gb", "goals"}
        assert set(row) == figures | ratios
        assert row["bare_mbps"] > 0 and row["direct_mbps"] > 0 and row["relay_mbps"] > 0
        assert row["relay_cpu_s_per_gb"] > 0
        assert row["direct_ratio"] == pytest.approx(row["direct_mbps"] / tls)
        assert row["relay_ratio"] == pytest.approx(row["relay_mbps"] / tls)
        assert row["moqt_bare_ratio"] == pytest.approx(row["direct_mbps"] / row["bare_mbps"])
        for name, goal in row["goals"].items():
            assert goal["met"] == (row[name] >= goal["goal"]), (size, name, goal)
            goals.append(goal["met"])
        assert set(row["goals"]) == ratios
    assert report["goals_met"] == all(goals)
    assert "TLS over TCP" in result.stdout and "goal aioquic/1350 direct_ratio" in result.stdout


def test_bench_rejects_a_bad_size() -> None:
    result = run_bench("--mbytes", "0")
    assert result.returncode == 2
    assert "must be 1..100000" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(python_with("aiopquic") is None, reason="no interpreter here has aiopquic")
def test_aiopquic_rows_run_where_aiopquic_is(tmp_path: Path) -> None:
    """aiopquic end to end (in the relay's Python 3.12), and aioquic endpoints through a relay
    on aiopquic; both at internet packet sizes only, as picoquic sizes its own packets."""
    out = tmp_path / "transport.json"
    result = run_bench(
        "--mbytes", "4", "--backend", "aioquic", "--backend", "aiopquic", "--json", str(out)
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"aioquic", "aiopquic", "aioquic+aiopquic relay"}
    for label in ("aiopquic", "aioquic+aiopquic relay"):
        assert set(rows[label]) == {"1350"}
        row = rows[label]["1350"]
        assert row["direct_mbps"] > 0 and row["relay_mbps"] > 0 and row["relay_cpu_s_per_gb"] > 0
    assert "aioquic+aiopquic relay" in result.stdout
