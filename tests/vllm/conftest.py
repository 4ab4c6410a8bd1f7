"""Real vLLM engines (vLLM's CPU build, in `.venv-vllm`) with the kvmoq connector, each
beside its own sidecar, and one relay: the layout of a disaggregated deployment.

Engines take about 35 s to start here, so one stack serves the whole module: producer P
(`kv_producer`, publishes fp16 and int8, fp16 eagerly) and consumer D (`kv_both`).
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kvmoq_client.buffers import shared_memory_files

from sidecar.demo.children import Child, Children
from sidecar.demo.nodes import SidecarNode, start_sidecar
from sidecar.demo.services import RelayService, start_relay
from sidecar.moqt.aio.tls import CertificatePaths, write_certificate

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MODEL_DIR = REPO / ".cache" / "smollm2-hf"
ENGINE_START_S = 300.0
GENERATE_S = 300.0
ENGINE_STOP_S = 60.0
TRACKS = "fp16,int8"
GENERATED = '{"event": "generated"'


@dataclass
class Output:
    token_ids: list[int]
    text: str
    cached_tokens: int
    logprobs: list[dict[str, float]]
    """Per generated position, the top tokens' log-probabilities (token id as a string)."""


class Engine:
    """A tests/vllm/engine.py process: requests in on its stdin, outputs on its stdout."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        """Answers only: vLLM logs to stdout too (a load failure it recovers from, say)."""
        assert self.child.process.stdout is not None
        for line in self.child.process.stdout:
            if line.startswith(GENERATED):
                self._lines.put(line)
            else:
                self.child.extra_lines.append(line)

    def generate(self, *requests: dict[str, Any]) -> list[Output]:
        """Greedy outputs of `requests` ({"token_ids", "max_tokens", "tracks"?}), in one batch."""
        stdin = self.child.process.stdin
        assert stdin is not None
        stdin.write(json.dumps({"requests": list(requests)}) + "\n")
        stdin.flush()
        try:
            reply = json.loads(self._lines.get(timeout=GENERATE_S))
        except queue.Empty:
            raise AssertionError(
                f"{self.child.name} did not answer:\n{self.child.log_tail()}"
            ) from None
        return [Output(**output) for output in reply["outputs"]]

    def close(self) -> None:
        """End of its stdin: the engine shuts down (its connector unregisters and removes
        its shared memory)."""
        stdin = self.child.process.stdin
        assert stdin is not None
        stdin.close()
        self.child.process.wait(ENGINE_STOP_S)


@dataclass
class Stack:
    children: Children
    cert: CertificatePaths
    scratch: Path
    relay: RelayService
    sidecar_p: SidecarNode
    sidecar_d: SidecarNode
    p: Engine
    d: Engine

    def restart_sidecar_d(self) -> None:
        """A new sidecar process on D's socket (a restarted container)."""
        self.sidecar_d = start_sidecar(
            self.children, "sidecar d", self.relay.url, self.cert.cert, self.scratch
        )


def start_engine(children: Children, name: str, sidecar: SidecarNode, role: str) -> Engine:
    extra = {"sidecar": sidecar.grpc, "tracks": TRACKS, "default_track": "fp16"}
    child = children.start(
        name,
        [str(VLLM_PYTHON), str(REPO / "tests" / "vllm" / "engine.py"), "--model", str(MODEL_DIR),
         "--role", role, "--extra", json.dumps(extra)],
        ready_prefix='{"event": "ready"',
        timeout=ENGINE_START_S,
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
        stdin=True,
    )  # fmt: skip
    return Engine(child)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no {VLLM_PYTHON}: scripts/setup.sh makes it")
    from sidecar.models.smollm2 import write_hf_directory

    write_hf_directory(MODEL_DIR)
    scratch = tmp_path_factory.mktemp("vllm")
    shared_before = shared_memory_files()
    with Children() as children:
        cert = write_certificate(scratch)
        relay = start_relay(children, cert)
        sidecar_p = start_sidecar(children, "sidecar p", relay.url, cert.cert, scratch)
        sidecar_d = start_sidecar(children, "sidecar d", relay.url, cert.cert, scratch)
        p = start_engine(children, "engine p", sidecar_p, "kv_producer")
        d = start_engine(children, "engine d", sidecar_d, "kv_both")
        yield Stack(children, cert, scratch, relay, sidecar_p, sidecar_d, p, d)
        for engine in (p, d):
            engine.close()
    assert shared_memory_files() <= shared_before, "an engine left its shared memory"
