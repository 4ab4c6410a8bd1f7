"""Transport throughput: MoQT over QUIC against TLS over TCP and bare QUIC streams.

Every figure is one sender process pushing 64 KiB messages to one receiver
process over 127.0.0.1 with the same dev certificate (verification on), so the
only difference between rows is the protocol stack. The receiver times from
its first payload byte to its last, in MB/s (10^6 bytes per second): that
excludes process start and handshakes, which 256 MB dwarfs anyway.

Baselines measured in the same run:
* TLS over TCP (asyncio streams, kernel TCP): what a plain TLS pipe gives;
  every `*_ratio` is relative to it.
* bare QUIC streams (no MoQT) on each stack and datagram size: the MoQT stack
  should lose at most 20% against these.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.moqt import transport
from sidecar.moqt.quic_backend import (
    BACKENDS,
    INTERNET_DATAGRAM_SIZE,
    LOOPBACK_DATAGRAM_SIZE,
    QuicSettings,
    load_backend,
)
from sidecar.moqt.tls import CertificatePaths, write_certificate

DESCRIPTION = "MoQT over QUIC (aioquic, qh3; direct and via relay) against TLS/TCP and bare QUIC"

CHUNK = 64 * 1024
DATAGRAM_SIZES = (INTERNET_DATAGRAM_SIZE, LOOPBACK_DATAGRAM_SIZE)
HOST = "127.0.0.1"
RESULT_TIMEOUT_S = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mbytes", type=int, default=256, help="megabytes to send per measurement (default 256)"
    )
    parser.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="QUIC stack to measure (repeatable; default: all)",
    )


@dataclass(frozen=True, slots=True)
class Job:
    """What both processes of one measurement need to know."""

    kind: str
    total: int
    cert: CertificatePaths
    settings: QuicSettings | None = None


@dataclass(frozen=True, slots=True)
class Received:
    """The receiver's view of one measurement."""

    nbytes: int
    seconds: float

    @property
    def mbps(self) -> float:
        return self.nbytes / self.seconds / 1e6


