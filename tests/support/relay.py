"""A real `kvmoq relay` process and MoQT clients that record what reaches them.

The relay always runs as its own process, started the way an operator starts it, so the
tests cover the command line, the listening line and SIGTERM as well as the protocol.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sidecar.address import free_tcp_port, free_udp_port
from sidecar.demo.children import CHECKOUT_RELAY_PYTHON
from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import BACKENDS, SELF_SIZED, QuicSettings, installed
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.protocol.events import (
    DataStreamEnded,
    MoqtEvent,
    NamespaceAnnounced,
    NamespacePublished,
    ObjectReceived,
    RequestAccepted,
    SessionClosed,
    SubscribeRequested,
    SubscriptionEnded,
)
from sidecar.moqt.protocol.messages import FilterType, SubscriptionFilter
from sidecar.moqt.protocol.model import FullTrackName, Location
from sidecar.moqt.protocol.session import MoqtSession
from sidecar.moqt.relay.metrics import scrape

HOST = "127.0.0.1"
WAIT_S = 30.0  # only bounds a hang: the machine may be busy
REPO = Path(__file__).resolve().parents[2]
RELAY_PYTHON = CHECKOUT_RELAY_PYTHON
"""The relay alone, without torch, on Python 3.12 (scripts/setup.sh), where aiopquic runs."""

STACKS = tuple(
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            not installed(name),
            reason=f"{name} is not installed in this Python (aiopquic needs 3.12: the tests of "
            "the relay process run it from .venv-relay)",
        ),
    )
    for name in BACKENDS
)
"""Every stack, for tests that run it in this process; those not installed here skip."""

RELAY_BACKENDS = (
    "aioquic",
    pytest.param(
        "aiopquic",
        marks=pytest.mark.skipif(
            not RELAY_PYTHON.exists(), reason=f"aiopquic runs in {RELAY_PYTHON} (setup.sh)"
        ),
    ),
)
"""For tests of the relay process on each stack: aioquic as the sidecar runs it, aiopquic."""
DEFAULTS = "defaults"
"""A `backend` for `running_relay` (and the `relay` fixtures' parameter): `kvmoq relay` as
users run it, nothing chosen for it."""

E = TypeVar("E", bound=MoqtEvent)


@dataclass
class RelayProcess:
    process: subprocess.Popen[str]
    url: str
    settings: QuicSettings
    """What a client of this relay runs on: loopback packets (16 KiB), or internet-size ones
    for a relay on aiopquic (picoquic drops bigger packets, and aioquic sends the size it is
    set to whatever the peer advertises)."""

    def stop(self) -> int:
        """SIGTERM, as an operator would; the exit status once it is gone."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(15)
        finally:
            if self.process.poll() is None:
                self.process.kill()

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """The relay stops answering (SIGSTOP) but its sessions stay open: requests hang."""
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)


@contextmanager
def running_relay(
    cert: CertificatePaths,
    *flags: str,
    port: int | None = None,
    python: str | Path = sys.executable,
    backend: str = "aioquic",
) -> Iterator[RelayProcess]:
    """`python -m sidecar.cli relay` on ``port`` (default: a free one), on the interpreter
    ``python`` (default: this one; `RELAY_PYTHON` for aiopquic) and the QUIC ``backend``
    at loopback packet sizes, or (``backend`` `DEFAULTS`) as users run it: no backend or
    packet size named, on the relay's own install where there is one; yields once it
    printed its URL."""
    port = port or free_udp_port()
    settings = settings_for(cert)
    if backend == DEFAULTS:
        python = RELAY_PYTHON if RELAY_PYTHON.exists() else python
        settings = QuicSettings(ca_file=cert.cert)
    elif backend in SELF_SIZED:
        python, settings = RELAY_PYTHON, QuicSettings(ca_file=cert.cert)
    chosen = (
        ()
        if backend == DEFAULTS
        else ("--max-datagram-size", str(settings.max_datagram_size), "--backend", backend)
    )
    argv = [
        str(python),
        "-m",
        "sidecar.cli",
        "relay",
        "--listen",
        f"{HOST}:{port}",
        "--cert",
        str(cert.cert),
        "--key",
        str(cert.key),
        *chosen,
        *flags,
    ]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "KVMOQ_LOG_LEVEL": "info"},
        )
        relay = RelayProcess(process, f"moqt://{HOST}:{port}", settings)
        try:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            assert line == f"listening on {relay.url}", f"relay said {line!r}"
            yield relay
        finally:
            relay.stop()
            log.seek(0)
            print("--- relay log (tail)", *log.readlines()[-40:], sep="\n")  # shown on failure


