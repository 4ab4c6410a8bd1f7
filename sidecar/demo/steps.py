"""How the demo's model servers tell the demo what they are doing: JSON lines on stdout.

A model server runs in its own process, yet its long steps (loading SmolLM2, prefill, each
transfer) must show as progress bars in the demo's terminal, and its results must reach the
demo's table. So a server prints one JSON object per line: `step` (a new bar), `progress`
(tokens done), and one final event carrying its results; a failed server prints nothing
more and exits non-zero, and the demo reports its log tail.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from typing import Any

from sidecar.demo.children import Child, ChildFailed

STARTED = '{"event": "started"'
"""The first line of every model server: the process is up (`Children.start` waits for it)."""

Progress = Callable[[int], None]


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Steps:
    """The server side: each `start` opens a bar in the demo, the returned call advances it."""

    def __init__(self) -> None:
        self._count = 0

    def start(self, description: str, total: int = 1) -> Progress:
        self._count += 1
        step = self._count
        emit("step", step=step, description=description, total=total)
        return lambda completed: emit("progress", step=step, completed=completed)


class StepView:
    """What the demo side does with a step: open a bar (returns its id) and move it."""

    def __init__(self, add: Callable[[str, int], Any], update: Callable[[Any, int], None]) -> None:
        self._add = add
        self._update = update
        self._bars: dict[int, Any] = {}

    def show(self, event: dict[str, Any]) -> None:
        if event["event"] == "step":
            self._bars[event["step"]] = self._add(event["description"], event["total"])
        elif event["event"] == "progress":
            self._update(self._bars[event["step"]], event["completed"])


class Events:
    """A model server's events, read from its stdout by one thread for the child's whole life.

    The demo waits for several events of one server in turn (the decode server's report, then
    under `--keep` the address it serves on), and a pipe has one reader, so the reading
    thread outlives each wait.
    """

    def __init__(self, child: Child, view: StepView, timeout: float) -> None:
        self._child = child
        self._view = view
        self._timeout = timeout
        self._lines: queue.Queue[str | None] = queue.Queue()
        stdout = child.process.stdout
        assert stdout is not None

        def read() -> None:
            for line in stdout:
                self._lines.put(line)
            self._lines.put(None)

        threading.Thread(target=read, daemon=True).start()

    def wait(self, until: str) -> dict[str, Any]:
        """Show the server's steps until it prints the event `until`; that event's fields.

        The timeout bounds the silence between two lines, not the whole wait: a long prefill
        that reports progress is fine, a hung one is not.
        """
        child = self._child
        while True:
            try:
                line = self._lines.get(timeout=self._timeout)
            except queue.Empty:
                raise ChildFailed(
                    f"{child.name} silent for {self._timeout:.0f} s:\n{child.log_tail()}"
                ) from None
            if line is None:
                child.process.wait(10)
                raise ChildFailed(
                    f"{child.name} exited with {child.process.returncode}:\n{child.log_tail()}"
                )
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if event["event"] == until:
                return dict(event)
            self._view.show(event)
