"""Sessions served by a sans-I/O origin (or relay) in memory: each client a real MoQT session
over real QUIC (``quic_pair.SessionPair``), whose server side is a peer of the origin."""

from __future__ import annotations

from typing import TypeVar

from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol.drafts import DRAFT_14, Draft
from sidecar.moqt.protocol.origin import Origin
from sidecar.moqt.protocol.records import Peer
from sidecar.moqt.protocol.session import MoqtSession
from tests.support.quic_pair import SessionPair

T = TypeVar("T")


class MemoryLink:
    """A connection with room to spare: the pair's pump carries what the session wrote."""

    def backlogged(self) -> bool:
        return False

    def closing(self) -> bool:
        return False

    def transmit(self) -> None:
        pass

    def wake_when_drained(self) -> None:
        raise AssertionError("a memory link never fills")


class Served:
    """``clients`` sessions whose server sides are peers of ``origin``."""

    def __init__(self, origin: Origin, *, clients: int = 1, draft: Draft = DRAFT_14) -> None:
        self.origin = origin
        self.pairs = [SessionPair(draft=draft) for _ in range(clients)]
        self.peers: list[Peer] = [
            origin.add_peer(pair.sessions()[1], MemoryLink(), f"client {n}")
            for n, pair in enumerate(self.pairs)
        ]
        self.events: list[list[ev.MoqtEvent]] = [[] for _ in self.pairs]
        self.settle()

    def client(self, n: int = 0) -> MoqtSession:
        return self.pairs[n].sessions()[0]

    def run(self, client: int = 0) -> list[ev.MoqtEvent]:
        """`settle`; what client ``client`` got since it was last asked."""
        self.settle()
        got, self.events[client] = self.events[client], []
        return got

    def settle(self) -> None:
        """Move everything every way, the servers' events to the origin, until all is
        quiet; what the clients get waits in ``events``."""
        while True:
            handled = False
            for n, (pair, peer) in enumerate(zip(self.pairs, self.peers, strict=True)):
                pair.pump()
                for event in pair.take("server"):
                    self.origin.handle(peer, event)
                    handled = True
                self.events[n] += pair.take("client")
            self.origin.serving.transmit()
            if not handled:
                return


def of(events: list[ev.MoqtEvent], kind: type[T]) -> list[T]:
    return [e for e in events if isinstance(e, kind)]
