"""The demo's nodes as child processes: a sidecar, and a model server beside it.

A node is what a pod would be: a `kvmoq sidecar` started as an operator starts it, and a
model server (SmolLM2 through `kvmoq_client`) that reaches the network only through that
sidecar's Unix socket. Each function returns once its process is up.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from pathlib import Path

from sidecar.demo.children import Child, ChildFailed, Children, python_module
from sidecar.demo.services import HOST
from sidecar.demo.steps import STARTED
from sidecar.moqt.aio.quic_backend import LOOPBACK_DATAGRAM_SIZE
from sidecar.service.relay_link import RELAY_UNREACHABLE

SIDECAR_TIMEOUT_S = 60.0
MODEL_SERVER_TIMEOUT_S = 60.0
"""Until the model server's first line, printed before it loads anything."""


def http_get(address: str, path: str) -> tuple[int, str]:
    """GET `path` from a sidecar's HTTP endpoint (`HOST:PORT`): status and body.

    A module function so the service tests poll /readyz and /metrics the same way the demo
    does.
    """
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


@dataclass(frozen=True, slots=True)
class SidecarNode:
    """A running sidecar: where its model server calls it and where its metrics are."""

    child: Child
    grpc: str
    http: str

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.http, path)

    def wait_ready(self, timeout: float = SIDECAR_TIMEOUT_S) -> None:
        """Until /readyz says the relay session is up: a load before that finds nothing.
        The relay is up before any sidecar starts, so a first connection that fails is an
        answer already (a wrong address, a refused token): no need to wait out the rest."""
        end = time.monotonic() + timeout
        while self.get("/readyz")[0] != 200:
            failed = RELAY_UNREACHABLE in self.child.log_tail()
            if failed or time.monotonic() > end or self.child.process.poll() is not None:
                raise ChildFailed(
                    f"{self.child.name} has no relay session:\n{self.child.log_tail()}"
                )
            time.sleep(0.1)

    def total(self, name: str) -> float:
        """A counter of /metrics summed over its labels (`kvmoq_verification_failures` ...)."""
        values = [
            float(line.rpartition(" ")[2])
            for line in self.get("/metrics")[1].splitlines()
            if line.startswith((f"{name}_total ", f"{name}_total{{"))
        ]
        return sum(values)

    def counter(self, name: str) -> dict[str, float]:
        """A per-track counter of /metrics (`kvmoq_loaded_bytes` ...), track -> value."""
        values: dict[str, float] = {}
        prefix = f'{name}_total{{track="'
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(prefix):
                series, _, value = line.rpartition(" ")
                values[series.removeprefix(prefix).removesuffix('"}')] = float(value)
        return values

    def growth(self, name: str, before: dict[str, float]) -> dict[str, int]:
        """How much each track's `name` counter grew since `before` (a `counter(name)`)."""
        after = self.counter(name)
        return {t: int(n - before.get(t, 0)) for t, n in after.items() if n > before.get(t, 0)}

    def wait_counter(self, name: str, track: str, at_least: float, timeout: float) -> None:
        """Until the per-track counter `name` reaches `at_least`: what the sidecar does after
        a call has returned (publishing, say) shows only there."""
        end = time.monotonic() + timeout
        while self.counter(name).get(track, 0) < at_least:
            if time.monotonic() > end:
                raise TimeoutError(
                    f"{self.child.name}: {name}{{track={track}}} did not reach {at_least}:\n"
                    f"{self.child.log_tail()}"
                )
            time.sleep(0.1)


def start_sidecar(
    children: Children,
    name: str,
    url: str,
    ca: Path,
    scratch: Path,
    *flags: str,
    datagram_size: int = LOOPBACK_DATAGRAM_SIZE,
) -> SidecarNode:
    """A sidecar connected to the relay at `url`, its API on a socket in `scratch`."""
    child = children.start(
        name,
        python_module(
            "sidecar.cli",
            "sidecar",
            "--relay",
            url,
            "--ca",
            str(ca),
            "--grpc",
            f"unix://{scratch / name.replace(' ', '-')}.sock",
            "--probe",
            f"{HOST}:0",
            "--http",
            f"{HOST}:0",
            "--max-datagram-size",
            str(datagram_size),
            *flags,
        ),
        ready_prefix='{"event": "serving"',
        timeout=SIDECAR_TIMEOUT_S,
    )
    serving = json.loads(child.ready_line)
    node = SidecarNode(child, serving["grpc"], serving["http"])
    node.wait_ready()
    return node


def start_model_server(children: Children, name: str, module: str, *args: str) -> Child:
    """A model server (`sidecar.demo.prefill_server` or `decode_server`); it reports its
    steps on stdout (`sidecar.demo.steps`)."""
    return children.start(
        name,
        python_module(module, *args),
        ready_prefix=STARTED,
        timeout=MODEL_SERVER_TIMEOUT_S,
    )
