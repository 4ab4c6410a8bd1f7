"""SUBSCRIBEs held for a track that has no publisher yet (draft 18's RENDEZVOUS_TIMEOUT).

A subscriber may ask a relay to wait up to some milliseconds for a publisher of the track
it wants; when one appears in time the SUBSCRIBE goes on as if it had just come, and when
the time is up it is refused with TIMEOUT. A SUBSCRIBE that does not ask is refused at once
(DOES_NOT_EXIST), as before. Sans-I/O: the relay asks `due(now)` from its timer and
`met(namespace)` when a namespace gets a publisher.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from ..protocol.messages import Subscribe
from ..protocol.model import has_prefix
from ..protocol.records import Namespace, Peer

LONGEST_WAIT_S = 30.0
"""The longest a relay holds a SUBSCRIBE, whatever it asked (a relay may shorten it)."""


@dataclass(order=True, slots=True)
class Held:
    deadline: float
    peer: Peer = field(compare=False)
    message: Subscribe = field(compare=False)


class Rendezvous:
    """The held SUBSCRIBEs, earliest deadline first; at most `limit` at once."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._held: list[Held] = []

    def hold(self, peer: Peer, message: Subscribe, now: float) -> bool:
        """Hold `message` if it asked to wait and there is room; whether it is held."""
        wait_ms = message.parameters.rendezvous_timeout
        if not wait_ms or len(self._held) >= self._limit:
            return False
        deadline = now + min(wait_ms / 1000, LONGEST_WAIT_S)
        heapq.heappush(self._held, Held(deadline, peer, message))
        return True

    def next_deadline(self) -> float | None:
        return self._held[0].deadline if self._held else None

    def due(self, now: float) -> list[Held]:
        """The SUBSCRIBEs whose wait is over, taken out."""
        over = []
        while self._held and self._held[0].deadline <= now:
            over.append(heapq.heappop(self._held))
        return over

    def met(self, namespace: Namespace) -> list[Held]:
        """The SUBSCRIBEs for tracks under `namespace`, which now has a publisher, taken out."""
        return self._take(lambda held: has_prefix(held.message.track.namespace, namespace))

    def drop(self, peer: Peer, request_id: int | None = None) -> None:
        """Forget `peer`'s held SUBSCRIBE `request_id` (withdrawn), or all of them (it left)."""
        self._take(
            lambda held: (
                held.peer is peer and (request_id is None or held.message.request_id == request_id)
            )
        )

    def _take(self, chosen: Callable[[Held], bool]) -> list[Held]:
        taken = [held for held in self._held if chosen(held)]
        if taken:
            self._held = [held for held in self._held if not chosen(held)]
            heapq.heapify(self._held)
        return taken
