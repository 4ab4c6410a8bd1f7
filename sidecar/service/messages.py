"""kvmoq.v1 protobuf messages to and from the types of `buffers` and `kv_service`.

Protobuf gives every missing field a zero value, so each conversion checks what the
contract requires (a oneof that is set, an enum that is specified) and refuses with a
message that names the field, instead of letting a zero flow into a shape.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from kvmoq_client.v1 import kv_cache_pb2 as pb
from kvmoq_client.v1 import tensor_handle_pb2 as handle_pb

from sidecar.kvcache.errors import LayoutError
from sidecar.kvcache.layout import KVLayout
from sidecar.service.buffers import (
    Arrangement,
    BlockIds,
    Contiguous,
    KVBuffer,
    KVPart,
    Paged,
    Placement,
    TokenSlots,
)
from sidecar.service.errors import InvalidArgument
from sidecar.service.kv_service import ChunkWritten, Found, LoadEvent, LoadOutcome
from sidecar.tensors.handles import CudaIpcHandle, SharedMemoryHandle, TensorHandle
from sidecar.transfer.publisher import PublishedPrompt

HandleOpener = Callable[[TensorHandle], torch.Tensor]
"""Opens a view of a model server's buffer (sidecar.tensors.open_handle)."""

_DTYPES = {
    handle_pb.DTYPE_FLOAT16: "float16",
    handle_pb.DTYPE_BFLOAT16: "bfloat16",
    handle_pb.DTYPE_FLOAT32: "float32",
}
_PARTS = {
    pb.KV_PART_KEY: KVPart.KEY,
    pb.KV_PART_VALUE: KVPart.VALUE,
    pb.KV_PART_KEY_VALUE: KVPart.KEY_VALUE,
}


def _dtype(value: int, field: str) -> str:
    name = _DTYPES.get(value)
    if name is None:
        raise InvalidArgument(f"{field} must be DTYPE_FLOAT16, DTYPE_BFLOAT16 or DTYPE_FLOAT32")
    return name


def layout(message: pb.KVLayout) -> KVLayout:
    dtype = _dtype(message.dtype, "layout.dtype")
    try:
        return KVLayout(message.num_layers, message.num_kv_heads, message.head_dim, dtype)
    except LayoutError as exc:
        raise InvalidArgument(f"layout: {exc}") from None


def arrangement(request: pb.RegisterBuffersRequest) -> Arrangement:
    which = request.WhichOneof("arrangement")
    if which == "contiguous":
        return Contiguous(request.contiguous.max_tokens)
    if which == "paged":
        return Paged(request.paged.block_size, request.paged.num_blocks)
    raise InvalidArgument("set contiguous (max_tokens) or paged (block_size, num_blocks)")


def buffer(message: pb.KVBuffer, open_handle: HandleOpener) -> KVBuffer:
    where = f"buffer of layer {message.layer}"
    part = _PARTS.get(message.part)
    if part is None:
        raise InvalidArgument(f"{where}: part must be KEY, VALUE or KEY_VALUE")
    return KVBuffer(message.layer, part, open_handle(tensor_handle(message.handle, where)))


def tensor_handle(message: handle_pb.TensorHandle, where: str) -> TensorHandle:
    which = message.WhichOneof("handle")
    if which == "shared_memory":
        shm = message.shared_memory
        return SharedMemoryHandle(
            shm.path,
            shm.offset,
            shm.size,
            _dtype(shm.dtype, f"{where}: shared_memory.dtype"),
            tuple(shm.shape),
            tuple(shm.stride),
        )
    if which == "cuda_ipc":
        ipc = message.cuda_ipc
        return CudaIpcHandle(
            ipc.device_uuid,
            ipc.ipc_handle,
            ipc.storage_size_bytes,
            ipc.storage_offset_bytes,
            ipc.tensor_offset,
            _dtype(ipc.dtype, f"{where}: cuda_ipc.dtype"),
            tuple(ipc.shape),
            tuple(ipc.stride),
            ipc.ref_counter_handle,
            ipc.ref_counter_offset,
            ipc.event_handle,
            ipc.event_sync_required,
        )
    raise InvalidArgument(f"{where}: the handle is empty (shared_memory or cuda_ipc)")


def placement(message: pb.KVLocation, field: str) -> Placement:
    which = message.WhichOneof("location")
    if which == "token_range":
        return TokenSlots(message.token_range.start, message.token_range.end)
    if which == "blocks":
        return BlockIds(tuple(message.blocks.block_ids))
    raise InvalidArgument(f"{field} must be a token_range (contiguous) or blocks (paged)")


def published(prompt: PublishedPrompt) -> pb.PublishResponse:
    return pb.PublishResponse(
        prompt_id=prompt.name.prompt_id,
        namespace=[field.decode() for field in prompt.namespace],
        tracks=prompt.offered,
        chunks=prompt.chunk_count,
    )


def found(result: Found) -> pb.LookupResponse:
    return pb.LookupResponse(
        available_tokens=result.tokens,
        ready_tokens=result.ready_tokens,
        prompt_id=result.prompt.prompt_id if result.prompt else "",
        relay_url=result.relay_url,
        estimated_seconds=result.estimated_seconds,
        withdrawn=result.withdrawn,
    )


def _range(tokens: range) -> pb.TokenRange:
    return pb.TokenRange(start=tokens.start, end=tokens.stop)


def progress(event: LoadEvent) -> pb.LoadProgress:
    if isinstance(event, ChunkWritten):
        return pb.LoadProgress(chunk_loaded=pb.ChunkLoaded(tokens=_range(event.tokens)))
    return pb.LoadProgress(finished=finished(event))


def finished(outcome: LoadOutcome) -> pb.LoadFinished:
    return pb.LoadFinished(
        loaded=[_range(span) for span in outcome.loaded],
        prefix_tokens=outcome.prefix_tokens,
        compute_tokens=outcome.compute_tokens,
        stop_reason=pb.StopReason.Value(f"STOP_REASON_{outcome.stop.name}"),
        rejected=[
            pb.ChunkRejected(
                chunk=chunk.index,
                tokens=_range(chunk.tokens),
                track=chunk.track,
                reason=chunk.reason,
            )
            for chunk in outcome.rejected
        ],
        prompt_id=outcome.prompt.prompt_id if outcome.prompt else "",
        available_tokens=outcome.available,
        track_bytes=dict(outcome.track_bytes),
        max_kl=outcome.max_kl,
        expected_kl=outcome.expected_kl,
    )
