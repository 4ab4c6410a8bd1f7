"""The aiopquic stack: picoquic (C) on its own network thread, behind the same `QuicEndpoint`.

Why a module of its own: aioquic and qh3 are sans-I/O connections that the endpoint of
`transport` drives from the event loop (it feeds them datagrams and asks them for packets).
picoquic owns its socket and a thread of its own; events come over a ring and an eventfd, and
stream data goes into bounded per-stream rings that refuse a write when full (BufferError)
instead of buffering without bound. Two adapters make that look like the other stacks:

- `PquicConnection` is what the session writes into: the aioquic calls it makes, where a
  write never fails for lack of room. What the rings refuse waits here, in order per stream,
  and counts toward the send backlog that `drain()` bounds, so memory stays bounded the same
  way it is on the other stacks (the relay and publishers write only while not backlogged).
- `PquicEndpoint` is the `QuicEndpoint` the layers above use, on aiopquic's protocol class.

What picoquic does itself: pacing and congestion control (BBR), path MTU discovery (packets
are at most 1536 bytes whatever `max_datagram_size` says: this stack always runs at internet
packet sizes), and PINGs (it has no call to send one; its keep-alive sends them instead, often
enough for the stall watch of `transport.MoqtConnection` when that is on).

aiopquic needs Python >= 3.12 (`pip install 'kvmoq[pquic]'`); only the relay, which needs no
torch, runs there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

from aiopquic.asyncio.protocol import QuicConnectionProtocol
from aiopquic.quic.connection import QuicConnection

from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.moqt.aio.transport import TICK_INTERVAL, Attach, keepalive_interval

WRITE_PIECE = 1 << 20
"""Largest piece one write puts into a stream ring (aiopquic refuses a write larger than the
ring, 4 MiB by default): a bigger object goes in several pieces."""

PROGRESS_POLL = 0.01
"""Longest wait for the network thread to take bytes from a ring before checking again. The
wake-up is an event; this bounds the cost of one that comes before the wait is armed, or of a
full event ring (which has no per-stream wake-up)."""

RING_AHEAD = 2 << 20
"""Bytes queued in a stream's ring that keep it sending for longer than `PROGRESS_POLL` at up
to 200 MB/s: a writer waiting on such a stream sleeps for the poll instead of waking on the
drain event, which fires each time picoquic takes one packet's worth. With slow subscribers
(a relay's fan-out) the event cost a wake-up per packet, most of the relay's CPU."""


def own_fields(settings: QuicSettings) -> dict[str, Any]:
    """What aiopquic's QuicConfiguration takes beyond the fields every stack shares."""
    if settings.stall_timeout is not None:
        # Probes as often as the stall watch looks: a live peer's ACKs then show every tick.
        keep_alive = TICK_INTERVAL / 2
    else:
        keep_alive = keepalive_interval(settings.idle_timeout)
    return {"keep_alive_interval": keep_alive, "socket_buffer_size": settings.socket_buffer}


class PquicConnection:
    """The aioquic-style connection the session writes into, over aiopquic's bounded rings."""

    def __init__(self, quic: QuicConnection) -> None:
        self._quic = quic
        self._waiting: dict[int, deque[tuple[bytes, bool]]] = {}
        """Per stream, in order: writes the stream's ring (or the event ring) refused so far."""
        self._waiting_bytes = 0
        self._sending: set[int] = set()
        """Streams we wrote to whose rings may still hold bytes."""

    # The calls MoqtSession makes (aioquic's names).

    def get_next_available_stream_id(self, is_unidirectional: bool = False) -> int:
        return self._quic.get_next_available_stream_id(is_unidirectional)

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        data = bytes(data)  # aiopquic takes bytes only; the session writes bytes already
        pieces = [data[i : i + WRITE_PIECE] for i in range(0, len(data), WRITE_PIECE)] or [data]
        queue = self._waiting.get(stream_id)
        self._sending.add(stream_id)
        for n, piece in enumerate(pieces):
            fin = end_stream and n == len(pieces) - 1
            if queue is None and self._write(stream_id, piece, fin):
                continue
            if queue is None:
                queue = self._waiting[stream_id] = deque()
            queue.append((piece, fin))
            self._waiting_bytes += len(piece)

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        self._forget(stream_id)
        self._quic.reset_stream(stream_id, error_code)

    def stop_stream(self, stream_id: int, error_code: int) -> None:
        self._quic.stop_stream(stream_id, error_code)

    def send_datagram_frame(self, data: bytes) -> None:
        # A datagram that does not fit, or finds the ring full, is lost as datagrams may be.
        with contextlib.suppress(ValueError, ConnectionError):
            self._quic.send_datagram_frame(data)

    def send_ping(self, uid: int) -> None:
        """picoquic has no call for one; its keep-alive PINGs instead (see `own_fields`)."""

    def close(
        self, error_code: int = 0, frame_type: int | None = None, reason_phrase: str = ""
    ) -> None:
        """An application CONNECTION_CLOSE; picoquic sends no reason phrase."""
        self._quic.close(error_code)

    # What the endpoint needs.

    @property
    def closed(self) -> bool:
        return self._quic.closed

    @property
    def bytes_received(self) -> int:
        """Bytes of packets from the peer, ACKs included (`QuicConnection.bytes_received`
        counts stream data only)."""
        return int(self._quic.path_quality().get("bytes_received", 0))

    def flush(self) -> None:
        """Move waiting writes into the rings, in order, as far as they take them."""
        for stream_id in list(self._waiting):
            queue = self._waiting[stream_id]
            while queue:
                piece, fin = queue[0]
                if not self._write(stream_id, piece, fin):
                    break
                queue.popleft()
                self._waiting_bytes -= len(piece)
            if not queue:
                del self._waiting[stream_id]

    def send_backlog(self) -> int:
        """Bytes written that picoquic has not yet taken into packets."""
        used = self._quic.tx_data_ring_used
        in_rings = 0
        for stream_id in list(self._sending):
            stream_used = used(stream_id)
            if stream_used == 0 and stream_id not in self._waiting:
                self._sending.discard(stream_id)
            in_rings += stream_used
        return self._waiting_bytes + in_rings

    async def progress(self) -> None:
        """Wait until the network thread took bytes from a ring (at most `PROGRESS_POLL`
        seconds): that of the first stream whose writes wait, else the fullest one."""
        quic = self._quic
        stream_id = next(iter(self._waiting), None)
        if stream_id is None:
            stream_id = max(self._sending, key=quic.tx_data_ring_used, default=None)
        if stream_id is None:
            await asyncio.sleep(0)
            return
        if quic.tx_data_ring_used(stream_id) >= RING_AHEAD:
            await asyncio.sleep(PROGRESS_POLL)
            return
        event = quic.get_tx_data_drain_event(stream_id)
        event.clear()
        quic.set_tx_data_drain_pending(stream_id)
        if quic.tx_data_ring_used(stream_id) == 0 and stream_id not in self._waiting:
            quic.clear_tx_data_drain_pending(stream_id)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), PROGRESS_POLL)

    def waiting(self) -> bool:
        return bool(self._waiting)

    def _write(self, stream_id: int, piece: bytes, fin: bool) -> bool:
        try:
            self._quic.send_stream_data(stream_id, piece, end_stream=fin)
        except BufferError:
            return False
        return True

    def _forget(self, stream_id: int) -> None:
        queue = self._waiting.pop(stream_id, None)
        if queue:
            self._waiting_bytes -= sum(len(piece) for piece, _ in queue)
        self._sending.discard(stream_id)


