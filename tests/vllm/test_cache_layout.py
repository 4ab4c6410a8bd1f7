"""Where vLLM's CPU backend keeps K and V in a block, as `BlockLayout` probes it: checked
against vLLM's own kernel in vLLM's environment (tests/vllm/layout_check.py), on the ISA
vLLM picks on this CPU and on the AMX layout, whatever the CPU."""

from __future__ import annotations

import json
import platform
import subprocess

import pytest

from sidecar.demo.vllm_engines import REPO, VLLM_PYTHON, unavailable_reason

KNOWN_LAYOUTS = {"vec": "strided", "vec16": "strided", "amx": "tiled"}
"""The ISAs whose layouts the fast path is known to fit, and how; another ISA (a new vLLM, an
ARM CPU) must still read and write exactly, through whichever path the probe picked."""


def test_block_layout_reads_and_writes_what_vllms_kernel_wrote() -> None:
    if reason := unavailable_reason():
        pytest.skip(reason)
    result = subprocess.run(
        [str(VLLM_PYTHON), str(REPO / "tests" / "vllm" / "layout_check.py")],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    results = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"layouts checked on {platform.machine()}: {results}")
    dtypes = {name.split(" ", 1)[1] for name in results}
    assert dtypes == {"torch.float16", "torch.bfloat16", "torch.float32"}
    if platform.machine() == "x86_64":
        assert "amx torch.bfloat16" in results
    for name, outcome in results.items():
        assert outcome["gather"], (name, outcome)
        if outcome["path"] != "gather":
            assert outcome["fast"], (name, outcome)
        if (expected := KNOWN_LAYOUTS.get(outcome["isa"])) is not None:
            assert outcome["path"] == expected, (name, outcome)
