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
from sidecar.demo.children import Children, python_module
from sidecar.moqt.aio.quic_backend import LOOPBACK_DATAGRAM_SIZE
from sidecar.moqt.aio.tls import CertificatePaths

HOST = "127.0.0.1"
RELAY_TIMEOUT_S = 60.0
PREFILL_TIMEOUT_S = 300.0
"""Loading SmolLM2 and prefilling a long prompt on a busy CPU takes minutes, not seconds."""


@dataclass(frozen=True, slots=True)
class RelayService:
    url: str
    pid: int


def start_relay(children: Children, cert: CertificatePaths, *flags: str) -> RelayService:
    """A relay on a free loopback port (16 KiB packets unless ``flags`` say otherwise; more
    flags: an edge's --upstream, --http for its /metrics)."""
    relay = children.start(
        "relay",
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
            str(LOOPBACK_DATAGRAM_SIZE),
            *flags,
        ),
        ready_prefix="listening on ",
        timeout=RELAY_TIMEOUT_S,
    )
    return RelayService(relay.ready_line.removeprefix("listening on "), relay.process.pid)


def start_prefill(children: Children, url: str, ca: Path, tokens: int) -> dict[str, Any]:
    """A prefill node that has published the KV of the first `tokens` pydoc tokens through
    the relay at `url`; its ready event (prompt id, prefill seconds)."""
    prefill = children.start(
        "prefill server",
        python_module(
            "sidecar.demo.prefill", "--url", url, "--ca", str(ca), "--tokens", str(tokens)
        ),
        ready_prefix='{"event": "ready"',
        timeout=PREFILL_TIMEOUT_S,
    )
    return dict(json.loads(prefill.ready_line))
