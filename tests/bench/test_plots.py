"""The benchmarks' `--plot` figures: drawn from the JSON each benchmark writes (fast), and
from a real tiny `kvmoq bench transport` run (slow; `bench e2e`'s is in test_e2e.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import codec, e2e, transport
from tests.support.bench_run import assert_png

"""Axes, labels and bars at these sizes take 20-60 KB; an empty figure takes about 3 KB."""


def transport_figures(relay: bool = True) -> dict[str, Any]:
    """What `kvmoq bench transport --json` writes, with a stalled relay run in it."""
    tls = 685.1
    figures: dict[str, Any] = {"tls_tcp_mbps": tls, "rows": {}, "goals_met": False}
    for backend, rows in {
        "aioquic": {"1350": (64.3, 23.1), "16384": (429.6, 183.4)},
        "qh3": {"1350": (171.4, 84.5), "16384": (1167.0, None)},
    }.items():
        figures["rows"][backend] = {
            size: {
                "direct_mbps": direct,
                "relay_mbps": relayed if relay else None,
                "direct_ratio": direct / tls,
                "relay_ratio": relayed / tls if relay and relayed else None,
            }
            for size, (direct, relayed) in rows.items()
        }
    return figures


def e2e_report() -> dict[str, Any]:
    """What `kvmoq bench e2e --json` writes: loopback loads column by column, link rows whole
    (one of them stopped by its deadline and judged after computing the rest)."""

    def load(
        seconds: float, kl: float, wire_bytes: float, tracks: dict[str, int], computed: int = 0
    ) -> dict:
        compute_s = 23.83 * computed / 4096
        return {
            "load_s": seconds,
            "compute_s": compute_s,
            "speedup": 23.83 / (seconds + compute_s),
            "wire_bytes": wire_bytes,
            "link_bytes": None,
            "ratio_vs_fp16": 94.4e6 / wire_bytes,
            "loaded_tokens": 4096 - computed,
            "kl": kl,
            "expected_kl": kl,
            "top1": 1.0 if kl < 1e-3 else 0.9,
            "same_text": kl < 1e-3,
            "tracks_used": tracks,
            "stopped": "STOP_REASON_DEADLINE" if computed else "STOP_REASON_COMPLETE",
        }

    loopback = {
        "int8": load(0.49, 1.07e-4, 47.7e6, {"int8": 32}),
        "ac": load(1.76, 5.39e-2, 14.2e6, {"ac": 32}),
        "adaptive": load(0.58, 1.57e-7, 94.4e6, {"fp16": 32}),
    }
    link = {"limit_bps": 1e8, "measured_bps": 1.003e8, "deadline_s": 11.92}
    return {
        "model": "SmolLM2-135M",
        "tokens": 4096,
        "recompute_s": 23.83,
        "deadline_s": 11.92,
        "max_kl": 1e-3,
        **{key: {label: row[key] for label, row in loopback.items()} for key in e2e._PER_TRACK},
        "speedup_vs_recompute": 48.6,
        "best_track": "int8",
        "goal": {"speedup": 5.0, "kl": 0.03, "met": True},
        "links": {
            "100mbit": {**link, **load(7.63, 1.57e-7, 94.4e6, {"fp16": 32}), "deadline_met": True},
            "10mbit": {
                **link,
                **load(11.92, 3.1e-2, 26.3e6, {"ac": 24}, 1024),
                "deadline_met": True,
            },
        },
        "links_skipped": None,
        "prefill_node_s": 23.98,
    }


@pytest.mark.parametrize("relay", [True, False], ids=["with-relay", "no-relay"])
def test_transport_plot_from_its_json(tmp_path: Path, relay: bool) -> None:
    path = tmp_path / "transport.png"
    transport.write_plot(json.loads(json.dumps(transport_figures(relay))), path)
    assert_png(path)


def test_e2e_plot_from_its_json(tmp_path: Path) -> None:
    path = tmp_path / "e2e.png"
    e2e.write_plot(json.loads(json.dumps(e2e_report())), path)
    assert_png(path)


def test_e2e_plot_without_link_limits(tmp_path: Path) -> None:
    path = tmp_path / "e2e.png"
    e2e.write_plot({**e2e_report(), "links": {}, "links_skipped": "--limits none"}, path)
    assert_png(path)


def test_codec_plot_from_its_json(tmp_path: Path) -> None:
    """The codec plot, drawn through the same helper as the others."""

    def point(bits: float, kl: float) -> dict[str, float]:
        return {"bits_per_element": bits, "kl": kl}

    result = {
        "setup": {"model": "SmolLM2-135M", "tokens": 4096},
        "codecs": {"fp16": point(16.0, 7.24e-08), "int4": point(4.08, 0.0315)},
        "baseline_cachegen": point(4.49, 0.0287),
    }
    path = tmp_path / "codec.png"
    codec.write_plot(result, path)
    assert_png(path)


def test_codec_rate_distortion_plot_from_its_json(tmp_path: Path) -> None:
    def point(bits: float, kl: float, rotated: bool = False) -> dict[str, Any]:
        return {"bits_per_element": bits, "kl": kl, "rotated": rotated}

    result = {
        "codecs": {"int4": point(4.25, 0.015), "fp16": point(16.0, 1e-7)},
        "rate_distortion": {
            "ac x1": point(2.42, 0.084),
            "ac x2": point(3.49, 0.016),
            "ac x1 rotated": point(3.28, 0.031, True),
            "ac x2 rotated": point(4.38, 0.0072, True),
        },
    }
    path = tmp_path / "rd.png"
    codec.write_rd_plot(result, path)
    assert_png(path)


@pytest.mark.slow
def test_transport_plot_from_a_real_run(tmp_path: Path) -> None:
    plot, figures = tmp_path / "transport.png", tmp_path / "transport.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "sidecar.cli", "bench", "transport"),
            *("--mbytes", "1", "--backend", "aioquic"),
            *("--json", str(figures), "--plot", str(plot)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(json.loads(figures.read_text())["rows"]) == {"aioquic"}
    assert_png(plot)
