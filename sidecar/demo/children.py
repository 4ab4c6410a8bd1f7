"""Child processes that announce readiness with one stdout line and die with their parent.

The demo must leave nothing behind, even on Ctrl-C or a failed step, so every child is
registered in a `Children` context that terminates (then kills) them all on exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import IO


class ChildFailed(RuntimeError):
    """A child exited or stayed silent before it said it was ready; carries its log tail."""


@dataclass
class Child:
    name: str
    process: subprocess.Popen[str]
    log: IO[str]
    ready_line: str = ""
    extra_lines: list[str] = field(default_factory=list)

    def log_tail(self, lines: int = 30) -> str:
        self.log.flush()
        self.log.seek(0)
        return "".join(self.log.readlines()[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM first (relays send GOAWAY), SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Children:
    """Starts children and guarantees they are gone when the `with` block ends."""

    def __init__(self) -> None:
        self._children: list[Child] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready_prefix: str,
        timeout: float,
        env: dict[str, str] | None = None,
    ) -> Child:
        """Run `argv`; return once it prints a line starting with `ready_prefix`."""
        # Lives as long as the child (closed in stop_all), so no `with` block here.
        log = tempfile.TemporaryFile("w+")  # noqa: SIM115
        process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops the children
        )
        child = Child(name, process, log)
        self._children.append(child)
        child.ready_line = self._wait_ready(child, ready_prefix, timeout)
        return child

    @staticmethod
    def _wait_ready(child: Child, prefix: str, timeout: float) -> str:
        found: list[str] = []
        stdout = child.process.stdout
        assert stdout is not None

        def read() -> None:
            for line in stdout:
                if line.startswith(prefix):
                    found.append(line.strip())
                    return
                child.extra_lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if not found:
            status = child.process.poll()
            state = f"exited with {status}" if status is not None else f"silent for {timeout:.0f} s"
            raise ChildFailed(f"{child.name} {state} before it was ready:\n{child.log_tail()}")
        return found[0]

    def stop_all(self) -> None:
        for child in reversed(self._children):
            child.stop()
            child.log.close()
        self._children.clear()

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()


def python_module(module: str, *args: str) -> list[str]:
    """argv that runs a module of this package with the current interpreter."""
    return [sys.executable, "-m", module, *args]
