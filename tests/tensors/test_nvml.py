"""NVML and stream choice degrade to the CPU path instead of failing."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from sidecar.tensors.nvml import StreamPlan, codec_stream_plan, codec_streams, gpu_info, normal_uuid

UNKNOWN_GPU = "GPU-00000000-0000-0000-0000-000000000000"


def test_uuids_compare_however_they_are_spelt() -> None:
    assert normal_uuid("GPU-8D6C-aa") == normal_uuid("8d6c-AA ") == "8d6c-aa"


def test_an_unknown_gpu_has_no_info_and_codecs_run_on_the_cpu() -> None:
    assert gpu_info(UNKNOWN_GPU) is None
    plan = codec_stream_plan(UNKNOWN_GPU)
    assert plan == StreamPlan(torch.device("cpu"), streams=0, priority=0)
    assert codec_streams(plan) == []


def test_cpu_buffers_plan_no_streams() -> None:
    assert codec_stream_plan(None).device == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the node without a GPU")
def test_the_cpu_fallback_is_logged_once_per_process() -> None:
    script = (
        "from sidecar.log import configure\n"
        "from sidecar.tensors import nvml\n"
        "configure()\n"
        "for _ in range(3):\n"
        f"    nvml.codec_stream_plan({UNKNOWN_GPU!r}); nvml.gpu_info({UNKNOWN_GPU!r})\n"
    )
    log = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stderr
    assert log.count("no CUDA GPU") == 1
    assert log.count("nvml unavailable") == 1
