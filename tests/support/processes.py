"""Finding and stopping the processes a test started, by a marker in their environment:
whatever their parents did, a demo's or a bench's children carry it."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def processes_with_marker(marker: str) -> list[int]:
    """Pids whose environment carries `marker`: the demo and everything it started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ:
            found.append(int(entry.name))
    return found


def stop_marked(marker: str) -> list[int]:
    """SIGKILL every process carrying `marker` (what a failed test leaves of a demo or bench
    it started, whatever their parents did); the pids it found."""
    found = processes_with_marker(marker)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found
