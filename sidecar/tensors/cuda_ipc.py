"""Opening CUDA IPC handles: the model server's KV buffers on its GPU, mapped by the sidecar.

The handle carries the arguments of torch's own `rebuild_cuda_tensor`, field by field, so
the sidecar gets the same mapping, reference counting and storage cache that
torch.multiprocessing uses, without pickle on the socket. torch's reference counter keeps
the exporter's allocation alive until the sidecar drops its view; the model server frees
blocks only after UnregisterBuffers has returned.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor

from .errors import HandleUnavailable, InvalidHandle
from .geometry import check_bytes, check_view, handle_dtype
from .handles import CudaIpcHandle
from .nvml import cuda_available, cuda_index, gpu_info

MAX_IPC_HANDLE_BYTES = 1 << 16
"""A cudaIpcMemHandle_t is 64 bytes; torch's expandable segments add a small header."""
MAX_REF_COUNTER_HANDLE_BYTES = 4096
"""A shared-memory file name."""
OPEN_RESERVE_BYTES = 256 << 20
"""Free device memory needed before opening: the sidecar's CUDA context and codec scratch."""


def check_cuda_ipc(handle: CudaIpcHandle) -> torch.dtype:
    """Every field in bounds and the view inside the storage; returns the dtype.

    Runs without a GPU, so a malformed handle is refused the same way on every node.
    """
    dtype = handle_dtype(handle.dtype)
    if not handle.device_uuid.strip():
        raise InvalidHandle("device_uuid is empty")
    _check_blob("ipc_handle", handle.ipc_handle, MAX_IPC_HANDLE_BYTES)
    _check_blob("ref_counter_handle", handle.ref_counter_handle, MAX_REF_COUNTER_HANDLE_BYTES)
    if handle.event_sync_required:
        _check_blob("event_handle", handle.event_handle, MAX_IPC_HANDLE_BYTES)
    check_bytes("storage_size_bytes", handle.storage_size_bytes, minimum=1)
    check_bytes("storage_offset_bytes", handle.storage_offset_bytes)
    check_bytes("ref_counter_offset", handle.ref_counter_offset)
    check_view(
        dtype,
        handle.shape,
        handle.stride,
        offset_elements=handle.tensor_offset,
        capacity_bytes=handle.storage_size_bytes,
    )
    return dtype


def open_cuda_ipc(handle: CudaIpcHandle) -> torch.Tensor:
    """A view of the exporter's GPU memory, readable once the exporter's event completed."""
    dtype = check_cuda_ipc(handle)
    if not cuda_available():
        raise HandleUnavailable(
            "a CUDA IPC handle needs a CUDA GPU and this sidecar has none;"
            " a CPU node shares KV buffers through shared-memory handles"
        )
    index = cuda_index(handle.device_uuid)
    if index is None:
        raise HandleUnavailable(f"GPU {handle.device_uuid} is not visible to the sidecar")
    info = gpu_info(handle.device_uuid)
    if info is not None and info.memory_free < OPEN_RESERVE_BYTES:
        raise HandleUnavailable(
            f"GPU {handle.device_uuid} has {info.memory_free} bytes free;"
            f" opening its buffers needs {OPEN_RESERVE_BYTES}"
        )
    with torch.cuda.device(index):
        tensor = rebuild_cuda_tensor(
            torch.Tensor,
            torch.Size(handle.shape),
            handle.stride,
            handle.tensor_offset,
            torch.UntypedStorage,
            dtype,
            index,
            handle.ipc_handle,
            handle.storage_size_bytes,
            handle.storage_offset_bytes,
            False,
            handle.ref_counter_handle,
            handle.ref_counter_offset,
            handle.event_handle,
            handle.event_sync_required,
        )
        # The rebuild queues a wait on the producer's event on the current stream only;
        # finishing it here orders every later read, on any stream, after the producer.
        torch.cuda.current_stream(index).synchronize()
    return tensor


def _check_blob(name: str, value: bytes, limit: int) -> None:
    if not 1 <= len(value) <= limit:
        raise InvalidHandle(f"{name} must hold 1 to {limit} bytes, got {len(value)}")
