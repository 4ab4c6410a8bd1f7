"""Codec streams: nothing to do on the CPU; on a GPU, work runs on a low-priority stream of
its own, after what was queued before it, and is finished when the block ends."""

from __future__ import annotations

import pytest
import torch

from sidecar.tensors import CodecStreams
from sidecar.tensors.nvml import LOWEST_STREAM_PRIORITY


def test_on_the_cpu_there_are_no_streams_and_the_block_just_runs() -> None:
    streams = CodecStreams.for_device(torch.device("cpu"))
    assert streams.plan.device == torch.device("cpu") and streams.streams == []
    out = torch.zeros(4)
    with streams.run():
        out.copy_(torch.arange(4.0))
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_an_error_in_the_block_passes_through() -> None:
    with (
        pytest.raises(RuntimeError, match="inside"),
        CodecStreams.for_device(torch.device("cpu")).run(),
    ):
        raise RuntimeError("inside")


@pytest.mark.cuda
def test_gpu_work_runs_on_a_lowest_priority_stream_taken_in_turn() -> None:
    device = torch.device("cuda", 0)
    streams = CodecStreams.for_device(device)
    assert streams.plan.device == device and streams.streams
    default = torch.cuda.current_stream(device)
    used = []
    for _ in range(len(streams.streams) + 1):
        with streams.run():
            current = torch.cuda.current_stream(device)
            assert current != default and current.priority == LOWEST_STREAM_PRIORITY
            used.append(current)
        assert torch.cuda.current_stream(device) == default
    assert used[0] == used[-1] and len(set(used[:-1])) == len(streams.streams)


@pytest.mark.cuda
def test_gpu_work_waits_for_what_came_before_and_is_done_when_the_block_ends() -> None:
    device = torch.device("cuda", 0)
    streams = CodecStreams.for_device(device)
    big = torch.randn(4096, 4096, device=device)
    produced = big @ big  # queued on the default stream, likely still running
    host = torch.empty(4096, pin_memory=True)
    with streams.run():
        host.copy_(produced.sum(dim=0), non_blocking=True)  # must see the finished product
    # No synchronisation here: the block's end waited for the codec stream.
    assert torch.allclose(host, produced.sum(dim=0).cpu())
