"""GPU work on a model server's buffers, on the streams `nvml.codec_stream_plan` chose and
ordered with the rest of the process's GPU work by events.

What the sidecar does with a model server's GPU buffers (copying a prompt's KV out to
publish it, writing a loaded chunk in) is queued on a codec stream at the lowest priority,
so it never goes ahead of a model stream of higher priority (one at the default priority,
also the lowest, shares the GPU with it: see `nvml.LOWEST_STREAM_PRIORITY`).
Two events bound each block of such work: the codec stream first waits for what the
calling thread had queued on the current stream (a chunk decoded on the GPU, say), and the
host waits for the codec stream before the block returns, because what it produced is read
next by the host (the encoder) or by another process (the model server, once told that a
chunk is written), and neither can wait on a stream of ours. On the CPU there are no
streams and nothing to order: the block just runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .nvml import StreamPlan, codec_stream_plan, codec_streams, device_uuid


class CodecStreams:
    """The codec streams of one device, taken in turn by successive blocks of work."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan
        self.streams = codec_streams(plan)
        self._turn = itertools.cycle(self.streams)

    @classmethod
    def for_device(cls, device: torch.device) -> CodecStreams:
        """Planned for the GPU `device` names now (its load decides how many streams); a
        CPU device, or a GPU NVML cannot place, gets none."""
        return cls(codec_stream_plan(device_uuid(device) if device.type == "cuda" else None))

    @contextmanager
    def run(self) -> Iterator[None]:
        """Queue the block's CUDA work on the next codec stream, after the work already on
        the current stream, and return once it is done."""
        if not self.streams:
            yield
            return
        stream = next(self._turn)
        stream.wait_event(torch.cuda.current_stream(self.plan.device).record_event())
        try:
            with torch.cuda.stream(stream):
                yield
        finally:  # even after an error: nothing queued here outlives the block
            stream.record_event().synchronize()
