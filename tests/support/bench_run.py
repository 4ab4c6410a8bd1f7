"""Run `kvmoq bench NAME` as an operator would, in a process tree the test can find again.

Shared by the benchmark tests (no tests here): each runs one benchmark at a tiny size, reads
its JSON, and checks that nothing it started outlived it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.processes import processes_with_marker, stop_marked


@dataclass
class BenchRun:
    result: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    marker: str

    def leftovers(self) -> list[int]:
        """Pids of processes the benchmark started and left running."""
        return processes_with_marker(self.marker)


def run_bench(name: str, report_path: Path, *args: str, timeout: float = 300) -> BenchRun:
    """`kvmoq bench NAME ARGS --json REPORT_PATH`; fails the test unless it exits 0."""
    marker = f"KVMOQ_BENCH_TEST={uuid.uuid4().hex}"
    key, value = marker.split("=")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "sidecar.cli", "bench", name, *args, "--json", str(report_path)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, key: value},
            check=False,
        )
    except subprocess.TimeoutExpired:
        stop_marked(marker)  # the bench was killed: nothing it started may outlive the test
        raise
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return BenchRun(result, json.loads(report_path.read_text()), marker)


MIN_PNG_BYTES = 10_000


def assert_png(path: Path) -> None:
    """`path` is a PNG that decodes to a figure-sized image with something drawn on it."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > MIN_PNG_BYTES
    height, width, _ = imread(path).shape
    assert width > 400 and height > 300
