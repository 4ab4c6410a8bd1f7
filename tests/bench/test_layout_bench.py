"""`kvmoq bench layout` at a tiny size, in vLLM's environment: every layout vLLM's kernel
writes here, through its fast path and the gather, every byte exact."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from sidecar.demo.vllm_engines import unavailable_reason
from tests.support.bench_run import run_bench


def test_layout_bench_copies_every_layout_exactly_both_ways(tmp_path: Path) -> None:
    if reason := unavailable_reason():
        pytest.skip(reason)
    if platform.machine() != "x86_64":
        pytest.skip("the bench's layouts (AMX, AVX-512) are vLLM's x86 ones")
    report_path = tmp_path / "layout.json"
    run = run_bench(
        "layout", report_path, "--geometry", "smollm2", "--blocks", "4", "--seconds", "0.1"
    )
    report = run.report
    assert (report["heads"], report["head_size"], report["blocks"]) == (3, 64, 4)
    paths = {(row["isa"], row["dtype"], row["path"]) for row in report["rows"]}
    assert paths == {
        ("amx", "bfloat16", "tiled"), ("amx", "bfloat16", "gather"),
        ("vec", "bfloat16", "strided"), ("vec", "bfloat16", "gather"),
        ("vec", "float16", "strided"), ("vec", "float16", "gather"),
    }  # fmt: skip
    for row in report["rows"]:
        assert row["exact"], row
        assert row["read_blocks_s"] > 0 and row["write_blocks_s"] > 0, row
    assert set(report["goals"]) == {"amx bfloat16", "vec bfloat16", "vec float16"}
    assert "vLLM block copies" in run.result.stdout
    assert run.leftovers() == []
