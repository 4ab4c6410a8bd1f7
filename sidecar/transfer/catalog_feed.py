"""The newest catalog of one prompt, kept current while its KV is loaded.

A publisher revises the catalog as prefill produces chunks (group id = chunks described), so
a subscriber that loads while prefill runs must hear every revision: it SUBSCRIBEs to the
`catalog` track (new revisions) and FETCHes the largest group it already holds (the current
one). Every revision comes from the network: it must name the prompt it was asked for, and
`Catalog.merge` refuses one that contradicts an earlier revision, which ends the feed (a
relay swapping digests mid-load must not get a say in what is verified next).

Where a relay refuses the FETCH (moq-rs serves only what it caches), the subscription alone
is used: such relays start a new subscriber at the group in progress.
"""

from __future__ import annotations

import asyncio
import contextlib

from sidecar.kvcache.catalog import Catalog, CatalogError
from sidecar.kvcache.naming import CATALOG_TRACK, PromptName
from sidecar.log import get_logger
from sidecar.moqt.api import MoqtApiError, RequestRefused, Session, Subscription
from sidecar.moqt.model import FullTrackName, Location, ObjectStatus

log = get_logger(__name__)


class CatalogFeed:
    """Revisions of one prompt's catalog, merged as they arrive; open with `CatalogFeed.open`."""

    def __init__(self, session: Session, prompt: PromptName, subscription: Subscription) -> None:
        self.prompt = prompt
        self.catalog: Catalog | None = None
        self.error: str | None = None
        """Why the feed stopped trusting the catalog track (a contradicting revision)."""
        self.ended = False
        """No more revisions will come: the track ended, the publisher left, or an error."""
        self.rejected_revisions = 0
        self._session = session
        self._subscription = subscription
        self._changed = asyncio.Event()
        self._task = asyncio.ensure_future(self._follow())

    @property
    def track(self) -> FullTrackName:
        return catalog_track(self.prompt)

    @classmethod
    async def open(cls, session: Session, prompt: PromptName) -> CatalogFeed:
        """Subscribe to the prompt's catalog and fetch its current revision.

        `RequestRefused` when the prompt is not published (nobody routes or caches it).
        """
        subscription = await session.subscribe(catalog_track(prompt))
        feed = cls(session, prompt, subscription)
        if subscription.largest is not None:
            try:
                await feed._fetch(subscription.largest.group)
            except BaseException:
                await feed.close()
                raise
        return feed

    async def wait_ready(self, chunks: int) -> Catalog | None:
        """The newest revision once it describes `chunks` chunks or the feed ends; bound the
        wait from outside (`asyncio.wait_for`)."""
        while not self.ended and (self.catalog is None or self.catalog.ready_chunks < chunks):
            self._changed.clear()
            await self._changed.wait()
        return self.catalog

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(MoqtApiError, ConnectionError):
            await self._subscription.unsubscribe()

    async def _fetch(self, group: int) -> None:
        try:
            stream = await self._session.fetch(self.track, Location(group, 0), group)
        except RequestRefused as exc:
            log.info("catalog_fetch_refused", prompt=self.prompt.prompt_id, reason=str(exc))
            return
        async for obj in stream:
            self._offer(obj.payload, obj.status)

    async def _follow(self) -> None:
        try:
            async for obj in self._subscription:
                self._offer(obj.payload, obj.status)
        except (MoqtApiError, ConnectionError) as exc:
            log.info("catalog_feed_lost", prompt=self.prompt.prompt_id, reason=str(exc))
        finally:
            self.ended = True
            self._changed.set()

    def _offer(self, payload: bytes, status: ObjectStatus) -> None:
        if status != ObjectStatus.NORMAL or self.error is not None:
            return
        try:
            revision = Catalog.decode(payload)
            if revision.name != self.prompt:
                raise CatalogError("catalog of another prompt")
        except CatalogError as exc:
            self.rejected_revisions += 1
            log.warning("catalog_revision_rejected", prompt=self.prompt.prompt_id, reason=str(exc))
            return
        try:
            self.catalog = revision if self.catalog is None else self.catalog.merge(revision)
        except CatalogError as exc:
            self.error = str(exc)
            self.ended = True
        self._changed.set()


def catalog_track(prompt: PromptName) -> FullTrackName:
    return FullTrackName(prompt.namespace(), CATALOG_TRACK.encode())


class CatalogFeeds:
    """The catalog feeds open on one session, shared by every lookup and load that needs one.

    Draft-14 allows one subscription per track and session, and concurrent users of one
    prompt are normal (a lookup during a load, two requests with one system prompt): they
    share the feed, which closes when the last of them releases it.
    """

    def __init__(self, session: Session) -> None:
        self._session = session
        self._opening: dict[PromptName, asyncio.Task[CatalogFeed]] = {}
        self._users: dict[PromptName, int] = {}
        self._closing: set[asyncio.Task[None]] = set()

    async def acquire(self, prompt: PromptName) -> CatalogFeed:
        """The prompt's feed, opened on first use; `RequestRefused` if it is not published."""
        task = self._opening.get(prompt)
        if task is None:
            task = self._opening[prompt] = asyncio.ensure_future(
                CatalogFeed.open(self._session, prompt)
            )
        self._users[prompt] = self._users.get(prompt, 0) + 1
        try:
            return await asyncio.shield(task)
        except BaseException:
            if self._last_user_gone(prompt):
                task.add_done_callback(self._close_unused)
            raise

    async def release(self, feed: CatalogFeed) -> None:
        if self._last_user_gone(feed.prompt):
            await feed.close()

    def _last_user_gone(self, prompt: PromptName) -> bool:
        self._users[prompt] -= 1
        if self._users[prompt]:
            return False
        del self._users[prompt]
        del self._opening[prompt]
        return True

    def _close_unused(self, task: asyncio.Task[CatalogFeed]) -> None:
        """Every user left while the feed was opening: close it once it is open."""
        if not task.cancelled() and task.exception() is None:
            closing = asyncio.ensure_future(task.result().close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
