"""`kvmoq demo` as a newcomer runs it: a real relay, two real sidecars, and two SmolLM2
model servers that reach the relay only through their sidecars."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sidecar.address import free_udp_port
from sidecar.moqt.tls import write_certificate

pytestmark = [pytest.mark.slow, pytest.mark.model]


def processes_with_marker(marker: str) -> list[int]:
    """Pids whose environment carries `marker`: the demo and everything it started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ:
            found.append(int(entry.name))
    return found


def test_demo_loads_faster_than_recompute_with_the_same_text(tmp_path: Path) -> None:
    marker = f"KVMOQ_DEMO_TEST={uuid.uuid4().hex}"
    key, value = marker.split("=")
    report_path = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar.cli",
            "demo",
            "--tokens",
            "256",
            "--compression",
            "fp16,int8",
            "--out",
            str(tmp_path),
            "--json",
            str(report_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, key: value},
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    tracks = report["tracks"]
    for name in ("fp16", "int8"):
        assert tracks[name]["loaded_tokens"] == 256
        assert tracks[name]["load_s"] < report["recompute_s"], name
        assert tracks[name]["same_text"], name
        assert tracks[name]["stopped"] == "STOP_REASON_COMPLETE", name
    assert report["lookup"]["available_tokens"] == 256
    # The loads went through the decode sidecar, the publication through the prefill one.
    sidecars = report["sidecars"]
    for name in ("fp16", "int8"):
        assert sidecars["decode"]["loaded_bytes"][name] >= tracks[name]["wire_bytes"] > 0
        assert sidecars["prefill"]["published_bytes"][name] > 0
    assert tracks["fp16"]["kl"] < 1e-5
    assert tracks["int8"]["wire_bytes"] < tracks["fp16"]["wire_bytes"]
    reuse = report["prefix_reuse"]
    assert reuse["reused_tokens"] == 256
    assert reuse["same_text"]
    assert (tmp_path / "kvmoq-demo.png").stat().st_size > 0
    assert "same text" in result.stdout
    assert "the decode one loaded" in result.stdout
    assert processes_with_marker(marker) == []


def test_demo_says_which_step_failed_and_stops_what_it_started(tmp_path: Path) -> None:
    marker = f"KVMOQ_DEMO_TEST={uuid.uuid4().hex}"
    key, value = marker.split("=")
    cert = write_certificate(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar.cli",
            "demo",
            "--relay",
            f"moqt://127.0.0.1:{free_udp_port()}",  # nobody listens there
            "--ca",
            str(cert.cert),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, key: value},
        check=False,
    )
    assert result.returncode == 1
    assert "kvmoq demo failed" in result.stdout
    assert "prefill sidecar has no relay session" in result.stdout
    assert processes_with_marker(marker) == []


def test_demo_refuses_an_unknown_compression() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "demo", "--compression", "zip"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "unknown compression zip" in result.stderr
