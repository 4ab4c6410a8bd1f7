"""A session's connection as an origin sees it (``protocol.records.PeerLink``), on asyncio.

Shared by the relay's server and by publishing applications (``aio.api``): both hand their
sessions to an ``Origin`` (a relay is one) the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..protocol.origin import Origin
from ..protocol.records import Peer
from . import transport


class ConnectionLink:
    def __init__(
        self,
        connection: transport.MoqtConnection,
        origin: Origin,
        on_resumed: Callable[[], None] | None = None,
    ) -> None:
        self._connection = connection
        self._origin = origin
        self._on_resumed = on_resumed
        self._drain_task: asyncio.Task[None] | None = None
        self._peer: Peer | None = None

    @classmethod
    def attach(
        cls,
        origin: Origin,
        connection: transport.MoqtConnection,
        name: str,
        on_resumed: Callable[[], None] | None = None,
    ) -> Peer:
        """Make ``connection`` a peer of ``origin``; the caller hands its events to
        ``origin.handle``. ``on_resumed`` is called each time the origin wrote more to it
        after a drain."""
        link = cls(connection, origin, on_resumed)
        peer = link._peer = origin.add_peer(connection.moqt, link, name)
        return peer

    def backlogged(self) -> bool:
        return self._connection.backlogged()

    def closing(self) -> bool:
        return self._connection.closing

    def transmit(self) -> None:
        self._connection.transmit()

    def wake_when_drained(self) -> None:
        self._drain_task = asyncio.ensure_future(self._resume_after_drain())

    async def _resume_after_drain(self) -> None:
        try:
            await self._connection.drain()
        except ConnectionError:
            return  # the session's SessionClosed event cleans up
        if self._peer is not None:
            self._origin.resume(self._peer)
        if self._on_resumed is not None:
            self._on_resumed()
