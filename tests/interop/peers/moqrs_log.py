"""Turn moq-rs's Rust log into harness events.

moq-rs does not expose the negotiated protocol version through its Python API; it only logs
it ("connected version=moq-transport-14"). A client peer must report it, because a moq-rs
client and a moq-rs server silently prefer moq-lite over draft-14. So the peer routes its
own fd 2 through a pipe that a thread reads, echoes to the real stderr, and scans.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable

import moq

_CONNECTED = re.compile(r"connected version=(\S+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def watch_versions(on_version: Callable[[str], None]) -> None:
    """Start Rust logging (MOQ_LOG_LEVEL, default info) and report each negotiated version.

    Must run before any moq object is created: the log subscriber is global and set once.
    """
    real_stderr = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def pump() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                os.write(real_stderr, raw)
                match = _CONNECTED.search(_ANSI.sub("", raw.decode(errors="replace")))
                if match:
                    on_version(match.group(1))

    threading.Thread(target=pump, name="rust-log", daemon=True).start()
    moq.log_level(os.environ.get("MOQ_LOG_LEVEL", "info"))
