"""Transport throughput: MoQT over QUIC against TLS over TCP and bare QUIC streams.

Every figure is one sender pushing 64 KiB messages to one receiver in another process over
127.0.0.1, with the same dev certificate and verification on, so only the protocol stack
differs between rows. The receiver times from its first payload byte to its last and reports
MB/s (10^6 bytes per second); process start and handshakes fall outside the clock.

Baselines measured in the same run:
* TLS over TCP (asyncio streams, kernel TCP): every `*_ratio` is relative to it.
* bare QUIC streams (no MoQT) on each stack and datagram size: the MoQT stack should lose at
  most 20% against these.

MoQT rows: the publisher (this process) writes a track of 64 KiB objects, 16 per group (one
subgroup stream per group, as a KV chunk would be), to a subscriber process, either directly
or through a relay process (`sidecar.moqt.aio.relay_server`).
The relay's CPU seconds per GB moved are reported next to its goodput.

Each row runs every process on one stack, except the "+aiopquic relay" rows: publisher and
subscriber on aioquic or qh3 (the sidecar's stacks, Python 3.11) and the relay on aiopquic,
as a deployment runs them. A stack this interpreter lacks (aiopquic on 3.11) runs in one
that has it (`python_with`): the whole measurement moves there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.procstat import cpu_seconds
from sidecar.address import free_udp_port
from sidecar.demo.children import python_with
from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import (
    BACKENDS,
    INTERNET_DATAGRAM_SIZE,
    LOOPBACK_DATAGRAM_SIZE,
    SELF_SIZED,
    MiB,
    QuicSettings,
    installed,
    load_backend,
)
from sidecar.moqt.aio.tls import CertificatePaths, write_certificate
from sidecar.moqt.protocol.drafts import DRAFTS, SPOKEN
from sidecar.moqt.protocol.model import FullTrackName

CHUNK = 64 * 1024
OBJECTS_PER_GROUP = 16
DATAGRAM_SIZES = (INTERNET_DATAGRAM_SIZE, LOOPBACK_DATAGRAM_SIZE)
HOST = "127.0.0.1"
NAMESPACE = (b"kvmoq-bench",)
TRACK = FullTrackName(NAMESPACE, b"objects")
STEP_TIMEOUT_S = 60.0
SLOWEST_MBPS = 1.0
"""A run slower than this is stalled: its figure is null, its goals are not met, and the
bench exits 1 (a stack that stalls is broken, whatever the other figures say)."""


@dataclass(frozen=True, slots=True)
class Goals:
    """Lower bounds on one row's ratios: to TLS over TCP, and MoQT to bare QUIC."""

    direct_ratio: float
    relay_ratio: float
    moqt_bare_ratio: float

    def check(self, row: dict[str, float | None]) -> dict[str, dict[str, Any]]:
        return {
            name: {"goal": bound, "value": row[name], "met": (row[name] or 0.0) >= bound}
            for name, bound in ((f, getattr(self, f)) for f in self.__slots__)
        }


