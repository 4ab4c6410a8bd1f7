"""Fuzz target of the sidecar's local API: the requests' bytes, and every field the sidecar
reads from them."""

from __future__ import annotations

from google.protobuf.message import DecodeError as ProtobufDecodeError
from kvmoq_client.v1 import kv_cache_pb2 as pb
from kvmoq_client.v1 import tensor_handle_pb2 as handle_pb

from fuzz.targets import Target
from sidecar.kvcache.errors import KVCodecError
from sidecar.service import messages
from sidecar.service.errors import RequestError
from sidecar.tensors.errors import HandleError
from sidecar.tensors.geometry import check_view, handle_dtype


def grpc_requests(data: bytes) -> None:
    """A RegisterBuffers or Load request's bytes, then every field the sidecar reads."""
    if data[:1] == b"L":
        load = pb.LoadRequest.FromString(data[1:])
        messages.placement(load.destination, "destination")
        return
    request = pb.RegisterBuffersRequest.FromString(data)
    messages.layout(request.layout)
    messages.arrangement(request)
    for buffer in request.buffers:
        handle = messages.tensor_handle(buffer.handle, "buffer")
        dtype = handle_dtype(handle.dtype)
        check_view(dtype, handle.shape, handle.stride, offset_elements=0, capacity_bytes=1 << 40)


def _grpc_seeds() -> list[bytes]:
    handle = handle_pb.TensorHandle(
        shared_memory=handle_pb.SharedMemoryHandle(
            path="/dev/shm/kv",
            size=4096,
            dtype=handle_pb.DTYPE_FLOAT16,
            shape=[8, 16],
            stride=[16, 1],
        )
    )
    register = pb.RegisterBuffersRequest(
        layout=pb.KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=handle_pb.DTYPE_FLOAT16),
        contiguous=pb.ContiguousLayout(max_tokens=64),
        buffers=[pb.KVBuffer(layer=0, part=pb.KV_PART_KEY_VALUE, handle=handle)],
    )
    load = pb.LoadRequest(
        buffer_set_id="s", token_ids=[1, 2], destination=pb.KVLocation(
            blocks=pb.BlockList(block_ids=[0, 1])
        ),
    )  # fmt: skip
    return [register.SerializeToString(), b"L" + load.SerializeToString()]


TARGETS: dict[str, Target] = {
    "grpc_requests": Target(
        grpc_requests,
        (ProtobufDecodeError, RequestError, HandleError, KVCodecError),
        _grpc_seeds,
    ),
}
