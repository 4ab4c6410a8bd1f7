"""Where KV bytes live on this node: opening the buffers a model server hands the sidecar.

Shared-memory files on CPU nodes and in tests, CUDA IPC on GPU nodes; both arrive as plain
handle values (the servicer converts the protobuf) and open as torch tensors that view the
model server's memory in place. `nvml` says which GPU a handle is on and how codec work
on it should yield to the model, and `streams` runs that work on the streams it plans;
without NVML or a GPU they answer for the CPU path.
"""

from .errors import HandleError, HandleUnavailable, InvalidHandle
from .handles import CudaIpcHandle, SharedMemoryHandle, TensorHandle
from .nvml import GpuInfo, StreamPlan, codec_stream_plan, codec_streams, cuda_available, gpu_info
from .opener import open_handle
from .shm import DEFAULT_SHM_ROOTS
from .streams import CodecStreams

__all__ = [
    "DEFAULT_SHM_ROOTS",
    "CodecStreams",
    "CudaIpcHandle",
    "GpuInfo",
    "HandleError",
    "HandleUnavailable",
    "InvalidHandle",
    "SharedMemoryHandle",
    "StreamPlan",
    "TensorHandle",
    "codec_stream_plan",
    "codec_streams",
    "cuda_available",
    "gpu_info",
    "open_handle",
]
