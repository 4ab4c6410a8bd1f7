"""Which peer publishes which namespace: where the relay sends a request for a track.

Kept apart from the relay's session handling so the routing rules (longest matching prefix
wins; the newest publisher of a namespace wins; a namespace is gone only when its last
publisher is) are plain data, generic over whatever the relay uses to name a peer. Who
follows which prefix is the origin's (``protocol.origin.Followers``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

from ..protocol.model import has_prefix
from ..protocol.records import Namespace

P = TypeVar("P", bound=Hashable)


class RoutingLimitExceeded(Exception):
    """Peers asked the relay to remember more namespaces than it allows."""


class NamespaceTable(Generic[P]):
    def __init__(self, max_namespaces: int) -> None:
        self.max_namespaces = max_namespaces
        self._publishers: dict[Namespace, list[P]] = {}

    def add_publisher(self, namespace: Namespace, peer: P) -> bool:
        """Record ``peer`` as a publisher of ``namespace``; True if the namespace is new."""
        peers = self._publishers.get(namespace)
        if peers is None:
            if len(self._publishers) >= self.max_namespaces:
                raise RoutingLimitExceeded(f"the relay holds {self.max_namespaces} namespaces")
            self._publishers[namespace] = [peer]
            return True
        if peer in peers:
            peers.remove(peer)
        peers.append(peer)
        return False

    def remove_publisher(self, namespace: Namespace, peer: P) -> bool:
        """Forget that ``peer`` publishes ``namespace``; True if nobody publishes it any more."""
        peers = self._publishers.get(namespace)
        if peers is None or peer not in peers:
            return False
        peers.remove(peer)
        if peers:
            return False
        del self._publishers[namespace]
        return True

    def route(self, namespace: Namespace) -> P | None:
        """The newest publisher of the longest published prefix of ``namespace``."""
        for length in range(len(namespace), 0, -1):
            peers = self._publishers.get(namespace[:length])
            if peers:
                return peers[-1]
        return None

    def publishers(self, namespace: Namespace) -> list[P]:
        return list(self._publishers.get(namespace, ()))

    def published_under(self, prefix: Namespace) -> list[Namespace]:
        return [ns for ns in self._publishers if has_prefix(ns, prefix)]

    def published_by(self, peer: P) -> list[Namespace]:
        return [ns for ns, peers in self._publishers.items() if peer in peers]

    def remove_peer(self, peer: P) -> list[Namespace]:
        """Forget what ``peer`` publishes; returns the namespaces nobody publishes any more."""
        return [ns for ns in self.published_by(peer) if self.remove_publisher(ns, peer)]