class Client:
    """One MoQT session to the relay that records every event it gets."""

    def __init__(self) -> None:
        self.events: list[MoqtEvent] = []
        self._changed = asyncio.Event()
        self.connection: transport.MoqtConnection | None = None

    def attach(self, connection: transport.MoqtConnection) -> transport.MoqtEventHandler:
        self.connection = connection
        return self._record

    def _record(self, event: MoqtEvent) -> None:
        self.events.append(event)
        self._changed.set()

    @property
    def moqt(self) -> MoqtSession:
        assert self.connection is not None
        return self.connection.moqt

    def send(self) -> None:
        assert self.connection is not None
        self.connection.transmit()

    def of(self, kind: type[E], where: Callable[[E], bool] = lambda _: True) -> list[E]:
        return [e for e in self.events if isinstance(e, kind) and where(e)]

    async def until(
        self, condition: Callable[[], bool], what: str = "", timeout: float = WAIT_S
    ) -> None:
        async def wait() -> None:
            while not condition():
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            names = [type(e).__name__ for e in self.events[-20:]]
            raise AssertionError(f"timed out waiting for {what}; last events {names}") from None

    async def next(self, kind: type[E], where: Callable[[E], bool] = lambda _: True) -> E:
        await self.until(lambda: bool(self.of(kind, where)), kind.__name__)
        return self.of(kind, where)[0]

    def objects(self, request_id: int) -> list[ObjectReceived]:
        return self.of(ObjectReceived, lambda e: e.request_id == request_id)

    def heard(self) -> list[tuple[bytes, ...]]:
        """The namespaces a namespace subscription of this session heard of, as each draft
        says it: PUBLISH_NAMESPACE (14) or NAMESPACE (16)."""
        published = [e.message.namespace for e in self.of(NamespacePublished)]
        return published + [e.namespace for e in self.of(NamespaceAnnounced)]

    async def hears(self, namespace: tuple[bytes, ...]) -> None:
        await self.until(lambda: namespace in self.heard(), f"hearing of {namespace!r}")


UPSTREAM_TIMEOUT_S = 2.0  # how soon an edge notices an upstream that died without a word


@dataclass
class ClusterRelay:
    """A relay process of a cluster (root or edge) and the port of its /metrics."""

    process: RelayProcess
    http_port: int

    @property
    def url(self) -> str:
        return self.process.url

    def metric(self, name: str) -> float:
        """One ``kvmoq_relay_*`` series (short name), scraped now."""
        return scrape(f"{HOST}:{self.http_port}")[name]

    def wait_for(self, name: str, value: float, timeout: float = WAIT_S) -> None:
        """Poll a series until it reads ``value`` (an edge connecting, reconnecting)."""
        deadline = time.monotonic() + timeout
        while (seen := self.metric(name)) != value:
            assert time.monotonic() < deadline, f"kvmoq_relay_{name} stayed {seen}, not {value}"
            time.sleep(0.1)


@contextmanager
def cluster_relay(
    cert: CertificatePaths, *flags: str, port: int | None = None, backend: str = "aioquic"
) -> Iterator[ClusterRelay]:
    """`running_relay` with /metrics on a free port."""
    http_port = free_tcp_port()
    metrics = ("--http", f"{HOST}:{http_port}")
    with running_relay(cert, *metrics, *flags, port=port, backend=backend) as process:
        yield ClusterRelay(process, http_port)


def edge_flags(upstream_url: str, ca: Path) -> tuple[str, ...]:
    """The flags that make a relay an edge of the relay at ``upstream_url``."""
    return (
        "--upstream",
        upstream_url,
        "--ca",
        str(ca),
        "--upstream-timeout",
        str(UPSTREAM_TIMEOUT_S),
    )


def settings_for(cert: CertificatePaths, **overrides: Any) -> QuicSettings:
    return QuicSettings.loopback(ca_file=cert.cert, **overrides)


