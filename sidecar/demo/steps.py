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


def follow(child: Child, until: str, view: StepView, timeout: float) -> dict[str, Any]:
    """Show `child`'s steps until it prints the event `until`; that event's fields.

    `timeout` bounds the silence between two lines, not the whole wait: a long prefill
    that reports progress is fine, a hung one is not. Call it once per child: it reads the
    child's stdout to the end.
    """
    stdout = child.process.stdout
    assert stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            raise ChildFailed(
                f"{child.name} silent for {timeout:.0f} s:\n{child.log_tail()}"
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
        view.show(event)
