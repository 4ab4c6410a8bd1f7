"""The newest catalog of one prompt, kept current while its KV is loaded.

A publisher revises the catalog as prefill produces chunks (group id = chunks described), so
a subscriber that loads while prefill runs must hear every revision: it SUBSCRIBEs to the
`catalog` track (new revisions) and FETCHes the largest group it already holds (the current
one). Every revision comes from the network: it must name the prompt it was asked for, and
`Catalog.merge` refuses one that contradicts an earlier revision, which ends the feed (a
relay swapping digests mid-load must not get a say in what is verified next). A subscriber
with trusted keys (`CatalogTrust`) takes only signed revisions, and one that fails the check
ends the feed too: whoever sent it may send the next. Every refusal is counted
(`CatalogTrust.on_refusal`).

Where a relay refuses the FETCH (moq-rs serves only what it caches), the subscription alone
is used: such relays start a new subscriber at the group in progress.

`PublishedPrompts` reads catalogs with no load in view: those of the prompts a relay
announces under a model's prefix, so that the prefix index knows prompts that no query's own
links name (a longer prompt sharing the query's first chunks).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from dataclasses import dataclass

from sidecar.kvcache.catalog import Catalog, CatalogError
from sidecar.kvcache.naming import CATALOG_TRACK, NamingError, PromptName, namespace_prefix
from sidecar.kvcache.prefix_index import ChunkSizeLimitError, PrefixIndex
from sidecar.kvcache.signing import TRUST_THE_RELAY, CatalogSignatureError, CatalogTrust, Refusal
from sidecar.log import get_logger
from sidecar.moqt.aio.api import Announcement, MoqtApiError, RequestRefused, Session, Subscription
from sidecar.moqt.protocol.model import FullTrackName, Location, ObjectStatus

log = get_logger(__name__)

MAX_ANNOUNCED = 4096
"""Announced prompts one subscriber keeps track of, the oldest forgotten first. Each costs a
catalog read when announced and a few bytes after; the links go to the `PrefixIndex`,
which has a cap of its own."""
MAX_CATALOG_READS = 4
"""Catalogs of announced prompts read at once (a SUBSCRIBE and a FETCH each): a burst of
announcements, such as the relay's list right after SUBSCRIBE_NAMESPACE, queues behind
these instead of competing with loads for the relay."""
MAX_FOLLOWED_MODELS = 16
"""Model prefixes one session follows; our relay lets a peer follow 64 prefixes."""
CATALOG_READ_TIMEOUT = 5.0
"""A catalog read that has brought no revision by then is given up (a silent publisher)."""
CATCH_UP_S = 0.5
"""How long a model's first lookup waits for the relay's list of its prompts and their
catalogs (`PublishedPrompts.caught_up`); past it the lookup probes the query's links, and
the reads go on in the background."""


class CatalogFeed:
    """Revisions of one prompt's catalog, merged as they arrive; open with `CatalogFeed.open`."""

    def __init__(
        self,
        session: Session,
        prompt: PromptName,
        subscription: Subscription,
        trust: CatalogTrust,
    ) -> None:
        self.prompt = prompt
        self.catalog: Catalog | None = None
        self.error: str | None = None
        """Why the feed stopped trusting the catalog track (a contradicting revision, or one
        whose signature does not pass)."""
        self.ended = False
        """No more revisions will come: the track ended, the publisher left, or an error."""
        self._trust = trust
        self._session = session
        self._subscription = subscription
        self._changed = asyncio.Event()
        self._task = asyncio.ensure_future(self._follow())

    @property
    def track(self) -> FullTrackName:
        return catalog_track(self.prompt)

    @classmethod
    async def open(
        cls, session: Session, prompt: PromptName, trust: CatalogTrust = TRUST_THE_RELAY
    ) -> CatalogFeed:
        """Subscribe to the prompt's catalog and fetch its current revision.

        `RequestRefused` when the prompt is not published (nobody routes or caches it).
        """
        subscription = await session.subscribe(catalog_track(prompt))
        feed = cls(session, prompt, subscription, trust)
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
            revision = Catalog.decode(self._trust.open(payload))
            if revision.name != self.prompt:
                self._refuse(Refusal.WRONG_PROMPT, "catalog of another prompt")
                return
        except CatalogSignatureError as exc:
            self._refuse(exc.refusal, str(exc), final=True)
            return
        except CatalogError as exc:
            self._refuse(Refusal.MALFORMED, str(exc))
            return
        try:
            self.catalog = revision if self.catalog is None else self.catalog.merge(revision)
        except CatalogError as exc:
            self._refuse(Refusal.CONTRADICTION, str(exc), final=True)
            return
        self._changed.set()

    def _refuse(self, refusal: Refusal, reason: str, *, final: bool = False) -> None:
        """Count and log a refused revision; `final`: trust nothing more on this track."""
        self._trust.on_refusal(refusal)
        log.warning(
            "catalog_revision_rejected",
            prompt=self.prompt.prompt_id,
            refusal=refusal.value,
            reason=reason,
        )
        if final:
            self.error = reason
            self.ended = True
            self._changed.set()


