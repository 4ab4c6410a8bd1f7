"""`kvmoq bench layout`: how fast the vLLM connector copies KV blocks between vLLM's CPU
cache and the sidecar's staging buffer, per cache layout, through the layout's fast path
(strided or tiled views) against the index gather it falls back on.

Every load ends in such a copy (staging -> vLLM's blocks: "write") and every publish starts
with one ("read"), on vLLM's worker thread. The layouts are what vLLM's own kernel writes
(`amx` for bf16 on CPUs with AMX tiles, `vec` otherwise), measured in vLLM's environment by
bench/layout_worker.py; the gather is the baseline, the same copy through `BlockLayout.index`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

from bench.harness import conclude, cpu_name
from sidecar.terminal import console

WORKER = Path(__file__).with_name("layout_worker.py")
GEOMETRIES = {
    "smollm2": (3, 64),
    "llama3-8b": (8, 128),
}
"""KV heads and head size: the demo's model, and the GPU check's Llama-3-8B geometry."""
MIN_SPEEDUP = 1.5
"""Goal: the fast path copies at least this many times the gather's blocks/s, both ways, on
every layout (docs/benchmarks.md keeps the measured figures)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--geometry", choices=sorted(GEOMETRIES), default="llama3-8b",
        help="KV heads and head size of the cache (default llama3-8b: 8 heads of 128)",
    )  # fmt: skip
    parser.add_argument(
        "--blocks", type=int, default=32, help="128-token blocks per copy (default 32: 4096 tokens)"
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="time per figure (default 1.0)")


def run(args: argparse.Namespace) -> int:
    from sidecar.demo.vllm_engines import VLLM_PYTHON, unavailable_reason

    if reason := unavailable_reason():
        raise SystemExit(f"kvmoq bench layout: {reason}")
    if not 1 <= args.blocks <= 4096 or not 0.05 <= args.seconds <= 60:
        raise SystemExit("kvmoq bench layout: --blocks in 1..4096, --seconds in 0.05..60")
    heads, head_size = GEOMETRIES[args.geometry]
    result = subprocess.run(
        [
            # -P: bench/ (whose vllm.py is a benchmark) stays off the worker's sys.path
            str(VLLM_PYTHON), "-P", str(WORKER), "--heads", str(heads), "--head-size", str(head_size),
            "--blocks", str(args.blocks), "--seconds", str(args.seconds),
        ],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        print(f"kvmoq bench layout failed:\n{result.stderr[-3000:]}")
        return 1
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    report |= {
        "geometry": args.geometry, "heads": heads, "head_size": head_size,
        "blocks": args.blocks, "cpu": cpu_name(),
    }  # fmt: skip
    conclude(report, goals, show, args.json)
    return 0


def _pairs(report: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Per layout (`isa dtype`), its fast-path row and its gather row."""
    by_layout: dict[str, dict[str, dict[str, Any]]] = {}
    for row in report["rows"]:
        by_layout.setdefault(f"{row['isa']} {row['dtype']}", {})[row["path"]] = row
    return {
        name: (next(r for p, r in rows.items() if p != "gather"), rows["gather"])
        for name, rows in by_layout.items()
    }


def goals(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    checked = {}
    for name, (fast, gather) in _pairs(report).items():
        speedups = [fast[f] / gather[f] for f in ("read_blocks_s", "write_blocks_s")]
        checked[name] = {
            "goal": f"{fast['path']} >= {MIN_SPEEDUP}x gather both ways, every byte exact",
            "speedup_read": speedups[0],
            "speedup_write": speedups[1],
            "met": min(speedups) >= MIN_SPEEDUP and fast["exact"] and gather["exact"],
        }
    return checked


def show(report: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(
        title=f"vLLM block copies, {report['blocks']} scattered 128-token blocks, "
        f"{report['heads']} KV heads x {report['head_size']}, one thread "
        f"({report['cpu']}; vLLM picks {report['bf16_isa_here']} for bf16 here)"
    )
    for column in ("layout", "path", "read blocks/s", "write blocks/s", "vs gather", "exact"):
        table.add_column(column, justify="right")
    for name, (fast, gather) in _pairs(report).items():
        goal = report["goals"][name]
        for row in (fast, gather):
            ratio = (
                f"{goal['speedup_read']:.1f}x / {goal['speedup_write']:.1f}x"
                if row is fast
                else "baseline"
            )
            table.add_row(
                name, row["path"], f"{row['read_blocks_s']:,.0f}", f"{row['write_blocks_s']:,.0f}",
                ratio, "yes" if row["exact"] else "NO",
            )  # fmt: skip
    out = console()
    out.print(table)
    out.print(
        f"Goal: fast path >= {MIN_SPEEDUP}x the gather both ways on every layout: "
        + ("met" if report["goals_met"] else "NOT met")
    )
