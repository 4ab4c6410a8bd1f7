"""HTTP /healthz, /readyz and /metrics for Kubernetes probes and Prometheus.

Three fixed GET routes do not need a web framework: `respond` maps a request line to a
response (a plain function, tested as such), and `serve_probes` is the asyncio adapter
that reads one request per connection, bounded in size and time, and closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST

MAX_LINE = 8192
MAX_HEADERS = 100
READ_TIMEOUT = 5.0

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class ProbeState:
    """What the routes report, read at request time."""

    not_ready: Callable[[], str | None]
    """Why the sidecar should get no traffic now (relay down, draining), or None."""
    metrics: Callable[[], bytes]


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    content_type: str
    body: bytes

    def encode(self, head_only: bool) -> bytes:
        head = (
            f"HTTP/1.1 {self.status} {_REASONS[self.status]}\r\n"
            f"Content-Type: {self.content_type}\r\n"
            f"Content-Length: {len(self.body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        return head.encode() + (b"" if head_only else self.body)


def _text(status: int, text: str) -> Response:
    return Response(status, "text/plain; charset=utf-8", text.encode() + b"\n")


def respond(state: ProbeState, method: str, target: str) -> Response:
    """/healthz: the process serves; /readyz: it should get traffic; /metrics: Prometheus."""
    if method not in ("GET", "HEAD"):
        return _text(405, "only GET and HEAD")
    path = target.split("?", 1)[0]
    if path == "/healthz":
        return _text(200, "ok")
    if path == "/readyz":
        reason = state.not_ready()
        return _text(200, "ready") if reason is None else _text(503, reason)
    if path == "/metrics":
        return Response(200, CONTENT_TYPE_LATEST, state.metrics())
    return _text(404, "routes: /healthz /readyz /metrics")


async def serve_probes(host: str, port: int, state: ProbeState) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            response, method = await asyncio.wait_for(_read(reader, state), READ_TIMEOUT)
            writer.write(response.encode(head_only=method == "HEAD"))
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=MAX_LINE)


async def _read(reader: asyncio.StreamReader, state: ProbeState) -> tuple[Response, str]:
    parts = (await reader.readline()).decode("latin-1").split()
    for _ in range(MAX_HEADERS):
        if (await reader.readline()).strip() == b"":
            break
    else:
        return _text(400, "too many headers"), "GET"
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _text(400, "expected METHOD TARGET HTTP/1.x"), "GET"
    return respond(state, parts[0], parts[1]), parts[0]
