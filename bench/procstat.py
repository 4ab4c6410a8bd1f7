"""CPU time of other processes (relays, load workers), read from /proc, for the benchmarks
that report CPU seconds next to wall time."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far; OSError once it has exited."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # utime and stime: fields 14 and 15, counted after the ")" closing the command name
    utime, stime = stat.rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
