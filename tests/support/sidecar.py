"""A real `kvmoq sidecar` process, its API over the Unix socket, and KV buffers in shared
memory that the test owns as a model server would.

Shared by the service tests. The sidecar runs as `python -m sidecar.cli
sidecar`, started the way an operator starts it, with ports 0 (it prints the bound ones);
the relay is `tests.support.relay.running_relay`.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import torch
from kvmoq_client.buffers import DTYPES
from kvmoq_client.v1 import kv_cache_pb2 as pb
from kvmoq_client.v1 import kv_cache_pb2_grpc as pb_grpc
from kvmoq_client.v1 import tensor_handle_pb2 as handle_pb

from sidecar.demo.nodes import http_get
from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.aio.tls import CertificatePaths
from tests.support.relay import REPO

MODEL = "SmolLM2-135M"
"""The model prompts are published under (the KV of these tests is synthetic, small)."""
LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=16, dtype="float16")
CHUNK = 16
"""Small chunks (`--chunk-size`): a few dozen synthetic tokens span several MoQT groups."""

WAIT_S = 30.0
"""Bound on every wait for the sidecar (start, readiness, a log line); never asserted on."""


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    """Poll `condition` until it returns something truthy (returned), at most WAIT_S."""
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


@dataclass
class SidecarProcess:
    process: subprocess.Popen[str]
    grpc: str
    probe: str
    http: str
    log_file: Path
    channel: grpc.Channel = field(init=False)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.grpc)

    @property
    def stub(self) -> pb_grpc.KVCacheServiceStub:
        return pb_grpc.KVCacheServiceStub(self.channel)

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.http, path)

    def wait_ready(self) -> None:
        wait_for(lambda: self.get("/readyz")[0] == 200, "/readyz 200")

    def metric(self, name: str, **labels: str) -> float:
        """One sample of /metrics (0 when the series does not exist yet)."""
        selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        wanted = f"{name}{{{selector}}}" if labels else name
        for line in self.get("/metrics")[1].splitlines():
            key, _, value = line.rpartition(" ")
            if key == wanted:
                return float(value)
        return 0.0

    def logs(self) -> list[dict[str, Any]]:
        lines = self.log_file.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def wait_log(self, event: str, **fields: Any) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            return next(
                (
                    entry
                    for entry in self.logs()
                    if entry.get("event") == event
                    and all(entry.get(k) == v for k, v in fields.items())
                ),
                None,
            )

        return wait_for(find, f"log line {event} {fields}")

    def stop(self) -> int:
        """SIGTERM, as Kubernetes would; the exit status once it is gone."""
        self.channel.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(WAIT_S)
        finally:
            if self.process.poll() is None:
                self.process.kill()


@contextmanager
def running_sidecar(
    relay_url: str, cert: CertificatePaths, *flags: str, datagram_size: int | None = 16384
) -> Iterator[SidecarProcess]:
    """`python -m sidecar.cli sidecar` on a fresh socket and free ports, with loopback
    packets of `datagram_size` bytes (None: its default); yields once it serves (not
    necessarily connected to the relay: see `wait_ready`)."""
    with tempfile.TemporaryDirectory(prefix="kvmoq-sidecar-") as scratch:
        log_file = Path(scratch) / "sidecar.log"
        argv = [
            sys.executable, "-m", "sidecar.cli", "sidecar",
            "--relay", relay_url, "--ca", str(cert.cert),
            "--grpc", f"unix://{scratch}/api.sock",
            "--probe", "127.0.0.1:0", "--http", "127.0.0.1:0",
            *(() if datagram_size is None else ("--max-datagram-size", str(datagram_size))),
            *flags,
        ]  # fmt: skip
        with log_file.open("w") as log:
            process = subprocess.Popen(
                argv,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env={**os.environ, "KVMOQ_LOG_FORMAT": "json", "KVMOQ_LOG_LEVEL": "info"},
            )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line, f"sidecar exited: {log_file.read_text()[-2000:]}"
            serving = json.loads(line)
            assert serving["event"] == "serving", line
            sidecar = SidecarProcess(
                process, serving["grpc"], serving["probe"], serving["http"], log_file
            )
            try:
                yield sidecar
            finally:
                sidecar.stop()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(WAIT_S)
            print("--- sidecar log (tail)", *log_file.read_text().splitlines()[-40:], sep="\n")


@contextmanager
def shm_directory() -> Iterator[Path]:
    """A directory under /dev/shm, the sidecar's default shared-memory root."""
    with tempfile.TemporaryDirectory(prefix="kvmoq-test-", dir="/dev/shm") as directory:
        yield Path(directory)


