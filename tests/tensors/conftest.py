"""A private directory on /dev/shm per test, so the roots check sees a real memory filesystem."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format
from kvmoq_client.v1 import tensor_handle_pb2

from sidecar.tensors import SharedMemoryHandle

DTYPE_NAMES = {
    tensor_handle_pb2.DTYPE_FLOAT16: "float16",
    tensor_handle_pb2.DTYPE_BFLOAT16: "bfloat16",
    tensor_handle_pb2.DTYPE_FLOAT32: "float32",
}


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="kvmoq-test-", dir="/dev/shm"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def shm_handle_from_json(text: str) -> SharedMemoryHandle:
    """The handle a client printed, as the servicer would convert its message."""
    message = json_format.Parse(text, tensor_handle_pb2.TensorHandle()).shared_memory
    return SharedMemoryHandle(
        path=message.path,
        offset=message.offset,
        size=message.size,
        dtype=DTYPE_NAMES[message.dtype],
        shape=tuple(message.shape),
        stride=tuple(message.stride),
    )
