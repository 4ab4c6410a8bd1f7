"""Request ids, both ways: the ids this side may use (the peer's MAX_REQUEST_ID) and the
ids it lets the peer use (its own MAX_REQUEST_ID, granted back as requests finish).

Kept apart from the session because the rule is draft-specific (draft 14 numbers requests by
side parity and bounds them with MAX_REQUEST_ID; later drafts change how credit is given)
and because it is all arithmetic: the session sends the messages this record asks for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ProtocolError, RequestLimitReached, SessionErrorCode


@dataclass(slots=True)
class RequestIds:
    """Ids are even for a client's requests and odd for a server's; each side's ids rise by
    two. The peer may have ``window`` requests open at once: credit returns as they finish,
    granted in steps of half a window so that MAX_REQUEST_ID is not sent for each one."""

    is_client: bool
    window: int
    in_order: bool = True
    """Whether the peer's requests arrive in the order of their ids: they do on one control
    stream (draft 14); where some come on streams of their own (draft 16's namespace
    subscriptions) one may overtake another, so ids are taken in any order, each once."""
    credit: bool = True
    """Whether MAX_REQUEST_ID bounds the requests each way (until draft 18, whose QUIC
    stream limits bound them instead: then ours are unbounded here, and the peer's may run
    at most a window ahead of the oldest it has not used, which bounds what is kept)."""
    next_ours: int = field(init=False)
    limit: int = 0
    """Ours must be below this (the peer's SETUP, then its MAX_REQUEST_ID)."""
    granted: int = field(init=False)
    """The peer's must be below this (our SETUP, then our MAX_REQUEST_ID)."""
    _peer_first: int = field(init=False)
    _peer_next: int = field(init=False)
    _peer_finished: int = 0
    _blocked_at: int | None = None
    _peer_ahead: set[int] = field(default_factory=set)
    """Ids taken past `_peer_next` out of order (below `granted`, so at most a window)."""

    def __post_init__(self) -> None:
        self.next_ours = 0 if self.is_client else 1
        self._peer_first = self._peer_next = 1 if self.is_client else 0
        self.granted = self._limit_for(self.window)

    # Ours.

    def take(self) -> int:
        """The id the next request will take; RequestLimitReached at the peer's limit. The
        id is spent by ``spent``, once the request is sent, so a request refused locally
        never leaves a gap the peer would see as INVALID_REQUEST_ID."""
        if self.credit and self.next_ours >= self.limit:
            raise RequestLimitReached(f"peer allows request ids below {self.limit}")
        return self.next_ours

    def spent(self) -> None:
        self.next_ours += 2

    def blocked(self) -> int | None:
        """At the peer's limit: the limit to report in REQUESTS_BLOCKED, once per limit."""
        if not self.credit or self.next_ours < self.limit or self._blocked_at == self.limit:
            return None
        self._blocked_at = self.limit
        return self.limit

    def made(self, request_id: int) -> bool:
        """Whether this side has sent a request with this id (ids alternate by side)."""
        return request_id < self.next_ours and request_id % 2 == self.next_ours % 2

    def raise_limit(self, limit: int) -> None:
        """The peer's MAX_REQUEST_ID: it may only grow."""
        if limit <= self.limit:
            raise ProtocolError(f"MAX_REQUEST_ID {limit} does not exceed {self.limit}")
        self.limit = limit

    # The peer's.

    def accept_peer(self, request_id: int) -> None:
        """The id of a request the peer sent: the next of its side (or, out of order, one
        of its side not used before), under our limit."""
        if self.in_order and request_id != self._peer_next:
            raise ProtocolError(
                f"request id {request_id}, expected {self._peer_next}",
                SessionErrorCode.INVALID_REQUEST_ID,
            )
        if request_id % 2 != self._peer_first % 2 or request_id < self._peer_next:
            raise ProtocolError(
                f"request id {request_id} is not the peer's, or was used",
                SessionErrorCode.INVALID_REQUEST_ID,
            )
        if not self.credit and request_id >= self._peer_next + 2 * self.window:
            raise ProtocolError(
                f"request id {request_id} is more than {self.window} past the oldest unused",
                SessionErrorCode.INVALID_REQUEST_ID,
            )
        if self.credit and request_id >= self.granted:
            raise ProtocolError(
                f"request id {request_id} at or above the limit {self.granted}",
                SessionErrorCode.TOO_MANY_REQUESTS,
            )
        if request_id in self._peer_ahead:
            raise ProtocolError(
                f"request id {request_id} used twice", SessionErrorCode.INVALID_REQUEST_ID
            )
        self._peer_ahead.add(request_id)
        while self._peer_next in self._peer_ahead:
            self._peer_ahead.discard(self._peer_next)
            self._peer_next += 2

    def peer_finished(self) -> int | None:
        """One of the peer's requests is over: the MAX_REQUEST_ID to send now, if any."""
        self._peer_finished += 1
        if not self.credit:
            return None
        limit = self._limit_for(self._peer_finished + self.window)
        if limit - self.granted < max(2, self.window):  # ids step by two: window ids = half
            return None
        self.granted = limit
        return limit

    def _limit_for(self, requests: int) -> int:
        """The MAX_REQUEST_ID value that lets the peer make ``requests`` requests in all."""
        return self._peer_first + 2 * requests
