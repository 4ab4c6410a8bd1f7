"""Two services as child processes: a relay, and a bare prefill node publishing a prompt.

The relay is started the same way for `kvmoq demo` and `kvmoq bench e2e`. The bare prefill
node (no sidecar, no gRPC) is the benchmark's publisher, so its figures are those of kvmoq's
transfer path alone. Each function returns once its service is ready to serve.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.address import free_udp_port
from sidecar.demo.children import Children, python_module, python_with
from sidecar.moqt.aio.quic_backend import (
    LOOPBACK_DATAGRAM_SIZE,
    BackendName,
    fastest_relay_backend,
)
from sidecar.moqt.aio.tls import CertificatePaths

HOST = "127.0.0.1"
RELAY_TIMEOUT_S = 60.0
PREFILL_TIMEOUT_S = 300.0
"""Loading SmolLM2 and prefilling a long prompt on a busy CPU takes minutes, not seconds."""


@dataclass(frozen=True, slots=True)
class RelayService:
    url: str
    pid: int
    backend: BackendName
    """Its QUIC stack: the fastest one an interpreter here has for its packet size."""


def start_relay(
    children: Children,
    cert: CertificatePaths,
    *flags: str,
    datagram_size: int = LOOPBACK_DATAGRAM_SIZE,
) -> RelayService:
    """A relay on a free loopback port for `datagram_size`-byte packets, on the fastest QUIC
    stack an interpreter here has for them (aiopquic from the relay's Python 3.12 at
    internet sizes); ``flags``: an edge's --upstream, --http for its /metrics."""
    backend = fastest_relay_backend(datagram_size, lambda name: python_with(name) is not None)
    python = python_with(backend)
    assert python is not None
    relay = children.start(
        f"relay ({backend})",
        python_module(
            "sidecar.cli",
            "relay",
            "--listen",
            f"{HOST}:{free_udp_port()}",
            "--cert",
            str(cert.cert),
            "--key",
            str(cert.key),
            "--max-datagram-size",
            str(datagram_size),
            "--backend",
            backend,
            *flags,
            python=python,
        ),
        ready_prefix="listening on ",
        timeout=RELAY_TIMEOUT_S,
    )
    url = relay.ready_line.removeprefix("listening on ")
    return RelayService(url, relay.process.pid, backend)


def start_prefill(
    children: Children,
    url: str,
    ca: Path,
    tokens: int,
    *,
    datagram_size: int = LOOPBACK_DATAGRAM_SIZE,
) -> dict[str, Any]:
    """A prefill node that has published the KV of the first `tokens` pydoc tokens through
    the relay at `url`; its ready event (prompt id, prefill seconds)."""
    prefill = children.start(
        "prefill server",
        python_module(
            "sidecar.demo.prefill",
            "--url",
            url,
            "--ca",
            str(ca),
            "--tokens",
            str(tokens),
            "--max-datagram-size",
            str(datagram_size),
        ),
        ready_prefix='{"event": "ready"',
        timeout=PREFILL_TIMEOUT_S,
    )
    return dict(json.loads(prefill.ready_line))
