"""Tensor handles as plain values: what a model server tells the sidecar about its buffers.

These mirror `kvmoq.v1.TensorHandle` field by field, so the gRPC servicer converts the
message once and nothing below it imports protobuf. dtype is a name of
`sidecar.kvcache.layout.DTYPES`, the same names a `KVLayout` uses.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SharedMemoryHandle:
    """A strided view into a file both processes map (a CPU node, or tests).

    Element (i0, i1, ...) is at byte `offset + itemsize * sum(i_k * stride[k])`; the view
    must stay inside the `size` bytes that follow `offset`.
    """

    path: str
    offset: int
    size: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CudaIpcHandle:
    """A CUDA IPC export, field by field as `torch.multiprocessing` shares a tensor.

    The fields are exactly the arguments of torch's `rebuild_cuda_tensor`, with the device
    named by UUID instead of an index (indices differ between processes that see different
    CUDA_VISIBLE_DEVICES).
    """

    device_uuid: str
    ipc_handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    tensor_offset: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool


TensorHandle = SharedMemoryHandle | CudaIpcHandle
