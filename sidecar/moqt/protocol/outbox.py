"""What an origin has to write to one peer, in order: small items that refer to cached
payloads (no copies), and the object bytes they hold (see ``origin``'s docstring for
why it queues per peer and how it bounds the queue)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from .model import TrackObject

if TYPE_CHECKING:
    from .records import Downstream, DownstreamFetch


@dataclass(eq=False, slots=True)
class Send:
    """One object of a subscription."""

    sub: Downstream
    group_id: int
    obj: TrackObject

    @property
    def owner(self) -> Downstream:
        return self.sub

    @property
    def size(self) -> int:
        return self.obj.size


@dataclass(eq=False, slots=True)
class EndStream:
    """FIN (or reset) a subscription's subgroup stream once what precedes it is written."""

    sub: Downstream
    key: tuple[int, int]
    reset: bool
    size: ClassVar[int] = 0

    @property
    def owner(self) -> Downstream:
        return self.sub


@dataclass(eq=False, slots=True)
class Replay:
    """Cached groups of a subscription, read a group at a time from ``cursor``."""

    sub: Downstream
    cursor: int
    groups: deque[int] = field(default_factory=deque)
    size: ClassVar[int] = 0

    @property
    def owner(self) -> Downstream:
        return self.sub


@dataclass(eq=False, slots=True)
class Done:
    """PUBLISH_DONE, after everything queued before it."""

    sub: Downstream
    status: int
    reason: str
    size: ClassVar[int] = 0

    @property
    def owner(self) -> Downstream:
        return self.sub


@dataclass(eq=False, slots=True)
class FetchReplay:
    """A FETCH served from the cache, a group at a time."""

    fetch: DownstreamFetch
    groups: deque[int]
    size: ClassVar[int] = 0

    @property
    def owner(self) -> DownstreamFetch:
        return self.fetch


@dataclass(eq=False, slots=True)
class FetchSend:
    """One object of a FETCH forwarded from upstream."""

    fetch: DownstreamFetch
    group_id: int
    obj: TrackObject

    @property
    def owner(self) -> DownstreamFetch:
        return self.fetch

    @property
    def size(self) -> int:
        return self.obj.size


@dataclass(eq=False, slots=True)
class FetchEnd:
    """FIN (or reset) a FETCH's stream."""

    fetch: DownstreamFetch
    reset: bool
    size: ClassVar[int] = 0

    @property
    def owner(self) -> DownstreamFetch:
        return self.fetch


Item = Send | EndStream | Replay | Done | FetchReplay | FetchSend | FetchEnd


class Outbox:
    """A FIFO of items and the object bytes they hold."""

    def __init__(self) -> None:
        self._items: deque[Item] = deque()
        self.queued_bytes = 0

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items)

    def append(self, item: Item) -> None:
        self._items.append(item)
        self.queued_bytes += item.size

    def front(self) -> Item:
        return self._items[0]

    def done(self, item: Item) -> None:
        """``item`` is written: drop it, unless a purge while it ran took it already."""
        if self._items and self._items[0] is item:
            self._items.popleft()
            self.queued_bytes -= item.size

    def purge(self, owner: Downstream | DownstreamFetch) -> None:
        """Forget everything queued for one subscription or FETCH."""
        self._keep(lambda item: item.owner is not owner)

    def take_sends(self, sub: Downstream) -> list[Send]:
        """Remove and return the objects queued for ``sub`` (it will read the cache instead)."""
        sends = [item for item in self._items if isinstance(item, Send) and item.sub is sub]
        self._keep(lambda item: not (isinstance(item, Send) and item.sub is sub))
        return sends

    def clear(self) -> None:
        self._items.clear()
        self.queued_bytes = 0

    def _keep(self, keep: Callable[[Item], bool]) -> None:
        self._items = deque(item for item in self._items if keep(item))
        self.queued_bytes = sum(item.size for item in self._items)