class PquicEndpoint(QuicConnectionProtocol):
    """A `QuicEndpoint` on aiopquic (see `sidecar.moqt.aio.transport`)."""

    def __init__(
        self,
        quic: QuicConnection,
        stream_handler: Any = None,
        *,
        settings: QuicSettings,
        attach: Attach,
    ) -> None:
        super().__init__(quic, stream_handler)
        self._event_loop = asyncio.get_running_loop()
        self._settings = settings
        self._connection = PquicConnection(quic)
        self._terminated = False
        self._transmit_handle: asyncio.Handle | None = None
        self._pump: asyncio.Task[None] | None = None
        self._heard_bytes = 0
        self._last_received = self._event_loop.time()
        self._on_event = attach(self)

    # aiopquic calls these.

    def _process_events(self) -> None:
        self._last_received = self._event_loop.time()
        super()._process_events()

    def quic_event_received(self, event: Any) -> None:
        data = getattr(event, "data", None)
        if data is not None:
            # The view is into aiopquic's receive chunk; what the session keeps must own its bytes.
            event.data = bytes(data)
        if type(event).__name__ == "ConnectionTerminated":
            self._terminated = True
        self._on_event(event)

    # The layers above call these.

    @property
    def quic(self) -> PquicConnection:
        return self._connection

    @property
    def closed(self) -> bool:
        return self._terminated

    @property
    def closing(self) -> bool:
        return self._terminated or self._connection.closed

    @property
    def last_received(self) -> float:
        """When we last heard from the peer: an event, or bytes counted by picoquic (the ACK
        of a keep-alive PING raises no event)."""
        heard = self._connection.bytes_received
        if heard != self._heard_bytes:
            self._heard_bytes = heard
            self._last_received = self._event_loop.time()
        return self._last_received

    def transmit(self) -> None:
        """picoquic sends on its own; what is left here is moving refused writes on."""
        self._transmit_handle = None
        self._connection.flush()
        if self._connection.waiting() and self._pump is None and not self.closing:
            self._pump = asyncio.ensure_future(self._pump_waiting())

    def transmit_soon(self) -> None:
        if self._transmit_handle is None:
            self._transmit_handle = self._event_loop.call_soon(self.transmit)

    async def drain(self) -> None:
        """Wait until the unsent backlog is under `max_send_backlog`; always yields once."""
        await asyncio.sleep(0)
        while True:
            if self.closing:
                raise ConnectionError("QUIC connection closed")
            self._connection.flush()
            if not self.backlogged():
                return
            await self._connection.progress()

    def backlogged(self) -> bool:
        return self._connection.send_backlog() > self._settings.max_send_backlog

    async def _pump_waiting(self) -> None:
        try:
            while self._connection.waiting() and not self.closing:
                await self._connection.progress()
                self._connection.flush()
        finally:
            self._pump = None


def send_backlog(connection: PquicConnection) -> int:
    return connection.send_backlog()
