"""Where KV bytes live on this node: opening the buffers a model server hands the sidecar.

Shared-memory files on CPU nodes and in tests, CUDA IPC on GPU nodes; both arrive as plain
handle values (the servicer converts the protobuf) and open as torch tensors that view the
model server's memory in place.
"""

from .errors import HandleError, HandleUnavailable, InvalidHandle
from .handles import CudaIpcHandle, SharedMemoryHandle, TensorHandle
from .opener import open_handle
from .shm import DEFAULT_SHM_ROOTS

__all__ = [
    "DEFAULT_SHM_ROOTS",
    "CudaIpcHandle",
    "HandleError",
    "HandleUnavailable",
    "InvalidHandle",
    "SharedMemoryHandle",
    "TensorHandle",
    "open_handle",
]
