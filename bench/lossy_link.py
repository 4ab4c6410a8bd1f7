"""A UDP forwarder that drops, delays and paces datagrams: a lossy, slow link without netem.

This kernel has no netem qdisc, and `tc tbf` (bench/netns.py) only limits a rate, so loss and
delay come from a process between the peers: it listens on one UDP port and forwards every
datagram to the target and back, each direction on its own, dropping a datagram with
probability `loss` and holding each one for a delay drawn uniformly from `delay`, in order:
a datagram never overtakes an earlier one in its direction, as through the FIFO queues of a
real path (per-datagram jitter that reorders makes QUIC take reordering for loss, and
measures that instead). With a `rate`, each direction is also a link of that rate: a
datagram leaves once the ones before it have, and is dropped when it would wait longer than
`QUEUE_S` (the queue bench/netns.py gives `tc tbf`, a switch buffer; tbf needs a network
namespace and root, this needs neither). Each client address gets its own socket to the target, so the target
sees one peer per client. A seeded random generator
makes a run repeatable for the same order of arrivals.

    python -m bench.lossy_link --listen 127.0.0.1:5000 --target 127.0.0.1:4443 \\
        --loss 0.05 --delay-ms 20-50 --rate 20mbit

It prints one JSON line once it listens (`{"event": "listening", "port": ...}`) and, on
SIGTERM, one with what it forwarded and dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
from dataclasses import dataclass, field
from typing import Any, cast

from bench.netns import QUEUE_S, LinkLimit

MAX_CLIENTS = 64
"""Client addresses served at once; a test or bench has a handful."""
MAX_PENDING = 64
"""Datagrams of a new client held while its socket to the target opens (microseconds)."""


@dataclass(frozen=True, slots=True)
class Impairment:
    loss: float
    """Probability that a datagram is dropped, each direction."""
    delay: tuple[float, float]
    """Seconds each datagram is held, uniform in [low, high]."""
    rate: float | None = None
    """Bytes per second each direction carries; None: as fast as the forwarder goes."""

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss must be in [0, 1), got {self.loss}")
        low, high = self.delay
        if not 0 <= low <= high:
            raise ValueError(f"delay must be 0 <= low <= high, got {self.delay}")


@dataclass(slots=True)
class Counts:
    forwarded: int = 0
    dropped: int = 0


@dataclass(eq=False)
class _Side(asyncio.DatagramProtocol):
    """One socket of the forwarder: what arrives on it goes, impaired, to `send`."""

    link: LossyLink
    send: Any = None
    """Called with each datagram (and the address it came from) that survives."""
    transport: asyncio.DatagramTransport | None = field(default=None, init=False)
    pending: list[bytes] = field(default_factory=list, init=False)
    """To the target, while this client's socket opens."""
    last_due: float = field(default=0.0, init=False)
    """When the latest datagram through this side is delivered: later ones wait for it."""
    link_free: float = field(default=0.0, init=False)
    """When the rate-limited link has sent everything queued on it."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)
        for data in self.pending:
            self.transport.sendto(data)
        self.pending.clear()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.link.impair(self, len(data), lambda: self.send(data, addr))


class LossyLink:
    """The forwarder; `start` binds it, `close` stops it."""

    def __init__(self, target: tuple[str, int], impairment: Impairment, *, seed: int = 0) -> None:
        self.target = target
        self.impairment = impairment
        self.counts = Counts()
        self._random = random.Random(seed)
        self._front: _Side | None = None
        self._clients: dict[tuple[str, int], _Side] = {}
        self._loop = asyncio.get_running_loop()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on host:port; the port bound."""
        _, front = await self._loop.create_datagram_endpoint(
            lambda: _Side(self, self._to_target), local_addr=(host, port)
        )
        self._front = front
        assert front.transport is not None
        return int(front.transport.get_extra_info("sockname")[1])

    def impair(self, side: _Side, size: int, deliver: Any) -> None:
        now = self._loop.time()
        sent = now
        rate = self.impairment.rate
        if rate is not None:
            start = max(now, side.link_free)
            if start - now > QUEUE_S:
                self.counts.dropped += 1  # the queue is full: tail drop
                return
            sent = side.link_free = start + size / rate
        if self._random.random() < self.impairment.loss:
            self.counts.dropped += 1
            return
        self.counts.forwarded += 1
        low, high = self.impairment.delay
        # A microsecond after the one before: asyncio runs timers due at the same time in
        # no set order.
        due = max(sent + self._random.uniform(low, high), side.last_due + 1e-6)
        side.last_due = due
        if due > now:
            self._loop.call_at(due, deliver)
        else:
            deliver()

    def _to_target(self, data: bytes, client: tuple[str, int]) -> None:
        side = self._clients.get(client)
        if side is None:
            if len(self._clients) >= MAX_CLIENTS:
                return
            side = self._clients[client] = _Side(self, lambda d, _a: self._to_client(d, client))
            self._loop.create_task(self._connect(side))
        if side.transport is None:
            if len(side.pending) < MAX_PENDING:
                side.pending.append(data)
        else:
            side.transport.sendto(data)

    async def _connect(self, side: _Side) -> None:
        await self._loop.create_datagram_endpoint(lambda: side, remote_addr=self.target)

    def _to_client(self, data: bytes, client: tuple[str, int]) -> None:
        if self._front is not None and self._front.transport is not None:
            self._front.transport.sendto(data, client)

    def close(self) -> None:
        for side in (self._front, *self._clients.values()):
            if side is not None and side.transport is not None:
                side.transport.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def _delay(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    return float(low) / 1000, float(high or low) / 1000


async def _serve(args: argparse.Namespace) -> None:
    rate = None if args.rate is None else args.rate.bits_per_second / 8
    link = LossyLink(args.target, Impairment(args.loss, args.delay_ms, rate), seed=args.seed)
    host, port = args.listen
    bound = await link.start(host, port)
    print(json.dumps({"event": "listening", "port": bound}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    link.close()
    counts = link.counts
    print(json.dumps({"event": "stopped", "forwarded": counts.forwarded,
                      "dropped": counts.dropped}), flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_address, default=("127.0.0.1", 0), metavar="HOST:PORT")
    parser.add_argument("--target", type=_address, required=True, metavar="HOST:PORT")
    parser.add_argument("--loss", type=float, default=0.0, help="drop probability (0..1)")
    parser.add_argument(
        "--delay-ms", type=_delay, default=(0.0, 0.0), metavar="LOW[-HIGH]",
        help="delay per datagram, uniform in [LOW, HIGH] milliseconds",
    )  # fmt: skip
    parser.add_argument(
        "--rate", type=LinkLimit.parse, metavar="RATE",
        help="each direction's link rate, as tc writes it (20mbit, 1gbit); default: unlimited",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