class _Clock:
    """Times from the first payload byte to the last, on the receiving side."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.nbytes = 0
        self.started = 0.0
        self.done: asyncio.Future[Received] = asyncio.get_running_loop().create_future()

    def count(self, n: int) -> None:
        if self.nbytes == 0:
            self.started = time.perf_counter()
        self.nbytes += n
        if self.nbytes >= self.total and not self.done.done():
            self.done.set_result(Received(self.nbytes, time.perf_counter() - self.started))


def _payload() -> bytes:
    # Incompressible, like compressed KV caches; neither TLS nor QUIC compresses anyway.
    return os.urandom(CHUNK)


# TLS over TCP ---------------------------------------------------------------------------


async def _tls_receiver(job: Job, ready: Callable[[int], None]) -> Received:
    clock = _Clock(job.total)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(job.cert.cert, job.cert.key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Stop at the byte count, not EOF: the sender closes only after hearing the figures.
        while not clock.done.done() and (data := await reader.read(1 << 20)):
            clock.count(len(data))
        writer.close()

    server = await asyncio.start_server(handle, HOST, 0, ssl=ctx)
    ready(server.sockets[0].getsockname()[1])
    async with server:
        return await clock.done


async def _tls_sender(job: Job, port: int, result: Awaitable[Received]) -> Received:
    ctx = ssl.create_default_context(cafile=str(job.cert.cert))
    _, writer = await asyncio.open_connection(HOST, port, ssl=ctx, server_hostname="localhost")
    payload = _payload()
    for _ in range(job.total // CHUNK):
        writer.write(payload)
        await writer.drain()
    received = await result
    writer.close()
    return received


# Bare QUIC streams ----------------------------------------------------------------------


async def _quic_receiver(job: Job, ready: Callable[[int], None]) -> Received:
    assert job.settings is not None
    clock = _Clock(job.total)
    stream_data = load_backend(job.settings.backend).events.StreamDataReceived

    def attach(endpoint: transport.QuicEndpoint) -> transport.QuicEventHandler:
        def on_event(event: Any) -> None:
            if isinstance(event, stream_data):
                clock.count(len(event.data))

        return on_event

    port = _free_udp_port()
    server = await transport.start_server(
        HOST, port, job.settings, attach, cert=job.cert.cert, key=job.cert.key
    )
    ready(port)
    try:
        return await clock.done
    finally:
        server.close()


async def _quic_sender(job: Job, port: int, result: Awaitable[Received]) -> Received:
    assert job.settings is not None
    async with transport.open_connection(
        HOST, port, job.settings, lambda _: lambda _: None, server_name="localhost"
    ) as endpoint:
        quic = endpoint.quic
        stream_id = quic.get_next_available_stream_id(is_unidirectional=True)
        payload = _payload()
        for _ in range(job.total // CHUNK):
            quic.send_stream_data(stream_id, payload)
            endpoint.transmit_soon()
            await endpoint.drain()
        quic.send_stream_data(stream_id, b"", end_stream=True)
        endpoint.transmit_soon()
        return await result


def _free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# The harness ----------------------------------------------------------------------------

Receiver = Callable[[Job, Callable[[int], None]], Awaitable[Received]]
Sender = Callable[[Job, int, Awaitable[Received]], Awaitable[Received]]

_ROLES: dict[str, tuple[Receiver, Sender]] = {
    "tls_tcp": (_tls_receiver, _tls_sender),
    "quic": (_quic_receiver, _quic_sender),
}


def _job_to_json(job: Job) -> str:
    settings = job.settings
    return json.dumps(
        {
            "kind": job.kind,
            "total": job.total,
            "cert": str(job.cert.cert),
            "key": str(job.cert.key),
            "backend": settings.backend if settings else None,
            "max_datagram_size": settings.max_datagram_size if settings else None,
        }
    )


def _job_from_json(text: str) -> Job:
    raw = json.loads(text)
    cert = CertificatePaths(cert=Path(raw["cert"]), key=Path(raw["key"]))
    settings = None
    if raw["backend"] is not None:
        settings = QuicSettings(
            backend=raw["backend"], max_datagram_size=raw["max_datagram_size"], ca_file=cert.cert
        )
    return Job(raw["kind"], raw["total"], cert, settings)


def _receiver_main(job_json: str) -> None:
    """The receiving process: one JSON line with its port, then one with its figures."""
    job = _job_from_json(job_json)

    def ready(port: int) -> None:
        print(json.dumps({"port": port}), flush=True)

    received = transport.run(_ROLES[job.kind][0](job, ready))
    print(json.dumps({"nbytes": received.nbytes, "seconds": received.seconds}), flush=True)


async def _measure(job: Job) -> Received:
    # A separate process, not a thread: two endpoints in one interpreter share one GIL.
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.transport",
        _job_to_json(job),
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    stdout = process.stdout
    try:
        first = await asyncio.wait_for(stdout.readline(), 60)
        if not first:
            raise RuntimeError(f"{job.kind} receiver exited before listening")
        port = int(json.loads(first)["port"])

        async def result() -> Received:
            line = await asyncio.wait_for(stdout.readline(), RESULT_TIMEOUT_S)
            if not line:
                raise RuntimeError(f"{job.kind} receiver exited without figures")
            raw = json.loads(line)
            return Received(int(raw["nbytes"]), float(raw["seconds"]))

        return await _ROLES[job.kind][1](job, port, asyncio.ensure_future(result()))
    finally:
        if process.returncode is None:
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


def measure(job: Job) -> Received:
    """Run one receiver process and one sender (this process); return the receiver's figures."""
    return transport.run(_measure(job))


def run(args: argparse.Namespace) -> int:
    total = max(1, args.mbytes * 1_000_000 // CHUNK) * CHUNK
    backends = args.backend or list(BACKENDS)
    with tempfile.TemporaryDirectory(prefix="kvmoq-bench-") as tmp:
        cert = write_certificate(Path(tmp))
        tls = measure(Job("tls_tcp", total, cert)).mbps
        rows: dict[str, dict[str, dict[str, float]]] = {}
        bare: dict[str, dict[str, float]] = {}
        for backend in backends:
            for size in DATAGRAM_SIZES:
                settings = QuicSettings(backend=backend, max_datagram_size=size, ca_file=cert.cert)
                bare.setdefault(backend, {})[str(size)] = measure(
                    Job("quic", total, cert, settings)
                ).mbps
    print(f"TLS over TCP: {tls:.0f} MB/s")
    for backend, sizes in bare.items():
        for size, mbps in sizes.items():
            print(f"{backend} {size}: bare {mbps:.0f} MB/s ({mbps / tls:.2f})")
    figures = {"tls_tcp_mbps": tls, **rows, "bare_quic_mbps": bare}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    _receiver_main(sys.argv[1])