GOALS = {
    LOOPBACK_DATAGRAM_SIZE: Goals(direct_ratio=0.28, relay_ratio=0.2, moqt_bare_ratio=0.8),
    INTERNET_DATAGRAM_SIZE: Goals(direct_ratio=0.4, relay_ratio=0.25, moqt_bare_ratio=0.8),
}
"""Issue "MoQT draft-14 stack" (16 KiB datagrams) and issue "MoQT at internet packet sizes"
(1350 bytes): MoQT direct and via one relay against TLS over TCP, MoQT against bare QUIC on
the same stack."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mbytes",
        type=_megabytes,
        default=256,
        help="megabytes to send per measurement (default 256, at most 100000)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        choices=range(1, 11),
        default=1,
        metavar="N",
        help="run each measurement N times (1..10) and keep the fastest (default 1)",
    )
    parser.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="QUIC stack to measure (repeatable; default: every one an interpreter here has)",
    )
    parser.add_argument(
        "--draft",
        type=int,
        choices=sorted(DRAFTS),
        default=SPOKEN[0].number,
        help=f"MoQT draft the sessions speak (default {SPOKEN[0].number}, the newest kvmoq "
        "offers); bare QUIC and TLS are the same",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="also draw MoQT goodput per stack and datagram size against TLS/TCP (PNG)",
    )


def _megabytes(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError("must be 1..100000")
    return value


@dataclass(frozen=True, slots=True)
class Job:
    """What every process of one measurement needs to know; travels as JSON."""

    kind: str
    total: int
    cert: CertificatePaths
    backend: str | None = None
    datagram_size: int | None = None
    via_relay: bool = False
    relay_backend: str | None = None
    """The relay's stack, where it differs from the endpoints'."""
    relay_url: str | None = None  # filled in by the harness once the relay listens
    draft: int = SPOKEN[0].number

    @property
    def stack(self) -> str | None:
        """The stack this job's process runs (the relay's for a relay)."""
        return (self.relay_backend or self.backend) if self.kind == "relay" else self.backend

    @property
    def settings(self) -> QuicSettings:
        assert self.stack is not None and self.datagram_size is not None
        return QuicSettings(
            backend=self.stack,  # type: ignore[arg-type]
            max_datagram_size=self.datagram_size,
            ca_file=self.cert.cert,
            drafts=(DRAFTS[self.draft],),
        )

    def to_json(self) -> str:
        fields = {
            "kind": self.kind,
            "total": self.total,
            "cert": str(self.cert.cert),
            "key": str(self.cert.key),
            "backend": self.backend,
            "datagram_size": self.datagram_size,
            "via_relay": self.via_relay,
            "relay_backend": self.relay_backend,
            "relay_url": self.relay_url,
            "draft": self.draft,
        }
        return json.dumps(fields)

    @classmethod
    def from_json(cls, text: str) -> Job:
        raw = json.loads(text)
        cert = CertificatePaths(cert=Path(raw.pop("cert")), key=Path(raw.pop("key")))
        return cls(cert=cert, **raw)


@dataclass(frozen=True, slots=True)
class Received:
    """The receiver's view of one measurement."""

    nbytes: int
    seconds: float

    @property
    def mbps(self) -> float:
        return self.nbytes / self.seconds / 1e6


@dataclass(frozen=True, slots=True)
class Measured:
    """One run's figures: goodput, and the relay's CPU seconds per GB when it had one."""

    mbps: float
    relay_cpu_s_per_gb: float | None = None


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


Ready = Callable[[int], None]
"""A receiver calls it once it listens (with its port) or is subscribed (with 0)."""
StartReceiver = Callable[[], Awaitable[tuple[int, Awaitable[Received]]]]
"""A sender calls it when the receiver may start; returns its port and its figures to come."""


# TLS over TCP ---------------------------------------------------------------------------


async def _tls_receiver(job: Job, ready: Ready) -> Received:
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


async def _tls_sender(job: Job, start_receiver: StartReceiver) -> Received:
    port, result = await start_receiver()
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


async def _quic_receiver(job: Job, ready: Ready) -> Received:
    clock = _Clock(job.total)
    stream_data = load_backend(job.settings.backend).events.StreamDataReceived

    def attach(endpoint: transport.QuicEndpoint) -> transport.QuicEventHandler:
        def on_event(event: Any) -> None:
            if isinstance(event, stream_data):
                clock.count(len(event.data))

        return on_event

    port = free_udp_port(HOST)
    server = await transport.start_server(
        HOST, port, job.settings, attach, cert=job.cert.cert, key=job.cert.key
    )
    ready(port)
    try:
        return await clock.done
    finally:
        server.close()


async def _quic_sender(job: Job, start_receiver: StartReceiver) -> Received:
    port, result = await start_receiver()
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


# MoQT, direct or through a relay --------------------------------------------------------


async def _moqt_receiver(job: Job, ready: Ready) -> Received:
    """The subscriber: a server the publisher dials (direct), or a client of the relay."""
    clock = _Clock(job.total)

    async def consume(session: api.Session) -> None:
        await session.connection.setup
        subscription = await session.subscribe(TRACK)
        if job.relay_url is not None:
            ready(0)
        # The publisher hangs up once it hears the figures; that ends the iteration early.
        with contextlib.suppress(api.SessionGone):
            async for obj in subscription:
                clock.count(len(obj.payload))

    tasks: list[asyncio.Future[None]] = []
    if job.relay_url is not None:
        async with api.connect(job.relay_url, job.settings) as session:
            tasks.append(asyncio.ensure_future(consume(session)))
            return await clock.done
    port = free_udp_port(HOST)
    server = await api.serve(
        HOST,
        port,
        job.settings,
        cert=job.cert.cert,
        key=job.cert.key,
        on_session=lambda session: tasks.append(asyncio.ensure_future(consume(session))),
    )
    ready(port)
    try:
        return await clock.done
    finally:
        server.close()