def payload(group: int, obj: int, size: int) -> bytes:
    """Distinct bytes per object, so a misplaced or corrupted object shows."""
    head = f"{group}:{obj}:".encode()
    return (head * (size // len(head) + 1))[:size]


def accept(publisher: Client, request: SubscribeRequested) -> int:
    """Answer the relay's SUBSCRIBE; returns its request id, to send objects with."""
    publisher.moqt.subscribe_ok(request.message.request_id)
    publisher.send()
    return request.message.request_id


async def send_groups(
    publisher: Client, request_id: int, groups: int, objects: int, size: int, first: int = 0
) -> int:
    """Send groups x objects on an accepted subscription, one stream per group (numbered from
    ``first``); the count."""
    moqt = publisher.moqt
    sent = 0
    for group in range(first, first + groups):
        # A session closed under the test says why (the flake of a cluster test in CI did not).
        assert not publisher.of(SessionClosed), publisher.of(SessionClosed)
        stream = moqt.objects.open_subgroup(request_id, group)
        for obj in range(objects):
            moqt.objects.send_object(
                stream, obj, payload(group, obj, size), end_stream=obj == objects - 1
            )
            sent += 1
        publisher.send()
        assert publisher.connection is not None
        await publisher.connection.drain()
    return sent


async def _subscribe_and_report(
    url: str, ca: str, namespace: str, name: str, datagram_size: str
) -> None:
    """Subscribe to one track and print JSON lines: ready, then how the subscription ended
    and how many objects each group brought on the streams that ended with FIN."""
    client = Client()
    settings = QuicSettings(ca_file=Path(ca), max_datagram_size=int(datagram_size))
    async with transport.connect(url, settings, client.attach):
        track = FullTrackName(tuple(f.encode() for f in json.loads(namespace)), name.encode())
        request_id = client.moqt.subscribe(track)
        client.send()
        await client.next(RequestAccepted, lambda e: e.request_id == request_id)
        print(json.dumps({"event": "ready"}), flush=True)
        await client.until(lambda: bool(client.of(SubscriptionEnded)), timeout=120)
        ended = client.of(SubscriptionEnded)[0]
        await asyncio.sleep(0.5)  # streams may end after PUBLISH_DONE arrived
        fin = {e.stream_id for e in client.of(DataStreamEnded)}
        finished: dict[int, int] = {}  # group -> objects, of the streams that ended with FIN
        for obj in client.objects(request_id):
            if obj.stream_id in fin:
                finished[obj.group_id] = finished.get(obj.group_id, 0) + 1
        report = {"event": "ended", "status": ended.message.status_code, "finished": finished}
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    # A subscriber in a process of its own, so a test can SIGSTOP it (a subscriber that
    # stops reading) without stopping the publisher: python -m tests.support.relay
    # URL CA '["namespace", "fields"]' TRACK DATAGRAM_SIZE
    transport.run(_subscribe_and_report(*sys.argv[1:6]))


NAMESPACE = (b"kvcache.moq.arpa/v1", b"smollm2", b"prompt-1")
TRACK = FullTrackName(NAMESPACE, b"fp16")
FROM_START = SubscriptionFilter(FilterType.ABSOLUTE_START, Location(0, 0))


class Sessions:
    """Opens client sessions to one relay and closes them all at the end."""

    def __init__(self, relay: RelayProcess, cert: CertificatePaths) -> None:
        self.relay, self.cert = relay, cert
        self._contexts: list[object] = []

    async def open(self, **settings: object) -> Client:
        client = Client()
        context = transport.connect(
            self.relay.url, dataclasses.replace(self.relay.settings, **settings), client.attach
        )
        await context.__aenter__()
        self._contexts.append(context)
        return client

    async def close(self, client: Client) -> None:
        assert client.connection is not None
        client.connection.close()
        await client.connection.wait_closed()

    async def __aenter__(self) -> Sessions:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for context in reversed(self._contexts):
            await context.__aexit__(None, None, None)  # type: ignore[attr-defined]


async def announce(publisher: Client, namespace: tuple[bytes, ...] = NAMESPACE) -> None:
    request_id = publisher.moqt.publish_namespace(namespace)
    publisher.send()
    await publisher.next(RequestAccepted, lambda e: e.request_id == request_id)


def received(client: Client, request_id: int) -> list[tuple[int, int, bytes]]:
    return sorted((e.group_id, e.object_id, e.payload) for e in client.objects(request_id))


def expected(groups: int, objects: int, size: int) -> list[tuple[int, int, bytes]]:
    return [(g, o, payload(g, o, size)) for g in range(groups) for o in range(objects)]


@asynccontextmanager
async def publisher_server(
    settings: QuicSettings, cert: CertificatePaths, publisher: api.Publisher
) -> AsyncIterator[tuple[str, list[api.Session]]]:
    """A publishing application that serves its tracks itself (`api.serve`, no relay): its
    URL, and the sessions it accepted as they come."""
    sessions: list[api.Session] = []
    port = free_udp_port()
    server = await api.serve(
        HOST,
        port,
        settings,
        cert=cert.cert,
        key=cert.key,
        publisher=publisher,
        on_session=sessions.append,
    )
    try:
        yield f"moqt://localhost:{port}/kv", sessions
    finally:
        server.close()
