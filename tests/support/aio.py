"""Running a test's async body."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from typing import TypeVar

from sidecar.moqt.aio import transport

TIMEOUT_S = 120.0
"""Only bounds a hang (a busy machine may be slow): a hung body fails its test, not the run."""

T = TypeVar("T")


def run(main: Callable[[], Awaitable[None]], timeout: float = TIMEOUT_S) -> None:
    """Run `main()` on the event loop the sessions run on (`transport.run`: uvloop where
    installed), bounded by `timeout` seconds."""

    async def bounded() -> None:
        await asyncio.wait_for(main(), timeout)

    transport.run(bounded())


@asynccontextmanager
async def off_the_loop(context: AbstractContextManager[T]) -> AsyncIterator[T]:
    """Enter and leave a blocking context (a relay process starting, stopping) on a thread.

    The QUIC stacks of this process run on the loop: blocked for a second, its sessions
    acknowledge no PING, and a relay drops a peer it waits on that stops answering
    (`kvmoq relay --stall-timeout`), as it should drop a dead one."""
    value = await asyncio.to_thread(context.__enter__)
    try:
        yield value
    except BaseException as exc:
        if not await asyncio.to_thread(context.__exit__, type(exc), exc, exc.__traceback__):
            raise
    else:
        await asyncio.to_thread(context.__exit__, None, None, None)
