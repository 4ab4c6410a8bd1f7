"""What every multi-process benchmark does around its measurement: child processes that go
away on every exit path, a dev certificate, the machine's cores and load in the report, its
goals checked in code, then the table and the JSON."""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.demo.children import Children
    from sidecar.moqt.aio.tls import CertificatePaths

Report = dict[str, Any]


def add_datagram_size(parser: argparse.ArgumentParser) -> None:
    from sidecar.moqt.aio.quic_backend import LOOPBACK_DATAGRAM_SIZE

    parser.add_argument(
        "--max-datagram-size",
        type=int,
        default=LOOPBACK_DATAGRAM_SIZE,
        metavar="BYTES",
        help=f"QUIC packet size of the relays and every session (default "
        f"{LOOPBACK_DATAGRAM_SIZE}; 1350 for internet-sized packets; the relay runs the "
        "fastest stack installed for the size)",
    )


def check_datagram_size(size: int, command: str) -> int:
    """`size`, or SystemExit naming `command` when no QUIC stack takes it."""
    from sidecar.moqt.aio.quic_backend import DATAGRAM_SIZES

    if size not in DATAGRAM_SIZES:
        sizes = f"{DATAGRAM_SIZES.start}..{DATAGRAM_SIZES.stop - 1}"
        raise SystemExit(f"{command}: --max-datagram-size must be in {sizes}")
    return size


class LoadMismatch(RuntimeError):
    """A load that did not bring the reference's KV: the figures would be worthless."""


def measured(
    name: str,
    measure: Callable[[Children, CertificatePaths], Awaitable[Report]],
    failures: tuple[type[BaseException], ...] = (),
    *,
    one_session: bool = False,
) -> Report | None:
    """Run `measure` with a `Children` scope (`one_session`: see `Children`) and a
    certificate; its report with the cores and the load average at the start, or None (the
    reason printed) when a child exited, a connection failed or timed out, or one of
    `failures` (a load that brought the wrong bytes) was raised: such figures would be
    worthless."""
    from sidecar.demo.children import ChildFailed, Children
    from sidecar.moqt.aio import transport
    from sidecar.moqt.aio.tls import write_certificate

    load_average = os.getloadavg()[0]
    try:
        with (
            Children(one_session=one_session) as children,
            tempfile.TemporaryDirectory(prefix=f"kvmoq-{name}-") as tmp,
        ):
            report = transport.run(measure(children, write_certificate(Path(tmp))))
    except (ChildFailed, ConnectionError, TimeoutError, *failures) as failure:
        print(f"kvmoq bench {name} failed: {type(failure).__name__}: {failure}")
        return None
    return report | {
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "load_average_at_start": load_average,
    }


def cpu_name() -> str:
    """The processor's model name: figures that hang on the instruction set (vLLM's CPU
    kernels pick AMX or AVX-512 by it) say where they were taken."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def conclude(
    report: Report,
    goals: Callable[[Report], dict[str, dict[str, Any]]],
    show: Callable[[Report], None],
    json_path: str | None,
) -> None:
    """Check the goals (each with its `met`) into the report, print it, write the JSON."""
    report["goals"] = goals(report)
    report["goals_met"] = all(goal["met"] for goal in report["goals"].values())
    show(report)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for the block (codec speeds are figures for one core, as the
    sidecar runs its codecs), the thread count restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
