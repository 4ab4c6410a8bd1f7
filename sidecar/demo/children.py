"""Child processes that announce readiness with one stdout line (or answer when ready) and
die with their parent.

The demo must leave nothing behind, even on Ctrl-C, SIGTERM or a failed step, so every child
is registered in a `Children` context that terminates (then kills) them all on exit. A parent
that is killed outright (SIGKILL, a test's timeout) runs no exit code, so on Linux each child
also asks the kernel for a SIGTERM when its parent dies (`PR_SET_PDEATHSIG`), and stops.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

from sidecar.moqt.aio.quic_backend import BackendName, installed

SignalHandler = Callable[[int, FrameType | None], Any] | int
"""What `signal.signal` takes (SIG_DFL and SIG_IGN are ints)."""


PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
"""Loaded before any fork: a child between fork and exec may only make the call."""
_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvmoq-children")
"""Forks every child (see `_dies_with`): callers start children from threads that end (a
benchmark starts its engines from a pool), which must not take the children along."""


def _dies_with(parent: int) -> Callable[[], None]:
    """A `preexec_fn`: SIGTERM this child when the thread that started it ends, and at once
    if `parent` is gone already (the kernel would not signal a death that came before the
    request). The kernel watches the forking thread, not the process, so every child is
    forked by `_SPAWNER`'s one thread, which lives as long as the process."""

    def arrange() -> None:
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)

    return arrange


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

    def log_size(self) -> int:
        """Bytes the child wrote to its log (stderr) so far: a mark for `log_since`."""
        return os.fstat(self.log.fileno()).st_size

    def log_since(self, mark: int) -> list[str]:
        """The log lines written after `mark` (`log_size`)."""
        self.log.seek(mark)
        return self.log.read().splitlines()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM first (relays send GOAWAY), SIGKILL if it lingers; then whatever it
        started itself (a vLLM engine's core process): the child leads a process group of
        its own, and the group goes with it."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        _signal_group(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _signal_group(leader: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(leader, signum)


class Children:
    """Starts children and guarantees they are gone when the `with` block ends.

    Each child runs in a session of its own, so a Ctrl-C reaches this process only, and this
    process stops them; where the kernel shares the CPU between sessions first (Linux's
    autogroup), each child then gets a share of its own, as a container gets its cgroup's.
    With `one_session`, each child leads a process group of its own in this process's session
    instead (Ctrl-C still reaches this process only), and they share the CPU as one program's
    threads do: a model server that spins while it waits (vLLM's engine polls its worker)
    then yields to the sidecar it waits for instead of holding a share of its own, and
    Mooncake's P and D servers answer each other at all (in sessions of their own, D's pull
    timed out on P's bootstrap server while both engines spun). A child's stdin is /dev/null
    unless it takes requests there (a background group must not read the terminal).

    In the main thread, SIGTERM raises SystemExit while the block runs (its default action
    would end this process without stopping them), and Ctrl-C or SIGTERM during the stopping
    itself is ignored, so a second one cannot cut it short.
    """

    def __init__(self, *, one_session: bool = False) -> None:
        self._one_session = one_session
        self._children: list[Child] = []
        self._sigterm = SigtermExits()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready_prefix: str | None,
        timeout: float,
        env: dict[str, str] | None = None,
        stdin: bool = False,
    ) -> Child:
        """Run `argv`; return once it prints a line starting with `ready_prefix`. With
        `stdin`, its standard input is a pipe to write requests into (else /dev/null).

        A child that announces nothing on stdout (an HTTP server, ready when it answers)
        takes `ready_prefix` None: it is returned once started, its stdout goes to its log
        beside its stderr, and the caller judges when it is ready.
        """
        # Lives as long as the child (closed in stop_all), so no `with` block here.
        log = tempfile.TemporaryFile("w+")  # noqa: SIM115
        process = _SPAWNER.submit(
            subprocess.Popen,
            list(argv),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=log if ready_prefix is None else subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, **(env or {})},
            # Either way Ctrl-C reaches the demo only; it stops the children.
            start_new_session=not self._one_session,
            process_group=0 if self._one_session else None,
            preexec_fn=_dies_with(os.getpid()),
        ).result()
        child = Child(name, process, log)
        self._children.append(child)
        if ready_prefix is not None:
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

    def wait_any(self, poll: float = 0.5) -> Child:
        """Block until one of the children exits; that child (for services left running)."""
        while True:
            for child in self._children:
                if child.process.poll() is not None:
                    return child
            time.sleep(poll)

    def stop_all(self) -> None:
        with _signals_ignored():
            for child in reversed(self._children):
                child.stop()
                child.log.close()
            self._children.clear()

    def __enter__(self) -> Children:
        self._sigterm.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop_all()
        finally:
            self._sigterm.restore()


def _in_main_thread() -> bool:
    """Python sets signal handlers in the main thread only; elsewhere Children just stops its
    children on exit."""
    return threading.current_thread() is threading.main_thread()


def exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler that unwinds: `with` blocks and `finally` clauses run, where the
    default action would end the process on the spot."""
    raise SystemExit(128 + signum)


class SigtermExits:
    """`exit_on_sigterm` as SIGTERM's handler from `install` to `restore` (in the main thread;
    elsewhere Python sets no handlers and both do nothing)."""

    def __init__(self) -> None:
        self._previous: SignalHandler | None = None

    def install(self) -> None:
        if _in_main_thread():
            previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
            self._previous = signal.SIG_DFL if previous is None else previous

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored for the block (in the main thread; elsewhere a no-op)."""
    if not _in_main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def python_module(module: str, *args: str, python: str = sys.executable) -> list[str]:
    """argv that runs a module of this package with `python` (default: this interpreter)."""
    return [python, "-m", module, *args]


RELAY_PYTHON_ENV = "KVMOQ_RELAY_PYTHON"
CHECKOUT_RELAY_PYTHON = Path(__file__).resolve().parents[2] / ".venv-relay" / "bin" / "python"
"""The relay's own environment in a checkout (Python 3.12, no torch), made by scripts/setup.sh."""


@cache
def python_with(stack: BackendName) -> str | None:
    """An interpreter that can run QUIC stack `stack` with this package: this one, else the
    relay's (aiopquic needs Python >= 3.12, the sidecar's torch build 3.11): $KVMOQ_RELAY_PYTHON,
    or the checkout's .venv-relay that scripts/setup.sh makes. None if neither has it."""
    if installed(stack):
        return sys.executable
    other = os.environ.get(RELAY_PYTHON_ENV) or str(CHECKOUT_RELAY_PYTHON)
    probe = f"import importlib.util as u, sys; sys.exit(u.find_spec({stack!r}) is None)"
    try:
        found = subprocess.run([other, "-c", probe], capture_output=True, timeout=30).returncode
    except OSError:
        return None
    return other if found == 0 else None