async def _moqt_sender(job: Job, start_receiver: StartReceiver) -> Received:
    """The publisher: dials the subscriber (direct) or announces to the relay, then writes."""
    publisher = api.Publisher()
    # The cache only needs to hold what a late FETCH could ask for; the bench never fetches.
    track = publisher.track(NAMESPACE, TRACK.name, cache_bytes=32 * MiB)
    if job.relay_url is None:
        port, result = await start_receiver()
        url = f"moqt://localhost:{port}/bench"
    else:
        url = job.relay_url
    async with api.connect(url, job.settings, publisher=publisher) as session:
        if job.relay_url is not None:
            await session.publish_namespace(NAMESPACE)
            _, result = await start_receiver()
        await asyncio.wait_for(track.wait_subscribed(), STEP_TIMEOUT_S)
        payload = _payload()
        for index in range(job.total // CHUNK):
            group, obj = divmod(index, OBJECTS_PER_GROUP)
            await track.write(group, obj, payload, end_of_group=obj == OBJECTS_PER_GROUP - 1)
        received = await result
        track.end()
        return received


async def _relay_process(job: Job, ready: Ready) -> Received:
    """Run kvmoq's relay until the harness kills this process."""
    from sidecar.moqt.aio.relay_server import start_relay

    port = free_udp_port(HOST)
    await start_relay(HOST, port, job.settings, cert=job.cert.cert, key=job.cert.key)
    ready(port)
    await asyncio.Event().wait()  # never set: the harness kills this process
    raise AssertionError("unreachable")


# The harness ----------------------------------------------------------------------------

_RECEIVERS: dict[str, Callable[[Job, Ready], Awaitable[Received]]] = {
    "tls_tcp": _tls_receiver,
    "quic": _quic_receiver,
    "moqt": _moqt_receiver,
    "relay": _relay_process,
}
_SENDERS: dict[str, Callable[[Job, StartReceiver], Awaitable[Received]]] = {
    "tls_tcp": _tls_sender,
    "quic": _quic_sender,
    "moqt": _moqt_sender,
}


def _child_main(job_json: str) -> None:
    """A receiving (or relaying) process: one JSON line when ready, one with its figures."""
    job = Job.from_json(job_json)

    def ready(port: int) -> None:
        print(json.dumps({"port": port}), flush=True)

    received = transport.run(_RECEIVERS[job.kind](job, ready))
    print(json.dumps({"nbytes": received.nbytes, "seconds": received.seconds}), flush=True)


class _Child:
    """One helper process of a measurement, speaking JSON lines on its stdout.

    Its stderr goes to a file that is shown only if the measurement fails: peers that hang up
    once the figures are in make teardown noise that says nothing about the figures.
    """

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        assert process.stdout is not None
        self.stdout = process.stdout
        self.log = log

    @classmethod
    async def start(cls, job: Job, log: Path) -> _Child:
        # A process, not a thread: two endpoints in one interpreter would share one GIL.
        python = sys.executable if job.stack is None else python_with(job.stack)  # type: ignore[arg-type]
        assert python is not None, f"no interpreter here has {job.stack}"
        with log.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                python,
                "-m",
                "bench.transport",
                job.to_json(),
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
        return cls(process, log)

    async def line(self, timeout: float) -> dict[str, Any]:
        text = await asyncio.wait_for(self.stdout.readline(), timeout)
        if not text:
            raise RuntimeError("benchmark helper process exited early (its stderr follows)")
        return dict(json.loads(text))

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


async def _measure(job: Job, logs: Path) -> Measured:
    children: list[_Child] = []
    relay_pid: int | None = None

    async def start(child_job: Job) -> _Child:
        child = await _Child.start(child_job, logs / f"{len(children)}-{child_job.kind}.log")
        children.append(child)
        return child

    try:
        if job.via_relay:
            relay = await start(replace(job, kind="relay"))
            port = (await relay.line(STEP_TIMEOUT_S))["port"]
            job = replace(job, relay_url=f"moqt://localhost:{port}/bench")
            relay_pid = relay.process.pid
            relay_cpu = cpu_seconds(relay_pid)

        async def start_receiver() -> tuple[int, Awaitable[Received]]:
            child = await start(job)
            port = int((await child.line(STEP_TIMEOUT_S))["port"])

            async def figures() -> Received:
                raw = await child.line(max(2 * STEP_TIMEOUT_S, job.total / 1e6 / SLOWEST_MBPS))
                return Received(int(raw["nbytes"]), float(raw["seconds"]))

            return port, asyncio.ensure_future(figures())

        received = await _SENDERS[job.kind](job, start_receiver)
        if relay_pid is None:
            return Measured(received.mbps)
        per_gb = (cpu_seconds(relay_pid) - relay_cpu) / (received.nbytes / 1e9)
        return Measured(received.mbps, per_gb)
    except BaseException:
        for child in children:
            await child.stop()
            print(
                f"--- {child.log.name}:\n{child.log.read_text(errors='replace')}", file=sys.stderr
            )
        raise
    finally:
        for child in children:
            await child.stop()


def measure(job: Job) -> Measured | None:
    """The figures of one run (a receiver process, maybe a relay, and this process sending,
    or, for a stack this interpreter lacks, one that has it); None if it stalled below
    SLOWEST_MBPS."""
    if job.backend is not None and not installed(job.backend):  # type: ignore[arg-type]
        return _measure_elsewhere(job)
    with tempfile.TemporaryDirectory(prefix="kvmoq-bench-logs-") as logs:
        try:
            return transport.run(_measure(job, Path(logs)))
        except TimeoutError:
            return None


def _measure_elsewhere(job: Job) -> Measured | None:
    python = python_with(job.backend)  # type: ignore[arg-type]
    assert python is not None, f"no interpreter here has {job.backend}"
    argv = [python, "-m", "bench.transport", "--sender", job.to_json()]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{job.backend} measurement failed:\n{done.stderr}")
    figures = json.loads(done.stdout.splitlines()[-1])
    return None if figures is None else Measured(**figures)


def _sender_main(job_json: str) -> None:
    """This interpreter's half of `_measure_elsewhere`: one JSON line, the figures or null."""
    logging.getLogger("quic").setLevel(logging.ERROR)
    measured = measure(Job.from_json(job_json))
    print(json.dumps(None if measured is None else asdict(measured)), flush=True)


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def _cell(value: float | None, width: int, digits: int) -> str:
    return f"{'stalled' if value is None else f'{value:.{digits}f}':>{width}}"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: the endpoints' stack, the relay's, the packet sizes."""

    backend: str
    relay_backend: str | None = None

    @property
    def label(self) -> str:
        return self.backend + (f"+{self.relay_backend} relay" if self.relay_backend else "")

    @property
    def sizes(self) -> tuple[int, ...]:
        native = {self.backend, self.relay_backend} & SELF_SIZED
        return (INTERNET_DATAGRAM_SIZE,) if native else DATAGRAM_SIZES


def table_rows(backends: list[str]) -> list[Row]:
    """Each stack end to end; and the sidecar's stacks through a relay on a self-sized stack
    (aiopquic runs on Python 3.12 only, where the relay runs, not the sidecar)."""
    rows = [Row(backend) for backend in backends]
    native = [b for b in backends if b in SELF_SIZED]
    return rows + [Row(b, relay) for relay in native for b in backends if b not in SELF_SIZED]


def run(args: argparse.Namespace) -> int:
    # qh3 logs every CONNECTION_CLOSE from a peer as a warning, and every run ends with one.
    logging.getLogger("quic").setLevel(logging.ERROR)
    total = max(1, args.mbytes * 1_000_000 // CHUNK) * CHUNK
    backends = args.backend or [b for b in BACKENDS if python_with(b)]
    missing = [b for b in backends if not python_with(b)]
    if missing:
        print(f"kvmoq bench transport: no interpreter here has {', '.join(missing)}")
        return 2
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    stalled: list[str] = []

    figures: dict[Job, Measured | None] = {}

    def best(job: Job) -> Measured | None:
        """Measured once per job: a "+relay" row's bare and direct runs are its stack's."""
        if job not in figures:
            # Other load only ever slows a run down, so the fastest repeat is the figure.
            runs = [m for m in (measure(job) for _ in range(args.repeat)) if m is not None]
            figures[job] = max(runs, default=None, key=lambda m: m.mbps)
        return figures[job]

    def mbps(measured: Measured | None) -> float | None:
        return None if measured is None else measured.mbps

    with tempfile.TemporaryDirectory(prefix="kvmoq-bench-") as tmp:
        cert = write_certificate(Path(tmp))
        tls = mbps(best(Job("tls_tcp", total, cert)))
        print(f"MoQT draft {args.draft}")
        print(f"TLS over TCP (asyncio streams): {_cell(tls, 8, 1)} MB/s")
        print(
            f"{'stack':22} {'datagram':>8} {'bare QUIC':>10} {'MoQT':>8} {'via relay':>10}"
            f" {'relay CPU s/GB':>14} {'MoQT/bare':>9} {'direct_ratio':>12} {'relay_ratio':>11}"
        )
        for line in table_rows(backends):
            for size in line.sizes:
                quic_job = Job("quic", total, cert, line.backend, size, draft=args.draft)
                bare = mbps(best(quic_job))
                direct = mbps(best(replace(quic_job, kind="moqt")))
                relay_job = replace(
                    quic_job, kind="moqt", via_relay=True, relay_backend=line.relay_backend
                )
                via = best(relay_job)
                relayed = mbps(via)
                row = rows.setdefault(line.label, {})[str(size)] = {
                    "bare_mbps": bare,
                    "direct_mbps": direct,
                    "relay_mbps": relayed,
                    "relay_cpu_s_per_gb": None if via is None else via.relay_cpu_s_per_gb,
                    "direct_ratio": _ratio(direct, tls),
                    "relay_ratio": _ratio(relayed, tls),
                    "moqt_bare_ratio": _ratio(direct, bare),
                }
                row["goals"] = GOALS[size].check(row)
                if tls is None or None in (bare, direct, relayed):
                    stalled.append(f"{line.label}/{size}")
                print(
                    f"{line.label:22} {size:>8} {_cell(bare, 10, 1)} {_cell(direct, 8, 1)}"
                    f" {_cell(relayed, 10, 1)} {_cell(row['relay_cpu_s_per_gb'], 14, 1)}"
                    f" {_cell(_ratio(direct, bare), 9, 2)} {_cell(row['direct_ratio'], 12, 2)}"
                    f" {_cell(row['relay_ratio'], 11, 2)}"
                )
    goals = [
        (f"{label}/{size}", name, goal)
        for label, sizes in rows.items()
        for size, row in sizes.items()
        for name, goal in row.get("goals", {}).items()
    ]
    for where, name, goal in goals:
        value = "stalled" if goal["value"] is None else f"{goal['value']:.2f}"
        verdict = "met" if goal["met"] else "NOT met"
        print(f"goal {where} {name} >= {goal['goal']}: {value}: {verdict}")
    report = {
        "draft": args.draft,
        "tls_tcp_mbps": tls,
        "rows": rows,
        "goals_met": bool(goals) and all(goal["met"] for _, _, goal in goals),
        "stalled": stalled,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        write_plot(report, Path(args.plot))
    if stalled:
        print(f"kvmoq bench transport: stalled (under {SLOWEST_MBPS} MB/s): {', '.join(stalled)}")
        return 1
    return 0


def write_plot(report: dict[str, Any], path: Path) -> None:
    """MoQT goodput per stack and datagram size, direct and through the relay, with TLS over
    TCP as a line: the table's ratios, at a glance (each bar is labelled with its ratio)."""
    from sidecar.demo.plot import bars, png

    tls = report["tls_tcp_mbps"]
    rows = {
        f"{label.replace('+', chr(10) + '+')}\n{size} B": row
        for label, sizes in report["rows"].items()
        for size, row in sizes.items()
    }
    series = {"MoQT direct": "direct", "MoQT via relay": "relay"}
    with png(path, (max(6.5, 1.1 * len(rows)), 4.4), dpi=110) as axes:
        bars(
            axes,
            list(rows),
            {name: [row[f"{key}_mbps"] for row in rows.values()] for name, key in series.items()},
            {
                name: [_ratio_note(row[f"{key}_ratio"]) for row in rows.values()]
                for name, key in series.items()
            },
        )
        if tls is not None:
            axes.axhline(tls, color="black", linestyle="--", label=f"TLS over TCP, {tls:.0f} MB/s")
        axes.set_ylabel("goodput (MB/s)")
        axes.set_title(
            f"MoQT over QUIC on 127.0.0.1, {CHUNK // 1024} KiB objects; labels: ratio to TLS/TCP",
            fontsize=10,
        )
        axes.legend(fontsize=8)


def _ratio_note(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


if __name__ == "__main__":
    if sys.argv[1] == "--sender":
        _sender_main(sys.argv[2])
    else:
        _child_main(sys.argv[1])
