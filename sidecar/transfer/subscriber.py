"""Find and load a prompt's KV cache over MoQT: prefix lookup, per-chunk track choice, checks.

`KVSubscriber` wraps one `moqt.aio.api.Session` (to a relay, or straight to a publisher):

* `lookup(model, token_ids)` says how many leading tokens some published prompt holds,
  without moving any KV. The prefix index (links of every catalog seen) names prompts that
  share leading chunks, longer ones included; the first lookup of a model makes it follow
  the model's announcements (`PublishedPrompts`) and waits a moment for the catalogs of
  those the relay lists, so it learns every catalog the relay announces, not only those a
  load read. The query's own hash-chain links name every prompt
  that would be a chunk-aligned prefix of it. Candidates are probed, most tokens first, by
  subscribing to their catalogs; the catalog of the best one that answers confirms how much
  it covers. Only when the index's best match is a prompt announced now whose catalog was
  complete, and no link of the query beyond it could name a longer one, does the lookup
  answer with no request at all.
* `load(model, token_ids, destination, deadline)` then fetches chunk after chunk, one FETCH
  per group (the only FETCH moq-rs accepts), choosing the track of each from the throughput
  measured over this subscriber's loads so the whole load meets the deadline
  (`transfer.adapt`). Each chunk is checked against the catalog's size and digest and
  decoded into a scratch tensor before a byte reaches the destination; a chunk that fails
  is reported, fetched again on the next track that fits, and never written. The result
  names exactly which tokens were loaded: the model server computes the others itself.

Chunks are loaded in order while prefill may still be running upstream: a chunk that the
catalog does not describe yet is waited for (live catalog revisions, `CatalogFeed`) until the
deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from sidecar.kvcache.catalog import Catalog, ChunkIntegrityError
from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.errors import KVCodecError
from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE, KVLayout
from sidecar.kvcache.naming import PromptName, chunk_count
from sidecar.kvcache.prefix_index import ChunkSizeLimitError, PrefixIndex, PrefixMatch
from sidecar.kvcache.signing import TRUST_THE_RELAY, CatalogTrust
from sidecar.log import get_logger
from sidecar.moqt.aio.api import FetchReset, FetchStream, MoqtApiError, RequestRefused, Session
from sidecar.moqt.protocol.model import FullTrackName, Location, ObjectStatus
from sidecar.transfer.adapt import (
    ThroughputEstimate,
    choose_track,
    chunk_sizes,
    load_seconds_estimate,
    paying_tracks,
)
from sidecar.transfer.catalog_feed import MAX_ANNOUNCED, CatalogFeed, CatalogFeeds, PublishedPrompts
from sidecar.transfer.track_quality import DEFAULT_CHOICE, TrackChoice, chunk_kl

log = get_logger(__name__)

CATALOG_WAIT = 1.0
"""Seconds `estimate` waits for the catalog it is made from when the lookup read none
(announcements vouched for the prompt); without it the estimate assumes fp16."""

KVSink = Callable[[range, torch.Tensor], None]
"""Receives each verified chunk: its token positions and KV `[L, 2, T, H, D]`."""

PROBE_BATCH = 16
"""Catalog SUBSCRIBEs in flight at once during a lookup (longest prefixes first)."""
LOOKUP_TIMEOUT = 5.0
"""A lookup that has found nothing by then reports nothing (a silent relay or publisher)."""


class StopReason(enum.Enum):
    """Why a load ended where it did."""

    COMPLETE = "complete"
    """Every available chunk was fetched (some may have been rejected)."""
    NOT_FOUND = "not found"
    """No published prompt shares a whole chunk with the query."""
    DEADLINE = "deadline"
    """The next chunk could not arrive before the deadline on any track."""
    PUBLISHER_GONE = "publisher gone"
    """The publisher left before every chunk the load wanted was described, or sent: the
    relay holds the next chunk on no track."""
    CATALOG_INVALID = "catalog invalid"
    """A catalog revision contradicted an earlier one: nothing more is trusted."""
    QUALITY_FLOOR = "quality floor"
    """The next chunk is on offer only on tracks outside the load's quality floor
    (`TrackChoice.max_kl`): it and every chunk after it are left to compute."""
    COMPUTE_FASTER = "compute faster"
    """The load's first chunk would arrive later than the model server computes its
    tokens, on every track the load may take: the whole load is left to compute."""
    RELAY_GONE = "relay gone"
    """The MoQT session the load ran on (to a relay, or to the publisher itself) closed or
    fell silent past its request timeout."""
    CANCELLED = "cancelled"
    """The caller cancelled the load (a sidecar shutting down): set by the caller, never
    returned by `KVSubscriber.load`. One enum, so a load's end has one vocabulary from the
    subscriber to the gRPC status and the metrics."""


def contiguous_spans(spans: Iterable[range]) -> tuple[range, ...]:
    """Token ranges as maximal contiguous ranges, in order (overlapping ones merge)."""
    joined: list[range] = []
    for span in sorted(spans, key=lambda s: s.start):
        if joined and joined[-1].stop >= span.start:
            joined[-1] = range(joined[-1].start, max(joined[-1].stop, span.stop))
        else:
            joined.append(span)
    return tuple(joined)


def leading_tokens(spans: Sequence[range]) -> int:
    """Tokens loaded from position 0 without a gap (`spans` as `contiguous_spans` gives
    them): what a model server can use as is."""
    return spans[0].stop if spans and spans[0].start == 0 else 0


@dataclass(frozen=True, slots=True)
class Availability:
    """What `lookup` found: the prompt to load from and how much of the query it covers."""

    prompt: PromptName | None
    tokens: int
    """Leading tokens of the query whose KV the prompt holds, once its prefill is done."""
    ready_tokens: int
    """Of those, the tokens already encoded and described by the catalog."""
    catalog: Catalog | None = field(default=None, compare=False, repr=False)
    """The newest revision the lookup read; None when it asked nothing (the announcements
    vouched for the prompt) or found nothing. `KVSubscriber.catalog` fetches one."""
    withdrawn: bool = False
    """This subscriber heard the relay withdraw the prompt (its publisher left or dropped
    it), which still serves it from its cache: groups it has evicted since will not load.
    A subscriber that started following the model after the withdrawal cannot tell."""


@dataclass(frozen=True, slots=True)
class LoadedChunk:
    index: int
    tokens: range
    track: str
    nbytes: int
    seconds: float
    kl: float
    """What this chunk costs the model's answer, as measured (`track_quality.chunk_kl`)."""


