"""CPU time and memory of processes (relays, publishers, load workers), read from /proc, for
the benchmarks that report them next to wall time."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far; OSError once it has exited."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # utime and stime: fields 14 and 15, counted after the ")" closing the command name
    utime, stime = stat.rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Memory:
    rss: int
    """Resident bytes now."""
    peak: int
    """The most resident bytes so far (VmHWM)."""
    shared: int
    """Resident bytes of shared memory mapped now (RssShmem): a model server's KV buffers
    that a sidecar maps count in both processes' resident memory."""


def memory(pid: int | None) -> Memory:
    """Resident and peak resident memory of process ``pid`` (None: this one)."""
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    kib = {name: int(fields[name].split()[0]) * 1024 for name in ("VmRSS", "VmHWM", "RssShmem")}
    return Memory(kib["VmRSS"], kib["VmHWM"], kib["RssShmem"])


def reset_peak(pid: int | None) -> None:
    """Start the peak resident memory (VmHWM) of process ``pid`` (None: this one) again from
    what it holds now."""
    Path(f"/proc/{pid or 'self'}/clear_refs").write_text("5")
