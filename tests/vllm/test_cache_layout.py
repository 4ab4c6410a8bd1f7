"""Where vLLM's CPU backend keeps K and V in a block, as `BlockLayout` probes it: checked
against vLLM's own kernel in vLLM's environment (tests/vllm/layout_check.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from sidecar.demo.vllm_engines import REPO, VLLM_PYTHON, unavailable_reason


def test_block_layout_reads_and_writes_what_vllms_kernel_wrote() -> None:
    if reason := unavailable_reason():
        pytest.skip(reason)
    result = subprocess.run(
        [str(VLLM_PYTHON), str(REPO / "tests" / "vllm" / "layout_check.py")],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(results) == {"torch.float16", "torch.bfloat16", "torch.float32"}
    for dtype, outcome in results.items():
        assert outcome["strided"] and outcome["gather"], (dtype, outcome)
