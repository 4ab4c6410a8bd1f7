"""Real vLLM engines (vLLM's CPU build, in `.venv-vllm`) with the kvmoq connector, each
beside its own sidecar, and one relay: the layout of a disaggregated deployment.

Engines take about 35 s to start here, so one stack serves the whole module: producer P
(`kv_producer`, publishes fp16 and int8, fp16 eagerly) and consumer D (`kv_both`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kvmoq_client.buffers import orphaned_shared_memory_files

from sidecar.demo.children import Children
from sidecar.demo.nodes import SidecarNode, start_sidecar
from sidecar.demo.services import RelayService, start_relay
from sidecar.demo.vllm_engines import Engine, close_engines, start_engine, unavailable_reason
from sidecar.moqt.aio.tls import CertificatePaths, write_certificate

TRACKS = "fp16,int8"
DTYPE = "float32"
"""Exact enough to compare log-probabilities to 0.05 (bfloat16 logits step by 0.125 here),
and 3.5x faster than float16 in vLLM's CPU kernels. The fp16 track then rounds the KV once
(2^-11 relative), far below what the tests tell apart."""


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


def kvmoq_engine(children: Children, name: str, sidecar: SidecarNode, role: str) -> Engine:
    extra = {"sidecar": sidecar.grpc, "tracks": TRACKS, "default_track": "fp16"}
    return start_engine(children, name, role=role, extra=extra, dtype=DTYPE)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if reason := unavailable_reason():
        pytest.skip(reason)
    scratch = tmp_path_factory.mktemp("vllm")
    orphans_before = orphaned_shared_memory_files()
    with Children() as children:
        cert = write_certificate(scratch)
        relay = start_relay(children, cert)
        sidecar_p = start_sidecar(children, "sidecar p", relay.url, cert.cert, scratch)
        sidecar_d = start_sidecar(children, "sidecar d", relay.url, cert.cert, scratch)
        p = kvmoq_engine(children, "engine p", sidecar_p, "kv_producer")
        d = kvmoq_engine(children, "engine d", sidecar_d, "kv_both")
        yield Stack(children, cert, scratch, relay, sidecar_p, sidecar_d, p, d)
        close_engines(p, d)
    assert orphaned_shared_memory_files() <= orphans_before, "an engine left its shared memory"
