"""Running a test's async body."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from sidecar.moqt.aio import transport

TIMEOUT_S = 120.0
"""Only bounds a hang (a busy machine may be slow): a hung body fails its test, not the run."""


def run(main: Callable[[], Awaitable[None]], timeout: float = TIMEOUT_S) -> None:
    """Run `main()` on the event loop the sessions run on (`transport.run`: uvloop where
    installed), bounded by `timeout` seconds."""

    async def bounded() -> None:
        await asyncio.wait_for(main(), timeout)

    transport.run(bounded())
