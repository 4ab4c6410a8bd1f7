"""A private network namespace whose loopback is a rate-limited link, for benchmarks.

Why a namespace: a qdisc on the host's `lo` would throttle every other process on the
machine. In a fresh namespace `lo` belongs to the benchmark alone, and every packet between
two processes in it crosses `lo` exactly once, so a token bucket on it is the link between
them (both directions draw from the one bucket; acknowledgements cost a few percent).

Why tbf: it shapes to a rate with a bounded queue, which is what a slower link looks like to
a sender, and this kernel has it (it has no netem). The queue holds `QUEUE_S` of traffic at
the rate, the order of a switch buffer; beyond it packets drop, as on a real link.

The namespace is removed on every exit path, Ctrl-C and SIGTERM included, and processes still
inside it (children of children) are stopped first: they would otherwise keep it alive.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from sidecar.demo.children import SigtermExits

NAME_PREFIX = "kvmoq-bench-"
QUEUE_S = 0.05
MIN_BURST_BYTES = 2 * 65536 + 4096
"""The bucket must hold the largest packet `lo` carries (64 KiB, its MTU and GSO size),
or tbf drops it; two of them so back-to-back packets pass at the rate."""
BURST_S = 0.005
COMMAND_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0


class NamespaceError(RuntimeError):
    """An `ip` or `tc` command failed; carries its stderr."""


def unavailable_reason() -> str | None:
    """Why this process cannot make a rate-limited namespace, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces and tc need root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} (iproute2) not found"
    return None


@dataclass(frozen=True, slots=True)
class LinkLimit:
    """A link rate as tc writes it (`100mbit`, `1gbit`): SI prefixes, bits per second."""

    label: str
    bits_per_second: int

    @classmethod
    def parse(cls, text: str) -> LinkLimit:
        match = re.fullmatch(r"(\d+)(k|m|g)bit", text.strip().lower())
        if match is None:
            raise ValueError(f"expected a rate like 100mbit or 1gbit, got {text!r}")
        value = int(match[1]) * {"k": 10**3, "m": 10**6, "g": 10**9}[match[2]]
        if value <= 0:
            raise ValueError(f"a link rate must be positive, got {text!r}")
        return cls(match[0], value)

    def tbf_args(self) -> list[str]:
        rate_bytes = self.bits_per_second / 8
        burst = max(MIN_BURST_BYTES, int(rate_bytes * BURST_S))
        latency_ms = max(1, round(QUEUE_S * 1000))
        return [
            "rate",
            f"{self.bits_per_second}bit",
            "burst",
            str(burst),
            "latency",
            f"{latency_ms}ms",
        ]


def _command(argv: Sequence[str]) -> str:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise NamespaceError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


class Namespace:
    """A network namespace with `lo` up, alive for the `with` block.

    `limit` and `exec_argv` work from any process that knows the name, including one
    already inside the namespace, so a benchmark run there can change its own link.
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"{NAME_PREFIX}{os.getpid()}"
        self._sigterm = SigtermExits()

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def limit(self, link: LinkLimit | None) -> None:
        """Shape the namespace's loopback to `link`, or lift the limit (None)."""
        tc = self.exec_argv(["tc", "qdisc"])
        if link is None:
            if "tbf" in _command([*tc, "show", "dev", "lo"]):
                _command([*tc, "del", "dev", "lo", "root"])
        else:
            _command([*tc, "replace", "dev", "lo", "root", "tbf", *link.tbf_args()])

    @contextlib.contextmanager
    def limited(self, link: LinkLimit) -> Iterator[None]:
        """The loopback shaped to `link` for the `with` block, then free again."""
        self.limit(link)
        try:
            yield
        finally:
            self.limit(None)

    def run(self, argv: Sequence[str], *, grace: float = STOP_GRACE_S * 3) -> int:
        """Run `argv` inside the namespace to its end; its exit status.

        On Ctrl-C the child got the SIGINT too (same process group) and stops its own
        children; it has `grace` seconds for that before it is killed. On any other
        interruption it is terminated first.
        """
        process = subprocess.Popen(self.exec_argv(argv))
        try:
            return process.wait()
        except BaseException as interruption:
            if not isinstance(interruption, KeyboardInterrupt):
                process.terminate()
            _wait_or_kill(process, grace)
            raise

    def __enter__(self) -> Namespace:
        _command(["ip", "netns", "add", self.name])
        try:
            _command(self.exec_argv(["ip", "link", "set", "lo", "up"]))
        except BaseException:
            self._remove()
            raise
        # SIGTERM's default kills without unwinding: the namespace would outlive us.
        self._sigterm.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._remove()
        finally:
            self._sigterm.restore()

    def _remove(self) -> None:
        self._stop_processes()
        _command(["ip", "netns", "delete", self.name])

    def _stop_processes(self) -> None:
        """SIGTERM, then SIGKILL, every process still in the namespace (all started by us)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [int(p) for p in _command(["ip", "netns", "pids", self.name]).split()]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # gone since the listing
                    os.kill(pid, sig)
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline and _command(["ip", "netns", "pids", self.name]):
                time.sleep(0.1)


def _wait_or_kill(process: subprocess.Popen[bytes], grace: float) -> None:
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def loopback_bytes() -> int:
    """Bytes sent over `lo` so far in this process's namespace: every packet between two of
    its processes, either way, counted once with its IP and UDP (or TCP) headers."""
    return int(Path("/sys/class/net/lo/statistics/tx_bytes").read_text())


def loopback_rate(seconds: float = 2.0, chunk: int = 1 << 16) -> float:
    """Bits per second one bulk TCP transfer gets over 127.0.0.1 in this process's namespace.

    A check that a limit holds, independent of QUIC and of kvmoq: the sender writes for
    `seconds`, the receiver times from its first byte to the last, so bytes still queued
    when the sender stops are counted at the rate they drain.
    """
    timeout = seconds + COMMAND_TIMEOUT_S
    figures: list[tuple[int, float]] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(timeout)
        port = server.getsockname()[1]

        def receive() -> None:
            connection, _ = server.accept()
            with connection:
                connection.settimeout(timeout)
                buffer = bytearray(1 << 20)
                total, first = 0, 0.0
                while received := connection.recv_into(buffer):
                    if total == 0:
                        first = time.perf_counter()
                    total += received
                figures.append((total, time.perf_counter() - first))

        receiver = threading.Thread(target=receive, daemon=True)
        receiver.start()
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sender:
            payload = bytes(chunk)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                sender.sendall(payload)
        receiver.join(timeout)
    if not figures:
        raise TimeoutError("the bulk transfer over loopback did not finish")
    total, elapsed = figures[0]
    return total * 8 / elapsed