def expected_kl(chunks: Iterable[LoadedChunk]) -> float:
    """A load's expected KL: the worst of its chunks' (`track_quality`); 0 for none."""
    return max((chunk.kl for chunk in chunks), default=0.0)


@dataclass(frozen=True, slots=True)
class RejectedChunk:
    """A chunk that was fetched but not written: why, and on which track."""

    index: int
    tokens: range
    track: str
    reason: str


@dataclass(frozen=True, slots=True)
class LoadResult:
    prompt: PromptName | None
    available: int
    """Leading tokens of the query the prompt covers (the most a load could bring)."""
    loaded: tuple[LoadedChunk, ...]
    rejected: tuple[RejectedChunk, ...]
    stopped: StopReason

    @property
    def loaded_tokens(self) -> tuple[range, ...]:
        """Token positions written into the destination, as maximal contiguous ranges."""
        return contiguous_spans(chunk.tokens for chunk in self.loaded)

    @property
    def prefix_tokens(self) -> int:
        """Leading tokens loaded without a gap: what a model server can use as is."""
        return leading_tokens(self.loaded_tokens)


@dataclass(frozen=True, slots=True)
class Share:
    """Which part of a load's chunks one session takes: share `index` of `count`."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"share {self.index} of {self.count} does not exist")

    def chunks(self, total: int) -> range:
        """This share's chunks of `total`: contiguous, so each session's FETCHes walk its own
        run of groups in order, and sizes differ by at most one chunk."""
        return range(total * self.index // self.count, total * (self.index + 1) // self.count)


WHOLE = Share(0, 1)


@dataclass(slots=True)
class _Source:
    """An open prompt to load from: its live catalog and the query chunks it matches."""

    feed: CatalogFeed
    chunks: int
    tokens: int


class KVSubscriber:
    """Lookups and loads of KV caches over one MoQT session."""

    def __init__(
        self,
        session: Session,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        index: PrefixIndex | None = None,
        throughput: ThroughputEstimate | None = None,
        track_throughput: Mapping[str, ThroughputEstimate] | None = None,
        max_announced: int = MAX_ANNOUNCED,
        trust: CatalogTrust = TRUST_THE_RELAY,
    ) -> None:
        """`chunk_size` is the one configured for the models looked up (the query's links
        are probed with it); `index` may be shared by several subscribers of one process;
        `throughput` and `track_throughput` seed the estimates, e.g. with those of an
        earlier session to the same relay, so that a new session does not start again from
        the prior;
        `max_announced` bounds the announced prompts tracked (`PublishedPrompts`); `trust`
        holds the keys catalogs must be signed with (none: any catalog is taken)."""
        self.session = session
        self.chunk_size = chunk_size
        self.index = PrefixIndex() if index is None else index  # an empty one is falsy
        self.throughput = throughput or ThroughputEstimate()
        """Measured over every chunk this subscriber has loaded, and what each load starts
        from: a load that started from the 1 Gbit/s prior on a slow link would take its
        first chunks on the biggest track and miss a tight deadline. Concurrent loads
        share it, as they share the link."""
        self.track_throughput: dict[str, ThroughputEstimate] = dict(track_throughput or {})
        """The same per track: what `estimate` times each chunk with (a track's decoding
        slows the transfers beside it)."""
        self._remeasuring: asyncio.Task[None] | None = None
        """A chunk fetched to measure the link after a load was refused (`remeasure`)."""
        self._feeds = CatalogFeeds(session, trust)
        self.announced = PublishedPrompts(
            session, self._feeds, self.index, max_prompts=max_announced
        )
        """The prompts the relay announces for each model looked up, catalogs indexed.
        Followed by lookups only: a load (`transfer.parallel` runs many, one per session)
        uses what the index knows and would otherwise read every catalog once per session."""

    async def lookup(
        self, model: str, token_ids: Sequence[int], *, timeout: float = LOOKUP_TIMEOUT
    ) -> Availability:
        """How many leading tokens of `token_ids` a published prompt of `model` holds.

        The first lookup of a model starts following its announcements, and waits a moment
        (`CATCH_UP_S`) for the prompts the relay holds already to be indexed; what comes
        later serves the lookups after it (each one probes the query's links too)."""
        self.announced.follow(model)
        try:
            found = await asyncio.wait_for(self._available(model, token_ids), timeout)
        except TimeoutError:
            return Availability(None, 0, 0)
        if found.prompt is not None and self.announced.withdrawn(found.prompt):
            return dataclasses.replace(found, withdrawn=True)
        return found

    async def _available(self, model: str, token_ids: Sequence[int]) -> Availability:
        await self.announced.caught_up(model)
        known = self.index.lookup(model, token_ids)
        if known is not None and self.announced.vouches_for(known.prompt):
            # Only a longer prompt named by the query's links (announced too recently for
            # the index to know it) could beat the one the announcements vouch for.
            longer = self._links_beyond(model, token_ids, known.tokens)
            source = await self._probe(longer, token_ids, None)
            if source is None:
                return Availability(known.prompt, known.tokens, known.tokens)
        else:
            source = await self._find(model, token_ids, known)
        if source is None:
            return Availability(None, 0, 0)
        try:
            catalog = source.feed.catalog
            assert catalog is not None
            ready = _tokens_in(catalog, min(source.chunks, catalog.ready_chunks))
            return Availability(source.feed.prompt, source.tokens, ready, catalog)
        finally:
            await self._feeds.release(source.feed)

    def remeasure(self, track: str, size: int, fetch: Callable[[], Awaitable[list[bytes]]]) -> None:
        """Time `fetch()` (a chunk of `track`, `size` bytes, that no load takes) in the
        background and observe it; one at a time, others asked meanwhile are dropped."""
        if self._remeasuring is not None and not self._remeasuring.done():
            return

        async def sample() -> None:
            try:
                _, seconds = await _timed(fetch())
            except Exception as exc:
                # Anything (a session closing under it included) means no sample; the next
                # load finds out what is wrong. Left unretrieved, the error would be logged
                # from the garbage collector.
                log.debug("remeasure_failed", track=track, error=repr(exc))
                return
            self.observe(track, max(size, 1), max(seconds, 1e-6))

        self._remeasuring = asyncio.ensure_future(sample())

    def observe(self, track: str, nbytes: int, seconds: float) -> None:
        """A chunk of `track` took `seconds` from its FETCH to its last byte."""
        self.throughput = self.throughput.observe(nbytes, seconds)
        rate = self.track_throughput.get(track, ThroughputEstimate())
        self.track_throughput[track] = rate.observe(nbytes, seconds)

    async def estimate(
        self,
        availability: Availability,
        layout: KVLayout,
        budget: float,
        choice: TrackChoice = DEFAULT_CHOICE,
    ) -> float:
        """Seconds a load of what `lookup` found would take, given `budget` seconds: each
        chunk on the track the deadline rule would choose among those `choice` admits (the
        catalog's sizes, or fp16's before the catalog says) at the throughput this
        subscriber measured over its loads, which a load starts from, timed at that track's
        own measured rate where there is one (`kvmoq bench e2e` reports the estimate's
        error)."""
        if availability.prompt is None:
            return 0.0
        rate = self.throughput.bytes_per_second
        catalog = availability.catalog or await self.catalog(availability.prompt, CATALOG_WAIT)
        if catalog is None or catalog.ready_chunks == 0:  # no size known yet: fp16's
            return availability.tokens * layout.fp16_bytes_per_token / rate
        sizes = chunk_sizes(catalog, chunk_count(availability.tokens, catalog.chunk_size))
        return load_seconds_estimate(sizes, rate, budget, choice, track_rates=self.track_rates())

    def track_rates(self) -> dict[str, float]:
        """Bytes per second measured on each track this subscriber has loaded."""
        return {name: t.bytes_per_second for name, t in self.track_throughput.items()}

    async def catalog(self, prompt: PromptName, timeout: float) -> Catalog | None:
        """The prompt's newest catalog, or None if none arrives within `timeout` seconds;
        through the shared feeds, as a second subscription to one track on a session would
        be a protocol error."""
        return await self._feeds.newest(prompt, timeout)

    async def load(
        self,
        model: str,
        token_ids: Sequence[int],
        destination: torch.Tensor | KVSink,
        deadline: float,
        *,
        choice: TrackChoice = DEFAULT_CHOICE,
        compute_rate: float | None = None,
        share: Share = WHOLE,
        first_chunk: int = 0,
        on_loaded: Callable[[LoadedChunk], None] | None = None,
        device: torch.device | None = None,
    ) -> LoadResult:
        """Load the KV of the longest available prefix of `token_ids` within `deadline` seconds.

        `destination` is a tensor `[layers, 2, >= tokens, kv_heads, head_dim]` (written at
        the tokens' positions, cast to its dtype) or a callback. `choice` names the tracks the
        deadline rule may choose, best first, and the KL bound that narrows them per chunk.
        `compute_rate` (tokens per second), the model server's own: a load whose first chunk
        no track brings sooner than the server would compute it loads nothing, and every
        chunk prefers the tracks that do (`_Load._begin`).
        `share` loads only that part of the available chunks (`transfer.parallel` spreads one load over several sessions); the
        result still reports what the prompt covers, and the destination must hold it all.
        Chunks before `first_chunk` are taken as in place already (a load resumed on a new
        session after the last one was lost). `on_loaded` hears of each chunk as it is
        written: a caller that cancels the load, or sees it fail, still knows what it wrote.
        Chunks are decoded on the destination tensor's device, or a callback's `device` (the
        CPU by default), so only compressed bytes cross to a GPU.
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        try:
            find = self._find(model, token_ids, self.index.lookup(model, token_ids))
            source = await asyncio.wait_for(find, max(deadline, 0.0))
        except TimeoutError:
            return LoadResult(None, 0, (), (), StopReason.DEADLINE)
        if source is None:
            return LoadResult(None, 0, (), (), StopReason.NOT_FOUND)
        try:
            shared = share.chunks(source.chunks)
            chunks = range(min(max(shared.start, first_chunk), shared.stop), shared.stop)
            if isinstance(destination, torch.Tensor):
                device = destination.device
            load = _Load(
                self, source, chunks, destination, end, choice, compute_rate, on_loaded,
                device or torch.device("cpu"),
            )  # fmt: skip
            return await load.run()
        finally:
            await self._feeds.release(source.feed)

    # Finding the prompt -----------------------------------------------------------------

    async def _find(
        self, model: str, token_ids: Sequence[int], known: PrefixMatch | None
    ) -> _Source | None:
        """The open prompt that covers the most leading tokens of the query.

        Candidates, most tokens first: the prefix index's best match (`known`), and every
        prompt that would be a chunk-aligned prefix of the query (named by the query's own
        links) and cover more than it. They are probed by subscribing to their catalogs, a
        batch at a time: SUBSCRIBE is the one request every relay routes (moq-rs refuses
        TRACK_STATUS; aiomoqt answers it in a form draft-14 parsers reject).
        """
        candidates = self._links_beyond(model, token_ids, known.tokens if known else 0)
        if known is not None:
            candidates[known.prompt] = known.tokens
        return await self._probe(candidates, token_ids, known)

    def _links_beyond(
        self, model: str, token_ids: Sequence[int], tokens: int
    ) -> dict[PromptName, int]:
        """The prompts the query's links name that would cover more than `tokens` of it."""
        links = self.index.links(token_ids, self.chunk_size)
        named = (
            (PromptName(model, links[i].hex()), min((i + 1) * self.chunk_size, len(token_ids)))
            for i in range(len(links))
        )
        return {prompt: covered for prompt, covered in named if covered > tokens}

    async def _probe(
        self, candidates: dict[PromptName, int], token_ids: Sequence[int], known: PrefixMatch | None
    ) -> _Source | None:
        """The candidate (prompt: tokens it would cover) that covers the most and answers,
        its feed open; `known` leaves the index if it does not answer. A prompt the relay
        withdrew is asked for too: the relay serves what it caches of it."""
        ordered = sorted(candidates, key=candidates.__getitem__, reverse=True)
        for start in range(0, len(ordered), PROBE_BATCH):
            batch = ordered[start : start + PROBE_BATCH]
            opened = await asyncio.gather(
                *(self._open(prompt, token_ids) for prompt in batch), return_exceptions=True
            )
            sources = [s for s in opened if isinstance(s, _Source)]
            best = max(sources, key=lambda s: s.tokens, default=None)
            for source in sources:
                if source is not best:
                    await self._feeds.release(source.feed)
            errors = [e for e in opened if isinstance(e, BaseException)]
            if errors:
                if best is not None:
                    await self._feeds.release(best.feed)
                raise errors[0]
            if best is not None:
                return best
            if known is not None and known.prompt in batch:
                self.index.remove(known.prompt)
        return None

    async def _open(self, prompt: PromptName, token_ids: Sequence[int]) -> _Source | None:
        """The prompt's live catalog and how many query chunks it matches; None if gone."""
        try:
            feed = await self._feeds.acquire(prompt)
        except RequestRefused:
            return None
        try:
            catalog = await feed.wait_ready(0)
        except BaseException:  # cancelled by the caller's deadline: leave nothing open
            await self._feeds.release(feed)
            raise
        chunks = 0 if catalog is None else self._learn(catalog, token_ids)
        if catalog is None or chunks == 0:
            await self._feeds.release(feed)
            return None
        return _Source(feed, chunks, _tokens_in(catalog, chunks))

    def _learn(self, catalog: Catalog, token_ids: Sequence[int]) -> int:
        """Index the catalog's links; the number of leading query chunks it shares."""
        try:
            self.index.add_catalog(catalog)
        except ChunkSizeLimitError as exc:
            log.info("catalog_not_indexed", prompt=catalog.name.prompt_id, reason=str(exc))
        else:
            self.announced.seen(catalog)
        return _shared_chunks(catalog, self.index.links(token_ids, catalog.chunk_size))


@dataclass(slots=True)
class _Transfer:
    """One chunk's FETCH in flight, on the track chosen for it."""

    catalog: Catalog
    index: int
    track: str
    started: float
    task: asyncio.Task[tuple[list[bytes], float]]
    """The chunk's objects, and the seconds from its FETCH to its last byte."""


class _Load:
    """One load in progress: chunk after chunk until done, out of time, or out of source.

    The next chunk's FETCH goes out as soon as this chunk's bytes are in (when the catalog
    already describes it), and verification and decoding run in a worker thread, so the
    transfer of one chunk overlaps the decoding of the previous one, on another core.
    """

    def __init__(
        self,
        subscriber: KVSubscriber,
        source: _Source,
        chunks: range,
        destination: torch.Tensor | KVSink,
        end: float,
        choice: TrackChoice,
        compute_rate: float | None,
        on_loaded: Callable[[LoadedChunk], None] | None,
        device: torch.device,
    ) -> None:
        self.subscriber = subscriber
        self.session = subscriber.session
        self.source = source
        self.chunks = chunks
        """The source's chunks this load fetches (all of them unless it is a share)."""
        self.destination = destination
        self.end = end
        self.choice = choice
        self.compute_rate = compute_rate
        self.on_loaded = on_loaded
        self.device = device
        """Where chunks are decoded: the destination's device."""
        self.clock = asyncio.get_running_loop().time
        self.loaded: list[LoadedChunk] = []
        self.rejected: list[RejectedChunk] = []
        self.failed: dict[int, set[str]] = {}
        """Tracks each chunk was rejected on: a retry takes the next one that fits."""

    def result(self, stopped: StopReason) -> LoadResult:
        return LoadResult(
            self.source.feed.prompt,
            self.source.tokens,
            tuple(self.loaded),
            tuple(self.rejected),
            stopped,
        )

    def time_left(self) -> float:
        return max(self.end - self.clock(), 0.0)

    async def run(self) -> LoadResult:
        following = await self._next(self.chunks.start)
        try:
            while isinstance(following, _Transfer):
                following = await self._step(following)
            return self.result(following)
        finally:
            if isinstance(following, _Transfer):
                following.task.cancel()

    async def _step(self, transfer: _Transfer) -> _Transfer | StopReason:
        """Finish one transfer; what to wait for next (a chunk, or the end of the load)."""
        try:
            payloads, seconds = await asyncio.wait_for(transfer.task, self.time_left())
        except TimeoutError:
            return StopReason.DEADLINE
        except (KVCodecError, RequestRefused, FetchReset) as exc:
            self._reject(transfer, str(exc))
            retry = self._retry(transfer)
            if retry is None and not isinstance(exc, KVCodecError) and self.source.feed.ended:
                # The publisher left, and the relay holds this chunk on no track (it refused
                # it, or reset it when its upstream went): it holds none after it either (it
                # caches what passed, in order), and nobody else will send them.
                return StopReason.PUBLISHER_GONE
            return retry or await self._next(transfer.index + 1)
        except (MoqtApiError, ConnectionError):
            return StopReason.RELAY_GONE
        # The transfer's own seconds: a prefetched chunk's bytes are often in before the
        # previous chunk is stored, and the wait for that store is not the link's.
        size = transfer.catalog.chunk_bytes(transfer.index)[transfer.track]
        self.subscriber.observe(transfer.track, max(size, 1), max(seconds, 1e-6))
        ready, after = self.source.feed.catalog, transfer.index + 1
        prefetched = None
        if after < self.chunks.stop and ready and ready.ready_chunks > after:
            prefetched = self._begin(ready, after)
        try:
            stored = await self._store(transfer, payloads)
        except TimeoutError:  # decoding would end past the deadline: the chunk stays unwritten
            if isinstance(prefetched, _Transfer):
                prefetched.task.cancel()
            return StopReason.DEADLINE
        if stored:
            return prefetched or await self._next(after)
        retry = self._retry(transfer)
        if retry is None:
            return prefetched or await self._next(after)
        if isinstance(prefetched, _Transfer):
            prefetched.task.cancel()
        return retry

    def _retry(self, rejected: _Transfer) -> _Transfer | StopReason | None:
        """The rejected chunk again on the next track that fits; None when every track on
        offer failed it (the load moves on and the chunk stays a hole)."""
        self.failed.setdefault(rejected.index, set()).add(rejected.track)
        offered = rejected.catalog.chunk_bytes(rejected.index)
        if not any(t in offered for t in self._tracks(rejected.index)):
            return None
        return self._begin(rejected.catalog, rejected.index)

    async def _next(self, index: int) -> _Transfer | StopReason:
        """Chunk `index`'s transfer, once the catalog describes it; or why the load ends."""
        if index == self.chunks.stop:
            return StopReason.COMPLETE
        feed = self.source.feed
        try:
            catalog = await asyncio.wait_for(feed.wait_ready(index + 1), self.time_left())
        except TimeoutError:
            return StopReason.DEADLINE
        if catalog is None or catalog.ready_chunks <= index:
            if feed.error:
                return StopReason.CATALOG_INVALID
            if self.session.closed:  # the feed ended with the session
                return StopReason.RELAY_GONE
            return StopReason.PUBLISHER_GONE
        if index == self.chunks.start:
            _check_destination(self.destination, catalog, self.source.tokens)
        return self._begin(catalog, index)

    def _begin(self, catalog: Catalog, index: int) -> _Transfer | StopReason:
        """FETCH chunk `index` on the best track that fits the time left (CacheGen's rule),
        among those that bring it sooner than the model server would compute it.

        Whether loading pays at all is decided at the load's first chunk, on what earlier
        loads measured; past it, a chunk with no such track goes on the deadline rule's
        choice: a load's own samples start with its slowest (a relay fetching the prompt
        from its publisher, a track encoded on first demand), and stopping on them left to
        compute most of a prompt that loads five times faster than it computes."""
        if self.choice.refuses(catalog.chunk_bytes(index), self._recent(index)):
            return StopReason.QUALITY_FLOOR
        tracks = self._tracks(index)
        rate = self.subscriber.throughput.bytes_per_second
        if self.compute_rate is not None:
            compute_s = len(catalog.chunk_span(index)) / self.compute_rate
            rates = self.subscriber.track_rates()
            paying = paying_tracks(catalog.chunk_bytes(index), rate, tracks, compute_s, rates)
            if tracks and not paying and index == self.chunks.start:
                self._remeasure(catalog, index, tracks)
                return StopReason.COMPUTE_FASTER
            tracks = paying or tracks
        track = choose_track(
            catalog.chunk_bytes(index),
            rate,
            self.end - self.clock(),
            self.chunks.stop - index,
            tracks,
            last_is_recent=self.chunks.stop == self.source.chunks,
            track_rates=self.subscriber.track_rates(),
        )
        if track is None:
            if index == self.chunks.start:
                self._remeasure(catalog, index, tracks)
            return StopReason.DEADLINE
        size = catalog.chunk_bytes(index)[track]
        task = asyncio.ensure_future(_timed(self._fetch(catalog, index, track, size)))
        return _Transfer(catalog, index, track, self.clock(), task)

    def _tracks(self, index: int) -> list[str]:
        """The tracks chunk `index` may take, best first: those the load's choice admits at
        its place (the source's last chunk is its most recent), less those it failed on."""
        failed = self.failed.get(index, set())
        return [t for t in self.choice.admitted(self._recent(index)) if t not in failed]

    def _recent(self, index: int) -> bool:
        """Whether chunk `index` is the load's most recent: the source's last (the tokens a
        server generates first attend hardest to it; `track_quality`)."""
        return index == self.source.chunks - 1

    def _remeasure(self, catalog: Catalog, index: int, tracks: Sequence[str]) -> None:
        """The estimate refused this load its first chunk: fetch that chunk anyway, for no
        load, on the track the load wanted most, so the estimate follows the link again.

        Only loads measure the link. Without this, one slow spell (a relay fetching from
        the publisher, a publisher encoding a track on first demand, a busy machine) leaves
        an estimate that refuses every later load, and nothing ever measures again.
        """
        offered = catalog.chunk_bytes(index)
        track = next((t for t in tracks if t in offered), None)
        if track is None:
            return
        size = offered[track]
        self.subscriber.remeasure(
            track, size, functools.partial(self._fetch, catalog, index, track, size)
        )

    async def _store(self, transfer: _Transfer, payloads: list[bytes]) -> bool:
        """Verify, decode (in a worker thread) and write one chunk; False (and the chunk
        rejected) on any error, TimeoutError when the deadline comes first. A load ends by
        its deadline, not later: whoever bounds it from outside cancels it at that point,
        and a cancelled load cannot say which chunks it wrote."""
        catalog, index, track = transfer.catalog, transfer.index, transfer.track
        span = catalog.chunk_span(index)
        try:
            decode = asyncio.to_thread(_verified_kv, catalog, index, track, payloads, self.device)
            kv = await asyncio.wait_for(decode, self.time_left())
        except KVCodecError as exc:
            self._reject(transfer, str(exc))
            return False
        if isinstance(self.destination, torch.Tensor):
            await asyncio.to_thread(self.destination[:, :, span.start : span.stop].copy_, kv)
        else:
            self.destination(span, kv)
        size = catalog.chunk_bytes(index)[track]
        seconds = self.clock() - transfer.started
        chunk = LoadedChunk(index, span, track, size, seconds, chunk_kl(track, self._recent(index)))
        self.loaded.append(chunk)
        if self.on_loaded is not None:
            self.on_loaded(chunk)
        return True

    async def _fetch(self, catalog: Catalog, index: int, track: str, size: int) -> list[bytes]:
        """The chunk's objects in order; `ChunkIntegrityError` as soon as the stream shows
        more objects or bytes than the catalog lists (read no further)."""
        name = FullTrackName(self.source.feed.prompt.namespace(), track.encode())
        tokens = len(catalog.chunk_span(index))
        stream = await self.session.fetch(name, Location(index, 0), index)
        payloads: dict[int, bytes] = {}
        received = 0
        try:
            async for obj in stream:
                if obj.status != ObjectStatus.NORMAL:
                    continue
                if obj.group_id != index or not 0 <= obj.object_id < tokens:
                    raise ChunkIntegrityError(track, index, f"object {obj.location} not in it")
                if obj.object_id in payloads:
                    raise ChunkIntegrityError(track, index, f"object {obj.object_id} twice")
                received += len(obj.payload)
                if received > size:
                    raise ChunkIntegrityError(track, index, "more bytes than the catalog lists")
                payloads[obj.object_id] = obj.payload
        finally:
            await _cancel(stream)
        if len(payloads) != tokens:
            missing = tokens - len(payloads)
            raise ChunkIntegrityError(track, index, f"{missing} of {tokens} objects missing")
        return [payloads[i] for i in range(tokens)]

    def _reject(self, transfer: _Transfer, reason: str) -> None:
        prompt, index = transfer.catalog.name.prompt_id, transfer.index
        log.warning("chunk_rejected", prompt=prompt, chunk=index, reason=reason)
        span = transfer.catalog.chunk_span(index)
        self.rejected.append(RejectedChunk(index, span, transfer.track, reason))


async def _timed(fetch: Awaitable[list[bytes]]) -> tuple[list[bytes], float]:
    """`fetch`'s result and the seconds it took, on the loop's clock."""
    clock = asyncio.get_running_loop().time
    started = clock()
    payloads = await fetch
    return payloads, clock() - started


async def _cancel(stream: FetchStream) -> None:
    if not stream.finished:
        await stream.cancel()


def _verified_kv(
    catalog: Catalog, index: int, track: str, payloads: list[bytes], device: torch.device
) -> torch.Tensor:
    """The chunk's KV on `device`, decoded only once its size and digest match the catalog."""
    catalog.verify_chunk(track, index, payloads)
    codec = get_codec(track)
    return codec.decode(payloads, catalog.layout, catalog.track(track).tables, device=device)


def _shared_chunks(catalog: Catalog, links: Sequence[bytes]) -> int:
    """Leading chunks of the query (its `links`) equal to the catalog's."""
    shared = 0
    for mine, theirs in zip(links, catalog.chunk_hashes, strict=False):
        if mine != theirs:
            break
        shared += 1
    return shared


def _tokens_in(catalog: Catalog, chunks: int) -> int:
    return catalog.chunk_span(chunks - 1).stop if chunks else 0


def _check_destination(destination: torch.Tensor | KVSink, catalog: Catalog, tokens: int) -> None:
    if not isinstance(destination, torch.Tensor):
        return
    layout = catalog.layout
    expected = layout.shape(tokens)
    shape = tuple(destination.shape)
    if len(shape) != 5 or shape[:2] + shape[3:] != expected[:2] + expected[3:]:
        raise ValueError(f"destination {shape} does not fit the KV layout {expected}")
    if shape[2] < tokens:
        raise ValueError(f"destination holds {shape[2]} tokens, the load brings {tokens}")
