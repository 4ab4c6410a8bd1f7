"""The sidecar's MoQT session to its relay, kept up for as long as the process runs.

The relay is a separate process on another machine: it restarts, it is rolled, the link
drops. `RelayLink.run` connects, announces every prompt this sidecar publishes (so
subscribers are routed to it again), and when the session closes or the relay says GOAWAY
it reconnects after a jittered exponential backoff. While it is down (no `Connection`),
`subscriber` is None: lookups find nothing and loads end at once, so the model server
computes its tokens itself instead of waiting on a relay that may not come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sidecar.kvcache.prefix_index import PrefixIndex
from sidecar.kvcache.signing import TRUST_THE_RELAY, CatalogTrust
from sidecar.log import get_logger
from sidecar.moqt.aio import api
from sidecar.moqt.aio.api import MoqtApiError
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.moqt.protocol.errors import UsageError
from sidecar.transfer.adapt import ThroughputEstimate
from sidecar.transfer.publisher import KVPublisher
from sidecar.transfer.subscriber import KVSubscriber

log = get_logger(__name__)

RELAY_UNREACHABLE = "relay_unreachable"
"""The log event of a failed connection attempt (the link tries again with backoff)."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before reconnect attempt `n` (0-based): doubling from `initial` up to `maximum`,
    each drawn uniformly from its upper half so a fleet of sidecars does not reconnect in
    lockstep after a relay restart."""

    initial: float = 0.2
    maximum: float = 10.0

    def delay(self, attempt: int) -> float:
        ceiling = min(self.maximum, self.initial * 2 ** min(attempt, 32))
        return random.uniform(ceiling / 2, ceiling)


@dataclass(eq=False, slots=True)
class Connection:
    """The session the link is up on, the subscriber that loads through it, and the
    namespaces announced on it: made whole when the session opens, dropped when it ends."""

    session: api.Session
    subscriber: KVSubscriber
    announced: set[tuple[bytes, ...]] = field(default_factory=set)


class RelayLink:
    """One session at a time to the relay at `url`; `run()` keeps it up until cancelled."""

    def __init__(
        self,
        url: str,
        settings: QuicSettings,
        publisher: KVPublisher,
        *,
        chunk_size: int,
        backoff: Backoff = Backoff(),
        on_change: Callable[[bool, bool], Awaitable[None]] | None = None,
        token: Callable[[], str | None] = lambda: None,
        trust: CatalogTrust = TRUST_THE_RELAY,
    ) -> None:
        """`on_change(up, reconnect)` hears every session opened (reconnect: not the first
        one) and closed, for readiness, health and metrics; `token()` is the token each
        connection presents (read anew each time: a session closed for an expired token
        reconnects with the rotated one); `trust`: the keys catalogs must be signed with."""
        self.token = token
        self.trust = trust
        self.url = url
        self.settings = settings
        self.publisher = publisher
        self.chunk_size = chunk_size
        self.backoff = backoff
        self.index = PrefixIndex(prompt_key=publisher.prompt_key)
        """Catalog links seen, kept across sessions: a prompt outlives a reconnect."""
        self._throughput: ThroughputEstimate | None = None
        """The last session's measured throughput, which the next one starts from: the
        path to the relay outlives a reconnect more often than not."""
        self._track_throughput: dict[str, ThroughputEstimate] = {}
        """The same per track (what Lookup's estimate times chunks with)."""
        self._connection: Connection | None = None
        self._up = asyncio.Event()
        """Set while `_connection` is (`_connect`): what waiting for a session awaits."""
        self._on_change = on_change
        self._sessions = 0

    @property
    def up(self) -> bool:
        return self._connection is not None

    @property
    def subscriber(self) -> KVSubscriber | None:
        """The subscriber of the session the link is up on; None while it is down."""
        return None if self._connection is None else self._connection.subscriber

    async def subscriber_when_up(self) -> KVSubscriber:
        """The session's subscriber, once there is one (bound the wait from outside)."""
        while self._connection is None:
            await self._up.wait()
        return self._connection.subscriber

    def _connect(self, connection: Connection | None) -> None:
        self._connection = connection
        if connection is None:
            self._up.clear()
        else:
            self._up.set()

    async def run(self) -> None:
        attempt = 0
        while True:
            try:
                async with api.connect(
                    self.url, self.settings, publisher=self.publisher, token=self.token()
                ) as s:
                    await self._serve(s)
                    attempt = 0
            except (ConnectionError, MoqtApiError, OSError, TimeoutError) as exc:
                log.warning(RELAY_UNREACHABLE, url=self.url, error=str(exc), attempt=attempt)
            finally:
                if (gone := self._connection) is not None:
                    self._throughput = gone.subscriber.throughput
                    self._track_throughput = gone.subscriber.track_throughput
                    self._connect(None)
                    await self._changed(False, False)
            await asyncio.sleep(self.backoff.delay(attempt))
            attempt += 1

    async def _serve(self, session: api.Session) -> None:
        """Go up, announce what is published, and return once the session is over."""
        subscriber = KVSubscriber(
            session,
            chunk_size=self.chunk_size,
            index=self.index,
            throughput=self._throughput,
            track_throughput=self._track_throughput,
            trust=self.trust,
        )
        self._connect(Connection(session, subscriber))
        for namespace in sorted(self.publisher.namespaces):
            await self.announce(namespace)
        self._sessions += 1
        draft = session.connection.moqt.draft
        log.info("relay_connected", url=self.url, session=self._sessions, draft=draft.number)
        await self._changed(True, self._sessions > 1)
        connection = session.connection
        await asyncio.wait(
            [connection.closed, connection.goaway], return_when=asyncio.FIRST_COMPLETED
        )
        reason = "goaway" if connection.goaway.done() else "closed"
        log.warning("relay_session_over", url=self.url, reason=reason)

    async def _changed(self, up: bool, reconnect: bool) -> None:
        if self._on_change is not None:
            await self._on_change(up, reconnect)

    async def announce(self, namespace: tuple[bytes, ...]) -> None:
        """Route subscribers of `namespace` to this sidecar, once per session; a session
        opened later announces it by itself (`publisher.namespaces`)."""
        connection = self._connection
        if connection is None or namespace in connection.announced:
            return
        connection.announced.add(namespace)
        try:
            await connection.session.publish_namespace(namespace)
        except (ConnectionError, MoqtApiError, UsageError) as exc:
            # UsageError: the session ended before this link saw it; the next one announces
            # every published namespace, so a Publish must not fail for it.
            log.warning("announce_failed", error=str(exc))

    def withdraw(self, namespace: tuple[bytes, ...]) -> None:
        """Stop routing subscribers of `namespace` here (PUBLISH_NAMESPACE_DONE)."""
        connection = self._connection
        if connection is None or namespace not in connection.announced:
            return
        connection.announced.discard(namespace)
        if not connection.session.connection.closing:
            # The session may have dropped it already (the relay refused the announce).
            with contextlib.suppress(UsageError):
                connection.session.publish_namespace_done(namespace)
