"""Shared-memory handles across two real processes, and every way a handle can be wrong."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from kvmoq_client.buffers import orphaned_shared_memory_files

from sidecar.tensors import HandleError, InvalidHandle, SharedMemoryHandle, open_handle
from sidecar.tensors.geometry import MAX_DIMS, MAX_VIEW_BYTES

from .conftest import shm_handle_from_json
from .exporter import SHAPE

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def exporter(shm_dir: Path) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.tensors.exporter", str(shm_dir)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    yield process
    process.kill()
    process.wait(timeout=10)


def _ask(process: subprocess.Popen[str], command: str) -> str:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(command + "\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def test_both_processes_see_each_others_writes(
    exporter: subprocess.Popen[str], shm_dir: Path
) -> None:
    assert exporter.stdout is not None
    handle = shm_handle_from_json(exporter.stdout.readline())
    assert handle.offset == 4100 and handle.stride != (24, 3, 1)  # a real strided view
    view = open_handle(handle, [shm_dir])
    assert view.shape == SHAPE
    assert torch.equal(view, torch.arange(view.numel(), dtype=torch.float32).reshape(SHAPE))
    view.fill_(7.0)
    assert _ask(exporter, "check 7") == "ok"
    assert _ask(exporter, "fill -2.5") == "done"
    assert bool((view == -2.5).all())


def test_a_buffer_is_orphaned_only_once_its_process_died_without_closing_it(
    exporter: subprocess.Popen[str], shm_dir: Path
) -> None:
    """What the leak checks of the vLLM and load-bench tests rely on, while other processes
    create and drop buffers of their own in the same directory."""
    assert exporter.stdout is not None
    path = Path(shm_handle_from_json(exporter.stdout.readline()).path)
    assert path.parent == shm_dir and orphaned_shared_memory_files(shm_dir) == set()
    exporter.kill()
    exporter.wait(timeout=10)
    assert orphaned_shared_memory_files(shm_dir) == {path}


def test_a_process_that_exits_without_closing_its_buffer_leaves_no_file(
    exporter: subprocess.Popen[str], shm_dir: Path
) -> None:
    """The client library removes a buffer file's name at interpreter exit, so only a killed
    process can leave one behind."""
    assert exporter.stdout is not None and exporter.stdin is not None
    path = Path(shm_handle_from_json(exporter.stdout.readline()).path)
    assert path.exists()
    exporter.stdin.write("leave\n")
    exporter.stdin.flush()
    assert exporter.wait(timeout=30) == 0
    assert not path.exists()
    assert orphaned_shared_memory_files(shm_dir) == set()


def _file(directory: Path, nbytes: int = 4096) -> Path:
    path = directory / "kv"
    path.write_bytes(bytes(nbytes))
    return path


def _handle(path: Path, **changes: object) -> SharedMemoryHandle:
    handle = SharedMemoryHandle(str(path), 0, 4096, "float32", (16, 64), (64, 1))
    return replace(handle, **changes)


def test_a_valid_handle_opens_a_writable_view(shm_dir: Path) -> None:
    path = _file(shm_dir)
    view = open_handle(
        _handle(path, offset=1024, size=2048, shape=(2, 8), stride=(1, 2)), [shm_dir]
    )
    view[1, 7] = 3.0
    flat = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.float32)
    assert flat[256 + 15].item() == 3.0
    assert flat.count_nonzero().item() == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"size": 8192, "shape": (32, 64)}, "past the end"),
        ({"offset": 4}, "past the end"),
        ({"shape": (17, 64)}, "ends at byte"),
        ({"stride": (65, 1)}, "ends at byte"),
        ({"offset": 2}, "not aligned"),
        ({"dtype": "int64"}, "dtype must be one of"),
        ({"stride": (64,)}, "strides"),
        ({"stride": (0, 1)}, "two elements to one address"),
        ({"stride": (32, 1)}, "two elements to one address"),
        ({"shape": (16, 0)}, "every dimension"),
        ({"shape": (1,) * (MAX_DIMS + 1), "stride": (1,) * (MAX_DIMS + 1)}, "dimensions"),
        ({"size": MAX_VIEW_BYTES + 1}, "size must be"),
        ({"size": 0}, "size must be"),
        ({"shape": (1 << 62, 1)}, "every dimension"),
    ],
)
def test_a_view_beyond_its_file_or_malformed_is_refused(
    shm_dir: Path, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidHandle, match=message):
        open_handle(_handle(_file(shm_dir), **changes), [shm_dir])


def test_only_regular_files_under_the_roots_open(shm_dir: Path, tmp_path: Path) -> None:
    outside = _file(tmp_path)
    with pytest.raises(InvalidHandle, match="outside the shared-memory roots"):
        open_handle(_handle(outside), [shm_dir])
    (shm_dir / "link").symlink_to(outside)
    with pytest.raises(InvalidHandle, match="outside the shared-memory roots"):
        open_handle(_handle(shm_dir / "link"), [shm_dir])
    with pytest.raises(InvalidHandle, match="absolute"):
        open_handle(_handle(Path("kv")), [shm_dir])
    with pytest.raises(InvalidHandle, match="no such file"):
        open_handle(_handle(shm_dir / "missing"), [shm_dir])
    (shm_dir / "dir").mkdir()
    with pytest.raises(InvalidHandle, match="not a regular file"):
        open_handle(_handle(shm_dir / "dir"), [shm_dir])


def test_the_default_root_is_dev_shm(tmp_path: Path) -> None:
    with pytest.raises(HandleError, match=r"roots \(/dev/shm\)"):
        open_handle(_handle(_file(tmp_path)))
