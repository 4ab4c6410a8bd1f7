"""CUDA IPC handles: every field checked on any node; opening refused clearly without a GPU.

The export-and-open round trip across two processes needs a GPU and runs only there.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from kvmoq_client.buffers import cuda_ipc_handle

from sidecar.tensors import CudaIpcHandle, HandleUnavailable, InvalidHandle, open_handle
from sidecar.tensors.cuda_ipc import MAX_IPC_HANDLE_BYTES, check_cuda_ipc

HANDLE = CudaIpcHandle(
    device_uuid="GPU-8d6c1f0e-0000-4000-8000-000000000000",
    ipc_handle=bytes(64),
    storage_size_bytes=4096,
    storage_offset_bytes=0,
    tensor_offset=0,
    dtype="float16",
    shape=(2, 16, 64),
    stride=(1024, 64, 1),
    ref_counter_handle=b"/torch_1234_5678_0",
    ref_counter_offset=0,
    event_handle=bytes(64),
    event_sync_required=True,
)


def test_a_well_formed_handle_passes_the_checks() -> None:
    assert check_cuda_ipc(HANDLE) is torch.float16


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"device_uuid": " "}, "device_uuid is empty"),
        ({"ipc_handle": b""}, "ipc_handle must hold"),
        ({"ipc_handle": bytes(MAX_IPC_HANDLE_BYTES + 1)}, "ipc_handle must hold"),
        ({"ref_counter_handle": b""}, "ref_counter_handle must hold"),
        ({"event_handle": b""}, "event_handle must hold"),
        ({"storage_size_bytes": 0}, "storage_size_bytes must be"),
        ({"tensor_offset": 1}, "ends at byte 4098, past the 4096 bytes"),
        ({"shape": (3, 16, 64)}, "past the 4096 bytes"),
        ({"stride": (64, 64, 1)}, "two elements to one address"),
        ({"dtype": "float64"}, "dtype must be one of"),
    ],
)
def test_a_malformed_handle_is_refused_before_any_cuda_call(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidHandle, match=message):
        open_handle(replace(HANDLE, **changes))


def test_an_event_is_optional_when_no_sync_is_required() -> None:
    assert check_cuda_ipc(replace(HANDLE, event_handle=b"", event_sync_required=False))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the node without a GPU")
def test_without_a_gpu_a_cuda_handle_is_unavailable_not_a_crash() -> None:
    with pytest.raises(HandleUnavailable, match="needs a CUDA GPU"):
        open_handle(HANDLE)


def test_the_client_exports_only_cuda_tensors() -> None:
    with pytest.raises(ValueError, match="CUDA IPC exports CUDA tensors"):
        cuda_ipc_handle(torch.zeros(4))


_IMPORTER = """
import sys, torch
from google.protobuf import json_format
from kvmoq_client.v1 import tensor_handle_pb2
from sidecar.tensors import CudaIpcHandle, open_handle
m = json_format.Parse(sys.stdin.readline(), tensor_handle_pb2.TensorHandle()).cuda_ipc
view = open_handle(CudaIpcHandle(
    m.device_uuid, m.ipc_handle, m.storage_size_bytes, m.storage_offset_bytes, m.tensor_offset,
    "float16", tuple(m.shape), tuple(m.stride), m.ref_counter_handle, m.ref_counter_offset,
    m.event_handle, m.event_sync_required))
print(float(view.sum()), flush=True)
view.fill_(2)
torch.cuda.synchronize()
print("filled", flush=True)
sys.stdin.readline()
"""


@pytest.mark.cuda
def test_a_cuda_buffer_is_shared_between_two_processes() -> None:
    from google.protobuf import json_format

    exported = torch.ones((8, 4, 16), dtype=torch.float16, device="cuda")[2:6].transpose(1, 2)
    handle = json_format.MessageToJson(cuda_ipc_handle(exported), indent=None)
    importer = subprocess.Popen(
        [sys.executable, "-c", _IMPORTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert importer.stdin is not None and importer.stdout is not None
    try:
        importer.stdin.write(handle + "\n")
        importer.stdin.flush()
        assert float(importer.stdout.readline()) == exported.numel()
        assert importer.stdout.readline().strip() == "filled"
        assert bool((exported == 2).all())
    finally:
        importer.kill()
        importer.wait(timeout=30)
