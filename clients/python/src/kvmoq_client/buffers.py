"""Allocating KV buffers the sidecar can open, and the handle messages that describe them.

CPU nodes (and tests) keep KV in a file on a memory filesystem that this process and the
sidecar both map; GPU nodes keep it in CUDA memory exported with CUDA IPC. Either way the
model server owns the memory and the sidecar only views it, so the handles must outlive the
registration: free a buffer only after `unregister_buffers` returned.

Needs torch (`pip install 'kvmoq-client[torch]'`).
"""

from __future__ import annotations

import math
import mmap
import os
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvmoq_client._closing import ClosesOnExit
from kvmoq_client.v1 import kv_cache_pb2, tensor_handle_pb2

DEFAULT_SHM_DIR = Path("/dev/shm")
SHM_FILE_PREFIX = "kvmoq-"


def orphaned_shared_memory_files(directory: Path = DEFAULT_SHM_DIR) -> set[Path]:
    """The buffer files of this library in `directory` that no process maps or has open:
    what a process that ended without closing its buffers left behind.

    Files are judged by their holders, not by when they appeared, so files that other
    processes are using at the same time never count; nor do directories (tests keep theirs
    under the same prefix). The files are listed before their holders are looked for, so a
    file created meanwhile is not judged. A file is held from its creation on (`mkstemp`'s
    descriptor stays open until the mapping exists) and loses its name before its mapping
    (see `SharedMemoryFile.unlink`), so one closed meanwhile is gone by the last check.
    Processes of other users whose /proc entries cannot be read are not seen.
    """
    candidates = [path for path in directory.glob(f"{SHM_FILE_PREFIX}*") if path.is_file()]
    held: set[str] = set()
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            maps = (process / "maps").read_text()
            descriptors = [os.readlink(fd) for fd in (process / "fd").iterdir()]
        except OSError:  # it ended meanwhile, or it is not ours to read
            continue
        held.update(line.split(maxsplit=5)[-1] for line in maps.splitlines() if "/" in line)
        held.update(descriptors)
    return {path for path in candidates if str(path) not in held and path.exists()}


DTYPES: dict[torch.dtype, tensor_handle_pb2.DType] = {
    torch.float16: tensor_handle_pb2.DTYPE_FLOAT16,
    torch.bfloat16: tensor_handle_pb2.DTYPE_BFLOAT16,
    torch.float32: tensor_handle_pb2.DTYPE_FLOAT32,
}

Arrangement = kv_cache_pb2.ContiguousLayout | kv_cache_pb2.PagedLayout


def proto_dtype(dtype: torch.dtype) -> tensor_handle_pb2.DType:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"KV buffers hold {sorted(map(str, DTYPES))}, not {dtype}") from None


def _extent_bytes(view: torch.Tensor) -> int:
    """Bytes from a view's first element to just past its last one."""
    last = sum((size - 1) * step for size, step in zip(view.shape, view.stride(), strict=True))
    return (last + 1) * view.element_size()