def catalog_track(prompt: PromptName) -> FullTrackName:
    return FullTrackName(prompt.namespace(), CATALOG_TRACK.encode())


@dataclass
class _SharedFeed:
    """One prompt's feed on a session, from its SUBSCRIBE until its UNSUBSCRIBE went out."""

    opening: asyncio.Task[CatalogFeed]
    users: int = 0
    closing: asyncio.Task[None] | None = None
    """Set when the last user left; the feed is gone (and may be opened again) once it ends."""


class CatalogFeeds:
    """The catalog feeds open on one session, shared by every lookup and load that needs one.

    Draft-14 allows one subscription per track and session, and concurrent users of one
    prompt are normal (a lookup during a load, two requests with one system prompt): they
    share the feed, which closes when the last of them releases it. Closing takes a turn of
    the event loop or two (a feed whose users all left while it was opening withdraws its
    SUBSCRIBE first), and the track stays taken until then: the next user of the prompt
    waits for that instead of subscribing twice.
    """

    def __init__(self, session: Session, trust: CatalogTrust = TRUST_THE_RELAY) -> None:
        self._session = session
        self._trust = trust
        self._feeds: dict[PromptName, _SharedFeed] = {}

    async def acquire(self, prompt: PromptName) -> CatalogFeed:
        """The prompt's feed, opened on first use; `RequestRefused` if it is not published."""
        while (shared := self._feeds.get(prompt)) is not None and shared.closing is not None:
            await asyncio.shield(shared.closing)
        if shared is None:
            opening = asyncio.ensure_future(CatalogFeed.open(self._session, prompt, self._trust))
            shared = self._feeds[prompt] = _SharedFeed(opening)
        shared.users += 1
        try:
            return await asyncio.shield(shared.opening)
        except BaseException:
            self._leave(prompt, shared)
            raise

    async def release(self, feed: CatalogFeed) -> None:
        shared = self._feeds[feed.prompt]
        self._leave(feed.prompt, shared)
        if shared.closing is not None:
            await asyncio.shield(shared.closing)

    async def newest(self, prompt: PromptName, timeout: float) -> Catalog | None:
        """The prompt's newest catalog, or None if no revision comes within `timeout` seconds
        (a silent publisher); `RequestRefused` if it is not published."""
        feed = await self.acquire(prompt)
        try:
            return await asyncio.wait_for(feed.wait_ready(0), timeout)
        except TimeoutError:
            return None
        finally:
            await self.release(feed)

    def _leave(self, prompt: PromptName, shared: _SharedFeed) -> None:
        shared.users -= 1
        if not shared.users:
            shared.closing = asyncio.ensure_future(self._close(prompt, shared))

    async def _close(self, prompt: PromptName, shared: _SharedFeed) -> None:
        opening = shared.opening
        opening.cancel()  # no one waits for it: a SUBSCRIBE still unanswered is withdrawn
        try:
            await asyncio.wait([opening])
            if not opening.cancelled() and opening.exception() is None:
                await opening.result().close()
        finally:
            del self._feeds[prompt]


