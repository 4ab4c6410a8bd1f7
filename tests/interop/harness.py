"""Start MoQT peer programs as subprocesses and read what they report.

Each peer is a program under peers/ (or, for the aiomoqt relay, aiomoqt's own relay tool)
that prints one JSON event per line on stdout. `Peer` collects those events and the stderr
log on reader threads, so waiting never blocks on a full pipe, and folds the log into every
failure message. Nothing here is pytest-specific apart from the skips; conftest.py adds
fixtures that stop every peer at teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from sidecar.demo.children import CHECKOUT_RELAY_PYTHON

PEERS_DIR = Path(__file__).parent / "peers"
REPO_ROOT = Path(__file__).resolve().parents[2]
AIOMOQT_PYTHON = Path(
    os.environ.get("KVMOQ_AIOMOQT_PYTHON", REPO_ROOT / ".venv-aiomoqt" / "bin" / "python")
)

_STOP_GRACE_S = 3.0
_LOG_TAIL_LINES = 60
LIFETIME_S = 300
"""No peer outlives this, even if pytest itself is killed: coreutils `timeout` wraps each one."""


KVMOQ_RELAY_DRAFT = {"aiomoqt": "moq-transport-14", "moqrs": "moq-transport-18"}
"""The draft each peer lands on with kvmoq's relay, which speaks 18, 16 and 14: moq-rs takes
the newest; the aiomoqt peer of these tests offers 14 only (`peers/aiomoqt_session.py`)."""


class PeerError(AssertionError):
    """A peer did not do what the test waited for; the message carries its logs."""


@dataclass(frozen=True)
class Program:
    """How to run one (kind, role): interpreter and arguments, and what marks it ready.

    `ready_stderr` is for programs we do not own and that print no JSON (aiomoqt's relay
    tool): a regex on stderr that stands for the ready event.
    """

    python: Path
    args: tuple[str, ...]
    ready_stderr: re.Pattern[str] | None = None


def _peer_script(name: str) -> tuple[str, ...]:
    return (str(PEERS_DIR / name),)


PROGRAMS: dict[tuple[str, str], Program] = {
    ("moqrs", "relay"): Program(Path(sys.executable), _peer_script("moqrs_relay.py")),
    ("moqrs", "pub"): Program(Path(sys.executable), _peer_script("moqrs_pub.py")),
    ("moqrs", "sub"): Program(Path(sys.executable), _peer_script("moqrs_sub.py")),
    ("aiomoqt", "relay"): Program(
        AIOMOQT_PYTHON,
        ("-m", "aiomoqt.tools.moq_interop_relay", "--quic", "--draft", "14", "--bind", "127.0.0.1"),
        ready_stderr=re.compile(r"Listening on .*UDP port \d+"),
    ),
    ("aiomoqt", "pub"): Program(AIOMOQT_PYTHON, _peer_script("aiomoqt_pub.py")),
    ("aiomoqt", "sub"): Program(AIOMOQT_PYTHON, _peer_script("aiomoqt_sub.py")),
    ("moqrs", "fetch"): Program(Path(sys.executable), _peer_script("moqrs_fetch.py")),
    ("aiomoqt", "fetch"): Program(AIOMOQT_PYTHON, _peer_script("aiomoqt_fetch.py")),
}
"""Every runnable peer. Another implementation (e.g. kvmoq's own relay) registers here."""


def _flag_value(value: object) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def as_flags(params: Mapping[str, object]) -> list[str]:
    """{"object_size": 5, "sizes": [1, 2], "debug": True} -> --object-size 5 --sizes 1,2 --debug."""
    flags: list[str] = []
    for name, value in params.items():
        flag = f"--{name.replace('_', '-')}"
        flags += [flag] if value is True else [flag, _flag_value(value)]
    return flags


def skip_if_unavailable(kind: str) -> None:
    """Skip the calling test, with the reason, when a peer implementation is not installed."""
    if kind == "aiomoqt" and not AIOMOQT_PYTHON.exists():
        pytest.skip(f"aiomoqt peers need {AIOMOQT_PYTHON} (a Python 3.12 venv with aiomoqt)")
    if kind == "moqrs":
        pytest.importorskip("moq", reason="moq-rs peers need the moq-rs package (import moq)")
    if kind == "kvmoq-default" and not CHECKOUT_RELAY_PYTHON.exists():
        pytest.skip(f"kvmoq's relay as users run it needs {CHECKOUT_RELAY_PYTHON} (setup.sh)")


class Peer:
    """One running peer process and everything it has reported so far."""

    def __init__(
        self, name: str, argv: Sequence[str], program: Program, env: Mapping[str, str]
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self._ready_stderr = program.ready_stderr
        self._events: list[dict[str, Any]] = []
        self._stderr: list[str] = []
        self._changed = threading.Condition()
        self._process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **env},
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    # -- readers ----------------------------------------------------------------------------

    def _record(self, event: dict[str, Any]) -> None:
        with self._changed:
            self._events.append(event)
            self._changed.notify_all()

    def _read_stdout(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = {"event": "text", "text": line.rstrip("\n")}
            self._record(event)
        with self._changed:
            self._changed.notify_all()

    def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            with self._changed:
                self._stderr.append(line.rstrip("\n"))
            if self._ready_stderr is not None and self._ready_stderr.search(line):
                self._record({"event": "ready", "log": line.strip()})

    # -- what the peer reported -------------------------------------------------------------

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """All events so far, or those of one kind, in arrival order."""
        with self._changed:
            return [dict(e) for e in self._events if kind is None or e.get("event") == kind]

    def results(self) -> list[dict[str, Any]]:
        """The received objects as {group, object, size, sha256}, in arrival order."""
        return [
            {key: value for key, value in event.items() if key != "event"}
            for event in self.events("object")
        ]

    @property
    def version(self) -> str | None:
        """The MoQT version the peer's session negotiated, as it reported it."""
        sessions = self.events("session")
        return sessions[-1]["version"] if sessions else None

    @property
    def returncode(self) -> int | None:
        return self._process.poll()

    def log(self) -> str:
        """Command, exit status, stdout events and stderr tail: for failure messages."""
        with self._changed:
            stderr = self._stderr[-_LOG_TAIL_LINES:]
            events = [json.dumps(e, sort_keys=True) for e in self._events[-_LOG_TAIL_LINES:]]
        return "\n".join(
            [
                f"--- peer {self.name}: {' '.join(self.argv)}",
                f"--- exit status: {self.returncode}",
                "--- stdout (last events):",
                *events,
                "--- stderr (tail):",
                *stderr,
            ]
        )

    # -- waiting ----------------------------------------------------------------------------

    def wait_event(self, kind: str, timeout: float) -> dict[str, Any]:
        """The first event of `kind`; PeerError if the peer exits or time runs out first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self._events:
                    if event.get("event") == kind:
                        return dict(event)
                if self._process.poll() is not None and not self._readers[0].is_alive():
                    raise PeerError(f"{self.name} exited before {kind!r}\n{self.log()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PeerError(f"{self.name}: no {kind!r} within {timeout} s\n{self.log()}")
                self._changed.wait(min(remaining, 0.5))

    def wait_ready(self, timeout: float = 20.0) -> dict[str, Any]:
        return self.wait_event("ready", timeout)

    def wait_exit(self, timeout: float) -> int:
        """Exit status; PeerError (after killing the peer) if it is still running at the end."""
        try:
            code = self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise PeerError(f"{self.name} still running after {timeout} s\n{self.log()}") from None
        for reader in self._readers:
            reader.join(timeout=_STOP_GRACE_S)
        return code

    def expect_success(self, timeout: float) -> None:
        """Wait for exit and fail with the peer's log unless it exited 0."""
        code = self.wait_exit(timeout)
        if code != 0:
            raise PeerError(f"{self.name} exited with {code}\n{self.log()}")

    def stop(self) -> None:
        """SIGTERM the peer's process group, then SIGKILL it if it lingers."""
        if self._process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self._process.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self._process.wait(_STOP_GRACE_S)
        for reader in self._readers:
            reader.join(timeout=_STOP_GRACE_S)
        for stream in (self._process.stdout, self._process.stderr):
            if stream is not None:
                stream.close()

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signum)


class StartPeer(Protocol):
    """The `start_peer` fixture: start_peer(kind, role, **params) -> Peer (RelayPeer for relays)."""

    def __call__(self, kind: str, role: str, **params: object) -> Peer: ...


class RelayPeer(Peer):
    """A relay peer, which also knows where clients reach it."""

    def __init__(
        self, name: str, argv: Sequence[str], program: Program, env: Mapping[str, str], port: int
    ) -> None:
        super().__init__(name, argv, program, env)
        self.port = port

    @property
    def url(self) -> str:
        return f"moqt://127.0.0.1:{self.port}"


def launch(
    kind: str,
    role: str,
    params: Mapping[str, object],
    env: Mapping[str, str] | None = None,
) -> Peer:
    """Start peer (kind, role) with `params` as its --flags; does not wait for it to be ready."""
    skip_if_unavailable(kind)
    program = PROGRAMS[(kind, role)]
    argv = [
        "timeout",
        f"--kill-after={_STOP_GRACE_S:g}",
        str(LIFETIME_S),
        str(program.python),
        *program.args,
        *as_flags(params),
    ]
    name = f"{kind}-{role}"
    if role == "relay":
        return RelayPeer(name, argv, program, env or {}, port=int(str(params["port"])))
    return Peer(name, argv, program, env or {})
