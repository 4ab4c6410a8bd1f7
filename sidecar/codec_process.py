"""How a process that encodes and decodes chunks is set up: torch's threads and the allocator.

Threads: the sidecar shares its node with a model server that keeps the cores busy, and a
chunk's tensor ops split over threads that wait on each other at every op then wait for the
model's compute too: beside vLLM on 2 cores, one thread loads about twice as fast as torch's
default (docs/benchmarks.md, "vLLM"). Chunks are coded in worker threads (`asyncio.to_thread`),
and OpenMP keeps its thread count per thread: `torch.set_num_threads` in the main thread left
the matrix products of a worker (the rotation's) on every core, so the workers of `executor`
set it for themselves.

Allocator: a chunk's tensors are a few MB each, a dozen per chunk, all freed once the chunk is
written. glibc's malloc serves such blocks with fresh mappings (its mmap threshold starts at
128 KiB) and hands the top of its heap back to the kernel once twice that threshold is free,
so every chunk would pay for the kernel mapping and zeroing its pages again: with the blocks
kept, the cheap decoders (fp16, fp8), whose arithmetic weighs least, run several times faster
on one thread. Fixed thresholds keep up to `TRIM_THRESHOLD` bytes free per malloc arena
for the next chunk; blocks over `MMAP_THRESHOLD` (a published prompt's KV) still get
mappings of their own and go back to the kernel when freed.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor

DEFAULT_CODEC_THREADS = 1
MMAP_THRESHOLD = 32 << 20
"""glibc's largest allowed mmap threshold on 64-bit systems (HEAP_MAX_SIZE / 2)."""
TRIM_THRESHOLD = 256 << 20
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""`mallopt` parameters, from glibc's malloc.h."""


def glibc() -> bool:
    """Whether this process's C library is glibc, whose malloc `keep_freed_blocks` tunes."""
    return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


def keep_freed_blocks() -> bool:
    """Set glibc's thresholds (above); False where the C library is not glibc."""
    if not glibc():
        return False
    libc = ctypes.CDLL(None)
    return all(
        libc.mallopt(parameter, value) == 1
        for parameter, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        )
    )


def set_up(threads: int = DEFAULT_CODEC_THREADS) -> None:
    import torch

    torch.set_num_threads(threads)
    keep_freed_blocks()


def executor(threads: int = DEFAULT_CODEC_THREADS) -> ThreadPoolExecutor:
    """A pool for the event loop's `to_thread` work whose threads each run torch's ops on
    `threads` threads (see above); asyncio's own default pool has as many workers."""
    import torch

    return ThreadPoolExecutor(
        thread_name_prefix="kvmoq-codec", initializer=torch.set_num_threads, initargs=(threads,)
    )
