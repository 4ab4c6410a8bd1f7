"""`kvmoq bench transport` end to end: real processes, real QUIC, the JSON the docs rely on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


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
    figures = json.loads(out.read_text())
    assert set(figures) == {"tls_tcp_mbps", "aioquic"}
    assert figures["tls_tcp_mbps"] > 0
    assert set(figures["aioquic"]) == {"1350", "16384"}
    for row in figures["aioquic"].values():
        assert set(row) == {"direct_mbps", "relay_mbps", "direct_ratio", "relay_ratio"}
        assert row["direct_mbps"] > 0
        assert row["direct_ratio"] == pytest.approx(row["direct_mbps"] / figures["tls_tcp_mbps"])
        if row["relay_mbps"] is not None:
            assert row["relay_ratio"] == pytest.approx(row["relay_mbps"] / figures["tls_tcp_mbps"])
    assert "TLS over TCP" in result.stdout and "aioquic" in result.stdout


def test_bench_rejects_a_bad_size() -> None:
    result = run_bench("--mbytes", "0")
    assert result.returncode == 2
    assert "must be 1..100000" in result.stderr
