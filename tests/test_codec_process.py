"""A codec process keeps freed chunk-sized blocks: decoding chunk after chunk faults no pages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sidecar.codec_process import glibc

DECODES = 20
WARM_UP = 5
CHILD = f"""
import json, resource, sys, torch
from sidecar import codec_process
from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.layout import KVLayout

if sys.argv[1] == "set-up":
    codec_process.set_up()
else:
    torch.set_num_threads(1)
layout = KVLayout(30, 3, 64, "float16")  # SmolLM2-135M: 128 tokens are 2.9 MB of fp16
codec = get_codec(sys.argv[2])
payloads = codec.encode(torch.randn(layout.shape(128)).to(torch.float16), layout)
for _ in range({WARM_UP}):  # the first chunks fault their blocks in, and the heap settles
    codec.decode(payloads, layout)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({DECODES}):
    codec.decode(payloads, layout)
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before))
"""


def page_faults(setting: str, codec: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, setting, codec],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(json.loads(done.stdout))


@pytest.mark.skipif(not glibc(), reason="tunes glibc's malloc")
@pytest.mark.parametrize("codec", ["int4", "fp4"])
def test_decoding_chunk_after_chunk_reuses_the_blocks_it_freed(codec: str) -> None:
    kept = page_faults("set-up", codec)
    returned = page_faults("default", codec)
    # glibc's defaults give a decode's float32 blocks (5.9 MB each) back to the kernel and
    # fault them in again: here 1200-3600 pages per decode for int4 and fp4 (a chunk's fp16
    # is 720), kept 0-72 once the heap has settled. (int8's decode has fewer temporaries,
    # and glibc's own adaptive threshold sometimes keeps them: 70-2800 pages per decode.)
    assert returned > DECODES * 128 * 23040 // 4096 // 2, returned
    assert kept * 4 < returned, (kept, returned)


def test_the_codec_executors_threads_keep_the_codec_thread_count() -> None:
    """OpenMP keeps its thread count per thread: in a plain worker thread a matrix product
    (the rotation's) ran on every core whatever the main thread set; a worker of the
    sidecar's executor runs it on the one thread `--codec-threads` names, so the process
    spends no more CPU on it than the worker's own."""
    import os
    import resource
    import time

    import torch

    from sidecar import codec_process

    values, matrix = torch.randn(23040, 64), torch.randn(64, 64)

    def process_over_thread_cpu() -> float:
        before, own = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
        for _ in range(200):
            values @ matrix
        after = resource.getrusage(resource.RUSAGE_SELF)
        process = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return process / (time.thread_time() - own)

    with codec_process.executor(1) as pool:
        assert pool.submit(torch.get_num_threads).result() == 1
        if (os.cpu_count() or 1) > 1:
            assert pool.submit(process_over_thread_cpu).result() < 1.5