class SharedMemoryFile:
    """A file on a memory filesystem, mapped shared, out of which views are cut.

    The file is created exclusively with mode 0600: the sidecar must run as the same user
    (in Kubernetes, the same `runAsUser` in both containers). Its name is removed by
    `unlink`, or else when the object is collected or the interpreter exits (a finalizer), so
    only a process that was killed leaves a file behind (`orphaned_shared_memory_files`).
    """

    def __init__(self, nbytes: int, directory: Path = DEFAULT_SHM_DIR) -> None:
        fd, name = tempfile.mkstemp(prefix=SHM_FILE_PREFIX, suffix=".kv", dir=directory)
        try:
            os.ftruncate(fd, nbytes)
            self._mapping = mmap.mmap(fd, nbytes)
        except BaseException:
            os.unlink(name)
            raise
        finally:
            os.close(fd)
        self.path = Path(name)
        self.nbytes = nbytes
        self._unlink = weakref.finalize(self, self.path.unlink, missing_ok=True)
        self._bytes = torch.frombuffer(self._mapping, dtype=torch.uint8)

    def view(self, offset: int, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
        """A contiguous tensor over the file's bytes from `offset` on."""
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if offset % dtype.itemsize or not 0 <= offset <= self.nbytes - nbytes:
            raise ValueError(f"{nbytes} bytes at offset {offset} do not fit {self.nbytes}")
        return self._bytes[offset : offset + nbytes].view(dtype).view(tuple(shape))

    def handle(self, view: torch.Tensor) -> tensor_handle_pb2.TensorHandle:
        """The handle of any view of this file (sliced, permuted, strided)."""
        offset = view.data_ptr() - self._bytes.data_ptr()
        size = _extent_bytes(view)
        if not 0 <= offset <= self.nbytes - size:
            raise ValueError(f"the tensor is not a view of {self.path}")
        return tensor_handle_pb2.TensorHandle(
            shared_memory=tensor_handle_pb2.SharedMemoryHandle(
                path=str(self.path),
                offset=offset,
                size=size,
                dtype=proto_dtype(view.dtype),
                shape=list(view.shape),
                stride=list(view.stride()),
            )
        )

    def unlink(self) -> None:
        """Remove the name; mappings (here and in the sidecar) stay valid until dropped."""
        self._unlink()


def cuda_device_uuid(device: torch.device) -> str:
    """The device's UUID as nvidia-smi prints it: the sidecar may number GPUs differently."""
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"


def cuda_ipc_handle(view: torch.Tensor) -> tensor_handle_pb2.TensorHandle:
    """The CUDA IPC handle of a CUDA tensor: torch's own export, field by field.

    The export records an event on the current stream; the sidecar waits on it before
    reading, so KV written on that stream before this call is what it sees first.
    """
    if view.device.type != "cuda":
        raise ValueError(f"CUDA IPC exports CUDA tensors; this one is on {view.device}")
    (
        device,
        ipc_handle,
        storage_size_bytes,
        storage_offset_bytes,
        ref_counter_handle,
        ref_counter_offset,
        event_handle,
        event_sync_required,
    ) = view.untyped_storage()._share_cuda_()
    return tensor_handle_pb2.TensorHandle(
        cuda_ipc=tensor_handle_pb2.CudaIpcHandle(
            device_uuid=cuda_device_uuid(torch.device("cuda", device)),
            ipc_handle=ipc_handle,
            storage_size_bytes=storage_size_bytes,
            storage_offset_bytes=storage_offset_bytes,
            tensor_offset=view.storage_offset(),
            dtype=proto_dtype(view.dtype),
            shape=list(view.shape),
            stride=list(view.stride()),
            ref_counter_handle=ref_counter_handle,
            ref_counter_offset=ref_counter_offset,
            event_handle=event_handle or b"",
            event_sync_required=event_sync_required,
        )
    )


@dataclass
class KVBuffers(ClosesOnExit):
    """One KEY_VALUE buffer per layer, `[2, *slots, kv_heads, head_dim]`, and their handles.

    `slots` is `(max_tokens,)` for a contiguous arrangement, `(num_blocks, block_size)` for
    a paged one, as the contract's RegisterBuffersRequest describes them.
    """

    layout: kv_cache_pb2.KVLayout
    arrangement: Arrangement
    tensors: list[torch.Tensor]
    handles: list[tensor_handle_pb2.TensorHandle]
    _file: SharedMemoryFile | None = field(default=None, repr=False)

    def register_request(self, model: str) -> kv_cache_pb2.RegisterBuffersRequest:
        buffers = [
            kv_cache_pb2.KVBuffer(layer=layer, part=kv_cache_pb2.KV_PART_KEY_VALUE, handle=handle)
            for layer, handle in enumerate(self.handles)
        ]
        if isinstance(self.arrangement, kv_cache_pb2.PagedLayout):
            return kv_cache_pb2.RegisterBuffersRequest(
                model=model, layout=self.layout, paged=self.arrangement, buffers=buffers
            )
        return kv_cache_pb2.RegisterBuffersRequest(
            model=model, layout=self.layout, contiguous=self.arrangement, buffers=buffers
        )

    def close(self) -> None:
        """Remove the shared-memory file's name (call after unregistering)."""
        if self._file is not None:
            self._file.unlink()


def _buffer_shape(num_kv_heads: int, head_dim: int, arrangement: Arrangement) -> tuple[int, ...]:
    if isinstance(arrangement, kv_cache_pb2.PagedLayout):
        slots: tuple[int, ...] = (arrangement.num_blocks, arrangement.block_size)
    else:
        slots = (arrangement.max_tokens,)
    return (2, *slots, num_kv_heads, head_dim)


def _layout(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> kv_cache_pb2.KVLayout:
    return kv_cache_pb2.KVLayout(
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=proto_dtype(dtype),
    )


def allocate_shared_kv(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    arrangement: Arrangement,
    directory: Path = DEFAULT_SHM_DIR,
) -> KVBuffers:
    """Every layer's K and V in one shared-memory file, zeroed (a new file reads as zeros)."""
    shape = _buffer_shape(num_kv_heads, head_dim, arrangement)
    layer_bytes = math.prod(shape) * dtype.itemsize
    shared = SharedMemoryFile(num_layers * layer_bytes, directory)
    tensors = [shared.view(layer * layer_bytes, dtype, shape) for layer in range(num_layers)]
    return KVBuffers(
        layout=_layout(num_layers, num_kv_heads, head_dim, dtype),
        arrangement=arrangement,
        tensors=tensors,
        handles=[shared.handle(tensor) for tensor in tensors],
        _file=shared,
    )


def allocate_cuda_kv(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    arrangement: Arrangement,
    device: torch.device,
) -> KVBuffers:
    """Every layer's K and V on a GPU, zeroed, exported with CUDA IPC."""
    shape = _buffer_shape(num_kv_heads, head_dim, arrangement)
    tensors = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    return share_cuda_kv(tensors)


def share_cuda_kv(tensors: Sequence[torch.Tensor]) -> KVBuffers:
    """A model server's own paged GPU cache, one `[2, num_blocks, block_size, kv_heads,
    head_dim]` view per layer (any strides), exported with CUDA IPC for the sidecar to read
    and write in place."""
    first = tensors[0]
    if first.dim() != 5 or first.shape[0] != 2:
        raise ValueError(f"a layer's paged KV is [2, blocks, size, heads, dim], not {first.shape}")
    if any(t.shape != first.shape or t.dtype != first.dtype for t in tensors):
        raise ValueError("every layer's KV must have the first layer's shape and dtype")
    _, num_blocks, block_size, num_kv_heads, head_dim = first.shape
    return KVBuffers(
        layout=_layout(len(tensors), num_kv_heads, head_dim, first.dtype),
        arrangement=kv_cache_pb2.PagedLayout(num_blocks=num_blocks, block_size=block_size),
        tensors=list(tensors),
        handles=[cuda_ipc_handle(tensor) for tensor in tensors],
    )