class PublishedPrompts:
    """The prompts a relay announces under each followed model's prefix, read into an index.

    `follow(model)` sends SUBSCRIBE_NAMESPACE for `("kvcache.moq.arpa/v1", model)`; the relay
    answers with every prompt already published, then each one published or withdrawn. The
    catalog of each announced prompt is read once, a few at a time, and its links go into
    the `PrefixIndex`: the first revision already carries every link, so the read stops
    there. A withdrawal (PUBLISH_NAMESPACE_DONE, which the relay also sends when the
    publisher's session ends) leaves the prompt in the index but no longer vouched for: a
    relay keeps serving what it caches of a prompt whose publisher left (a prefill pod
    restarts, or evicts what it published), so lookups probe it, and say it is withdrawn.

    A relay that refuses the subscription (or never answers it) is only logged: the
    subscriber then finds prompts by probing the query's links, as it always can.
    """

    def __init__(
        self,
        session: Session,
        feeds: CatalogFeeds,
        index: PrefixIndex,
        *,
        max_prompts: int = MAX_ANNOUNCED,
    ) -> None:
        """`feeds` are the subscriber's own: a catalog read and a lookup of the same prompt
        share one subscription (draft-14 allows one per track and session)."""
        if max_prompts < 1:
            raise ValueError("max_prompts must be at least 1")
        self._session = session
        self._feeds = feeds
        self._index = index
        self._max_prompts = max_prompts
        self._complete: OrderedDict[PromptName, bool] = OrderedDict()
        """Announced and not withdrawn, oldest first: whether the catalog read was complete."""
        self._unread: OrderedDict[PromptName, None] = OrderedDict()
        """Tracked prompts whose catalog is still to be read, oldest first."""
        self._withdrawn: OrderedDict[PromptName, None] = OrderedDict()
        """Withdrawn and not announced again, the newest `max_prompts` of them."""
        self._reading: dict[PromptName, asyncio.Task[None]] = {}
        self._followed: dict[str, asyncio.Task[None]] = {}
        """Every model asked for, once per session: a relay that refused is not asked again."""
        self._caught_up: dict[str, asyncio.Event] = {}
        """Per model followed: set once the relay's answer, with the prompts published before
        it, was heard and their catalogs read (or the relay refused)."""

    def __len__(self) -> int:
        return len(self._complete)

    def __contains__(self, prompt: object) -> bool:
        return prompt in self._complete

    def follow(self, model: str) -> None:
        """Start hearing of `model`'s prompts, unless already done or too many models are;
        `NamingError` for a model name no namespace can hold."""
        if model not in self._followed and len(self._followed) < MAX_FOLLOWED_MODELS:
            prefix = namespace_prefix(model)
            self._caught_up[model] = asyncio.Event()
            self._followed[model] = asyncio.ensure_future(self._follow(model, prefix))

    async def caught_up(self, model: str, timeout: float = CATCH_UP_S) -> None:
        """Wait, up to `timeout`, until what the relay published of `model` before it was
        followed is in the index: the first lookup of a model on a fresh session would
        otherwise find only what the query's links name, and miss a prompt whose last chunk
        the query extends. Returns at once for a model not followed."""
        event = self._caught_up.get(model)
        if event is not None and not event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)

    def vouches_for(self, prompt: PromptName) -> bool:
        """Whether the relay announces `prompt` now and its catalog, when read, described
        every chunk: a lookup may then report it whole without asking the relay again."""
        return self._complete.get(prompt, False)

    def seen(self, catalog: Catalog) -> None:
        """A catalog was read, here or by a lookup's probe: its prompt, if announced now, is
        vouched for once a revision describes every chunk. Prompts are announced before
        prefill ends, so the background read usually sees an incomplete catalog, and the
        first lookup after prefill confirms it."""
        if catalog.name in self._complete:
            self._complete[catalog.name] = catalog.complete

    def withdrawn(self, prompt: PromptName) -> bool:
        """Whether the relay withdrew `prompt` (and has not announced it again): what it
        holds of it is all there is."""
        return prompt in self._withdrawn

    async def _follow(self, model: str, prefix: tuple[bytes, bytes]) -> None:
        caught_up = self._caught_up[model]
        try:
            announcements = await self._session.subscribe_namespace(prefix)
        except (MoqtApiError, ConnectionError, TimeoutError) as exc:
            log.info("announcements_unavailable", model=model, reason=str(exc) or repr(exc))
            caught_up.set()
            return
        try:
            # The relay lists what it holds with its answer: read those catalogs first.
            listed = announcements.take_ready()
            for announcement in listed:
                self._heard(announcement)
            await self._read_all({a.namespace for a in listed})
            caught_up.set()
            async for announcement in announcements:
                self._heard(announcement)
        except (MoqtApiError, ConnectionError) as exc:
            log.info("announcements_lost", model=model, reason=str(exc))
        finally:
            caught_up.set()
            self._forget(model)

    async def _read_all(self, namespaces: set[tuple[bytes, ...]]) -> None:
        """Until no prompt of `namespaces` has its catalog read still to come."""

        def pending() -> bool:
            return any(p.namespace() in namespaces for p in (*self._reading, *self._unread))

        while self._reading and pending():
            await asyncio.wait(list(self._reading.values()), return_when=asyncio.FIRST_COMPLETED)

    def _heard(self, announcement: Announcement) -> None:
        try:
            prompt = PromptName.from_namespace(announcement.namespace)
        except NamingError:
            return  # under the model's prefix, yet no prompt's namespace: not ours to index
        if not announcement.published:
            self._drop(prompt)
            self._withdrawn[prompt] = None
            if len(self._withdrawn) > self._max_prompts:
                self._withdrawn.popitem(last=False)
        elif prompt not in self._complete:
            self._withdrawn.pop(prompt, None)
            self._complete[prompt] = False
            if prompt not in self._reading:
                self._unread[prompt] = None
            while len(self._complete) > self._max_prompts:
                self._drop(next(iter(self._complete)))
            self._read_next()

    def _drop(self, prompt: PromptName) -> None:
        """Stop tracking a prompt; a read in flight for it then indexes nothing."""
        self._complete.pop(prompt, None)
        self._unread.pop(prompt, None)

    def _forget(self, model: str) -> None:
        """The model's announcements stopped: no withdrawal (nor announcement) will be heard,
        so none of its prompts is vouched for, nor ruled out, any more (the index keeps them;
        lookups probe them)."""
        for prompt in [p for p in self._complete if p.model == model]:
            self._drop(prompt)
        for prompt in [p for p in self._withdrawn if p.model == model]:
            del self._withdrawn[prompt]

    def _read_next(self) -> None:
        while self._unread and len(self._reading) < MAX_CATALOG_READS:
            prompt, _ = self._unread.popitem(last=False)
            task = self._reading[prompt] = asyncio.ensure_future(self._read(prompt))
            task.add_done_callback(lambda task, done=prompt: self._read_done(done, task))

    def _read_done(self, prompt: PromptName, task: asyncio.Task[None]) -> None:
        del self._reading[prompt]
        if not task.cancelled():  # cancelled: the event loop is closing, start nothing
            self._read_next()

    async def _read(self, prompt: PromptName) -> None:
        try:
            catalog = await self._feeds.newest(prompt, CATALOG_READ_TIMEOUT)
        except (MoqtApiError, ConnectionError, TimeoutError) as exc:
            log.info("announced_catalog_unread", prompt=prompt.prompt_id, reason=str(exc))
            return
        if catalog is None or prompt not in self._complete:
            return
        try:
            self._index.add_catalog(catalog)
        except ChunkSizeLimitError as exc:
            log.info("catalog_not_indexed", prompt=prompt.prompt_id, reason=str(exc))
            return
        self.seen(catalog)
