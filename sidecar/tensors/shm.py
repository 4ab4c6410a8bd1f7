"""Opening shared-memory handles: KV buffers of CPU nodes (and of tests) in mapped files.

The model server allocates a file on a memory filesystem (`/dev/shm`, or a Kubernetes
emptyDir with `medium: Memory` mounted at the same path in both containers) and keeps it
mapped; the sidecar maps the same pages, so writes on either side are seen by the other
without a copy. Only files under the configured roots are opened: a handle is a path from
another process, and the sidecar publishes what it reads to the network.

The exporter must not shrink the file while it is registered: pages past the end of a
truncated file fault (SIGBUS) in every process that maps them.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import torch

from .errors import HandleUnavailable, InvalidHandle
from .geometry import check_bytes, check_view, handle_dtype
from .handles import SharedMemoryHandle

DEFAULT_SHM_ROOTS: tuple[Path, ...] = (Path("/dev/shm"),)


def open_shared_memory(
    handle: SharedMemoryHandle, roots: Sequence[Path] = DEFAULT_SHM_ROOTS
) -> torch.Tensor:
    """A CPU tensor viewing the handle's bytes in place; the mapping lives as long as it does."""
    dtype = handle_dtype(handle.dtype)
    check_bytes("size", handle.size, minimum=1)
    check_bytes("offset", handle.offset)
    if handle.offset % dtype.itemsize:
        raise InvalidHandle(f"offset {handle.offset} is not aligned to {dtype} elements")
    check_view(dtype, handle.shape, handle.stride, offset_elements=0, capacity_bytes=handle.size)
    path = _inside_roots(handle.path, roots)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InvalidHandle(f"{handle.path}: no such file") from None
    except IsADirectoryError:
        raise InvalidHandle(f"{handle.path} is not a regular file") from None
    except OSError as exc:
        raise HandleUnavailable(f"{handle.path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidHandle(f"{handle.path} is not a regular file")
        end = handle.offset + handle.size
        if end > info.st_size:
            raise InvalidHandle(
                f"offset {handle.offset} + size {handle.size} = {end} bytes,"
                f" past the end of {handle.path} ({info.st_size} bytes)"
            )
        start = handle.offset - handle.offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapped = mmap.mmap(fd, end - start, offset=start)
        except OSError as exc:
            raise HandleUnavailable(f"cannot map {handle.path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    # frombuffer holds a reference to the mapping: it is unmapped when the last view goes.
    flat = torch.frombuffer(
        mapped, dtype=dtype, offset=handle.offset - start, count=handle.size // dtype.itemsize
    )
    return flat.as_strided(handle.shape, handle.stride)


def _inside_roots(path: str, roots: Sequence[Path]) -> Path:
    """The path with symlinks resolved, refused unless it lies under one of `roots`."""
    given = Path(path)
    if not given.is_absolute():
        raise InvalidHandle(f"shared-memory path must be absolute, got {path!r}")
    resolved = given.resolve()
    if not any(resolved.is_relative_to(root.resolve()) for root in roots):
        allowed = ", ".join(str(root) for root in roots)
        raise InvalidHandle(f"{path} is outside the shared-memory roots ({allowed})")
    return resolved