def shm_tensor(path: Path, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed tensor in a new shared-memory file: the model server's side of a buffer."""
    return torch.from_file(str(path), shared=True, size=math.prod(shape), dtype=dtype).view(*shape)


def shm_handle(path: Path, tensor: torch.Tensor) -> handle_pb.TensorHandle:
    return handle_pb.TensorHandle(
        shared_memory=handle_pb.SharedMemoryHandle(
            path=str(path),
            offset=tensor.storage_offset() * tensor.element_size(),
            size=tensor.untyped_storage().nbytes(),
            dtype=DTYPES[tensor.dtype],
            shape=tensor.shape,
            stride=tensor.stride(),
        )
    )


def layout_message(layout: KVLayout) -> pb.KVLayout:
    return pb.KVLayout(
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=DTYPES[layout.torch_dtype],
    )


@dataclass
class ContiguousKV:
    """Per layer one KEY_VALUE buffer `[2, max_tokens, H, D]` (HF-style, K and V stacked)."""

    layout: KVLayout
    max_tokens: int
    directory: Path
    layers: list[torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        shape = (2, self.max_tokens, self.layout.num_kv_heads, self.layout.head_dim)
        self.layers = [
            shm_tensor(self._path(layer), shape, self.layout.torch_dtype)
            for layer in range(self.layout.num_layers)
        ]

    def _path(self, layer: int) -> Path:
        return self.directory / f"contiguous-{layer}"

    def request(self, model: str) -> pb.RegisterBuffersRequest:
        return pb.RegisterBuffersRequest(
            model=model,
            layout=layout_message(self.layout),
            contiguous=pb.ContiguousLayout(max_tokens=self.max_tokens),
            buffers=[
                pb.KVBuffer(
                    layer=layer,
                    part=pb.KV_PART_KEY_VALUE,
                    handle=shm_handle(self._path(layer), tensor),
                )
                for layer, tensor in enumerate(self.layers)
            ],
        )

    def put(self, start: int, kv: torch.Tensor) -> None:
        """Write `[L, 2, T, H, D]` into slots `start..start+T` (what prefill would do)."""
        for layer, tensor in enumerate(self.layers):
            tensor[:, start : start + kv.shape[2]] = kv[layer]

    def get(self, start: int, tokens: int) -> torch.Tensor:
        """`[L, 2, T, H, D]` from slots `start..start+T` (what decode would read)."""
        return torch.stack([tensor[:, start : start + tokens] for tensor in self.layers])


@dataclass
class PagedKV:
    """Per layer a KEY and a VALUE buffer `[num_blocks, block_size, H, D]` (vLLM-style)."""

    layout: KVLayout
    block_size: int
    num_blocks: int
    directory: Path
    keys: list[torch.Tensor] = field(init=False)
    values: list[torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        shape = (self.num_blocks, self.block_size, self.layout.num_kv_heads, self.layout.head_dim)
        dtype = self.layout.torch_dtype
        layers = range(self.layout.num_layers)
        self.keys = [shm_tensor(self._path(layer, "k"), shape, dtype) for layer in layers]
        self.values = [shm_tensor(self._path(layer, "v"), shape, dtype) for layer in layers]

    def _path(self, layer: int, part: str) -> Path:
        return self.directory / f"paged-{layer}-{part}"

    def request(self, model: str) -> pb.RegisterBuffersRequest:
        buffers = []
        for layer in range(self.layout.num_layers):
            for part, name, tensors in (
                (pb.KV_PART_KEY, "k", self.keys),
                (pb.KV_PART_VALUE, "v", self.values),
            ):
                handle = shm_handle(self._path(layer, name), tensors[layer])
                buffers.append(pb.KVBuffer(layer=layer, part=part, handle=handle))
        return pb.RegisterBuffersRequest(
            model=model,
            layout=layout_message(self.layout),
            paged=pb.PagedLayout(block_size=self.block_size, num_blocks=self.num_blocks),
            buffers=buffers,
        )

    def gather(self, block_ids: Sequence[int], tokens: int) -> torch.Tensor:
        """The KV `[L, 2, tokens, H, D]` the blocks hold for a request's first tokens."""
        rows = []
        for part in (self.keys, self.values):
            per_layer = [
                torch.cat([tensor[block] for block in block_ids])[:tokens] for tensor in part
            ]
            rows.append(torch.stack(per_layer))
        return torch.stack(rows, dim=1)


def publish_whole(
    sidecar: SidecarProcess,
    model: str,
    layout: KVLayout,
    kv: torch.Tensor,
    prompt: Sequence[int],
    directory: Path,
    tracks: Sequence[str],
    default_track: str = "",
) -> pb.PublishResponse:
    """What a prefill server does: ``kv`` into a contiguous buffer in ``directory``
    (registered), then Publish of every token of ``prompt`` from it."""
    source = ContiguousKV(layout, max_tokens=len(prompt), directory=directory)
    source.put(0, kv)
    set_id = sidecar.stub.RegisterBuffers(source.request(model)).buffer_set_id
    every_token = pb.KVLocation(token_range=pb.TokenRange(start=0, end=len(prompt)))
    return sidecar.stub.Publish(
        pb.PublishRequest(
            buffer_set_id=set_id,
            token_ids=prompt,
            source=every_token,
            tracks=tracks,
            default_track=default_track,
        )
    )


def synthetic_kv(layout: KVLayout, tokens: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(layout.shape(tokens), generator=generator).to(layout.torch_dtype)


def load(
    stub: pb_grpc.KVCacheServiceStub, request: pb.LoadRequest, **kwargs: Any
) -> tuple[list[pb.ChunkLoaded], pb.LoadFinished]:
    """Run a Load to its end: the chunks it reported, then its LoadFinished."""
    chunks: list[pb.ChunkLoaded] = []
    finished: list[pb.LoadFinished] = []
    for progress in stub.Load(request, **kwargs):
        assert not finished, "a message after LoadFinished"
        if progress.HasField("chunk_loaded"):
            chunks.append(progress.chunk_loaded)
        else:
            finished.append(progress.finished)
    assert len(finished) == 1, "no LoadFinished"
    return chunks, finished[0]


def spans(ranges: Sequence[pb.TokenRange]) -> list[tuple[int, int]]:
    return [(r.start, r.end) for r in ranges]
