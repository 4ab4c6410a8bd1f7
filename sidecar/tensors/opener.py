"""One entry point for the servicer: any tensor handle in, a tensor viewing its memory out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from .cuda_ipc import open_cuda_ipc
from .handles import CudaIpcHandle, TensorHandle
from .shm import DEFAULT_SHM_ROOTS, open_shared_memory


def open_handle(
    handle: TensorHandle, shm_roots: Sequence[Path] = DEFAULT_SHM_ROOTS
) -> torch.Tensor:
    """Open once per registration and keep the tensor: mapping again costs a syscall (shm)
    or an IPC open and an event wait (CUDA)."""
    if isinstance(handle, CudaIpcHandle):
        return open_cuda_ipc(handle)
    return open_shared_memory(handle, shm_roots)
