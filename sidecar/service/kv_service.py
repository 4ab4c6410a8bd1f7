"""What the sidecar does for a model server, with no gRPC in sight.

Buffer sets in, prompts published from them, loads written into them. The servicer turns
protobuf into these calls and these results back into protobuf; tests and other adapters
could drive this class directly.

A prompt this sidecar published itself is loaded from its own memory: no relay routes a
request back to the session it came from, and the bytes are the model server's own, exact.
A query that runs past it (a longer prompt that starts with it, published elsewhere) gets
the rest through the relay.

A load's chunks are written synchronously inside the subscriber's callback, between two
awaits, so whatever stops a load (deadline, relay gone, client gone, shutdown) stops it
between chunks: every token position is either fully written and verified, and reported,
or untouched.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import torch

from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.errors import KVCodecError
from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE, chunk_ranges
from sidecar.kvcache.naming import MAX_TOKENS, PromptName
from sidecar.kvcache.prefix_index import PrefixMatch
from sidecar.kvcache.tracks import DEFAULT_TRACK, DEFAULT_TRACKS
from sidecar.log import get_logger
from sidecar.moqt.aio.api import MoqtApiError
from sidecar.service.buffers import BufferSet, Placement
from sidecar.service.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from sidecar.service.metrics import Metrics
from sidecar.service.relay_link import RelayLink
from sidecar.transfer.prompts import PromptStore
from sidecar.transfer.publisher import PublishedPrompt, PublishError
from sidecar.transfer.resume import LoadBudget, load_resuming
from sidecar.transfer.subscriber import (
    KVSink,
    LoadedChunk,
    RejectedChunk,
    StopReason,
    contiguous_spans,
    expected_kl,
    leading_tokens,
)
from sidecar.transfer.track_quality import DEFAULT_MAX_KL, QUALITY_ORDER, TrackChoice

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    chunk_size: int = DEFAULT_CHUNK_SIZE
    tracks: tuple[str, ...] = DEFAULT_TRACKS
    """Offered when a Publish names none."""
    default_track: str = DEFAULT_TRACK
    load_seconds: float = 5.0
    """A load's time budget when the request sets no deadline."""
    max_kl: float = DEFAULT_MAX_KL
    """A load's quality floor when the request sets none (`track_quality.TrackChoice`)."""
    relay_wait: float = 2.0
    """How long a load whose relay session was lost waits for it to come back (from the
    loss) when the request sets no wait of its own."""
    max_request_tokens: int = 1 << 17
    max_buffer_sets: int = 64
    max_published_bytes: int = 4 << 30
    """KV copies and encoded tracks kept for published prompts; the oldest go first."""


@dataclass(frozen=True, slots=True)
class Found:
    prompt: PromptName | None
    tokens: int
    ready_tokens: int
    relay_url: str
    estimated_seconds: float
    withdrawn: bool = False


@dataclass(frozen=True, slots=True)
class ChunkWritten:
    """Token positions just written into the destination, after verification."""

    tokens: range


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    token_count: int
    stop: StopReason
    loaded: tuple[range, ...]
    """Maximal ranges of token positions written; nothing else was touched."""
    held: int = 0
    """Leading tokens the model server said it holds: in place, not loaded."""
    prompt: PromptName | None = None
    available: int = 0
    chunks: tuple[LoadedChunk, ...] = ()
    """What the subscriber reported loading (empty when the load was cancelled)."""
    rejected: tuple[RejectedChunk, ...] = ()
    max_kl: float = DEFAULT_MAX_KL
    """The quality floor the load kept."""

    @property
    def expected_kl(self) -> float:
        """The loaded KV's expected KL from the measured figures of its chunks' tracks (the
        worst chunk's); 0 when all of it came exact (this sidecar's own prompt) or none did."""
        return expected_kl(self.chunks)

    @property
    def track_bytes(self) -> Counter[str]:
        sizes: Counter[str] = Counter()
        for chunk in self.chunks:
            sizes[chunk.track] += chunk.nbytes
        return sizes

    @property
    def prefix_tokens(self) -> int:
        return leading_tokens(contiguous_spans((range(self.held), *self.loaded)))

    @property
    def compute_tokens(self) -> int:
        return self.token_count - self.prefix_tokens


LoadEvent = ChunkWritten | LoadOutcome


class KVService:
    """Buffer sets, the prompts published from them, and the loads writing into them."""

    def __init__(
        self,
        link: RelayLink,
        metrics: Metrics,
        settings: ServiceSettings = ServiceSettings(),
    ) -> None:
        self.link = link
        self.metrics = metrics
        self.settings = settings
        self.draining = False
        self._sets: dict[str, BufferSet] = {}
        self._writers: Counter[str] = Counter()
        self._loads: set[asyncio.Task[None]] = set()
        self._publishing: set[asyncio.Task[None]] = set()
        self.prompts = PromptStore(link.publisher, link, settings.max_published_bytes)
        """The prompts published here: their tracks, KV, index, announcement, eviction."""

    # Buffer sets ------------------------------------------------------------------------

    def register(self, buffers: BufferSet) -> str:
        self._accepting()
        if len(self._sets) >= self.settings.max_buffer_sets:
            raise FailedPrecondition(
                f"{len(self._sets)} buffer sets are registered, the most this sidecar holds;"
                " unregister one first"
            )
        set_id = secrets.token_hex(8)
        self._sets[set_id] = buffers
        log.info("buffers_registered", buffer_set=set_id, model=buffers.model)
        return set_id

    def unregister(self, set_id: str) -> None:
        self._get(set_id)
        if self._writers[set_id]:
            raise FailedPrecondition(
                f"buffer set {set_id} has {self._writers[set_id]} loads writing into it;"
                " wait for their LoadFinished"
            )
        del self._sets[set_id]
        log.info("buffers_unregistered", buffer_set=set_id)

    def _get(self, set_id: str) -> BufferSet:
        buffers = self._sets.get(set_id)
        if buffers is None:
            raise NotFound(f"no buffer set {set_id!r}: register the buffers first")
        return buffers

    def _accepting(self) -> None:
        if self.draining:
            raise Unavailable("the sidecar is shutting down; use another one")

    def _request(self, set_id: str, token_ids: Sequence[int]) -> BufferSet:
        """The buffer set of a Publish, Lookup or Load whose tokens are within limits."""
        self._accepting()
        buffers = self._get(set_id)
        limit = min(self.settings.max_request_tokens, MAX_TOKENS)
        if not 0 < len(token_ids) <= limit:
            raise InvalidArgument(f"token_ids holds {len(token_ids)} tokens; send 1 to {limit}")
        return buffers

    # Publish ----------------------------------------------------------------------------

    async def publish(
        self,
        set_id: str,
        token_ids: Sequence[int],
        source: Placement,
        tracks: Sequence[str] = (),
        default_track: str = "",
    ) -> PublishedPrompt:
        """Copy the prompt's KV out of the buffers and publish it; a prompt published before
        is answered as it is (the same tokens have the same KV)."""
        buffers = self._request(set_id, token_ids)
        buffers.check(source, len(token_ids))
        offered = tuple(tracks) or self.settings.tracks
        default = default_track or (
            self.settings.default_track if self.settings.default_track in offered else offered[0]
        )
        known = self.prompts.get(buffers.model, token_ids, self.settings.chunk_size)
        if known is not None:
            return known
        kv = buffers.read(source, len(token_ids))
        try:
            buffers.layout.check(kv, finite=True)
            prompt = self.prompts.declare(
                buffers.model,
                buffers.layout,
                token_ids,
                tracks=offered,
                default_track=default,
                chunk_size=self.settings.chunk_size,
            )
        except (PublishError, KVCodecError) as exc:
            raise InvalidArgument(str(exc)) from None
        # Shielded: a caller that leaves must not leave a prompt half published, which
        # every later Publish of the same tokens would be answered with.
        task = asyncio.create_task(self._publish(prompt, kv))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)
        await asyncio.shield(task)
        return prompt

    async def _publish(self, prompt: PublishedPrompt, kv: torch.Tensor) -> None:
        for evicted, held in await self.prompts.publish(prompt, kv):
            self.metrics.evicted_prompts.inc()
            log.info("prompt_evicted", prompt=evicted.name.prompt_id, held_bytes=held)
        assert prompt.catalog is not None
        for index in range(prompt.chunk_count):
            for track, size in prompt.catalog.chunk_bytes(index).items():
                self.metrics.published_bytes.labels(track).inc(size)
                self.metrics.published_chunks.labels(track).inc()
        log.info(
            "prompt_published",
            prompt=prompt.name.prompt_id,
            tokens=len(prompt.token_ids),
            tracks=list(prompt.offered),
        )

    # Lookup -----------------------------------------------------------------------------

    async def lookup(
        self, set_id: str, token_ids: Sequence[int], max_kl: float | None = None
    ) -> Found:
        """What a load of `token_ids` would find, and its estimated seconds under the
        quality floor `max_kl` (None: the settings')."""
        buffers = self._request(set_id, token_ids)
        choice = self._track_choice((), max_kl)
        local = self.prompts.local(buffers.model, token_ids)
        subscriber = self.link.subscriber
        found = Found(None, 0, 0, self.link.url, 0.0)
        if local is not None:
            found = Found(local.prompt, local.tokens, local.tokens, "", 0.0)
        if subscriber is not None and found.tokens < len(token_ids):
            try:
                availability = await subscriber.lookup(buffers.model, token_ids)
                seconds = await subscriber.estimate(
                    availability, buffers.layout, self.settings.load_seconds, choice
                )
            except (MoqtApiError, ConnectionError, TimeoutError) as exc:
                log.warning("lookup_relay_gone", error=str(exc))
            else:
                if availability.tokens > found.tokens:  # a longer prompt the query extends
                    found = Found(
                        availability.prompt,
                        availability.tokens,
                        availability.ready_tokens,
                        self.link.url,
                        seconds,
                        availability.withdrawn,
                    )
        self.metrics.lookups.labels("hit" if found.tokens else "miss").inc()
        return found

    # Load -------------------------------------------------------------------------------

    async def load(
        self,
        set_id: str,
        token_ids: Sequence[int],
        destination: Placement,
        budget: LoadBudget,
        tracks: Sequence[str] = (),
        held: int = 0,
        write_tokens: int = 0,
        max_kl: float | None = None,
    ) -> AsyncIterator[LoadEvent]:
        """Each chunk as it is written, then the outcome, within `budget`. The load starts
        at the chunk that holds token `held`: the model server has the KV of the tokens
        before it. `write_tokens`: the tokens with slots in `destination` (0: all); the rest
        name the prompt only. `max_kl`: the quality floor (None: the settings')."""
        buffers = self._request(set_id, token_ids)
        writable = write_tokens or len(token_ids)
        if not 0 <= held < writable <= len(token_ids):
            raise InvalidArgument(
                f"held_tokens {held} and write_tokens {write_tokens} of {len(token_ids)}"
                " tokens: a load writes at least one token after those held, and no token"
                " past token_ids"
            )
        buffers.check(destination, writable)
        if budget.seconds <= 0:
            raise DeadlineExceeded(f"the deadline passed {-budget.seconds:.3f} s before the load")
        choice = self._track_choice(tracks, max_kl)
        log.info(
            "load_started",
            tokens=len(token_ids),
            deadline=round(budget.seconds, 3),
            max_kl=choice.max_kl,
            compute_rate=budget.compute_rate,
        )
        events: asyncio.Queue[LoadEvent | Exception] = asyncio.Queue()
        task = asyncio.create_task(
            self._load(
                buffers,
                token_ids,
                destination,
                budget,
                choice,
                range(held, writable),
                events.put_nowait,
            )
        )
        self._loads.add(task)
        self._writers[set_id] += 1
        try:
            while True:
                event = await events.get()
                if isinstance(event, Exception):
                    raise event
                yield event
                if isinstance(event, LoadOutcome):
                    return
        finally:
            task.cancel()
            self._loads.discard(task)
            self._writers[set_id] -= 1

    async def _load(
        self,
        buffers: BufferSet,
        token_ids: Sequence[int],
        destination: Placement,
        budget: LoadBudget,
        choice: TrackChoice,
        writing: range,
        emit: Callable[[LoadEvent | Exception], None],
    ) -> None:
        """Load `token_ids` and write the tokens of `writing` (those after the ones held, up
        to the ones with slots in `destination`)."""
        clock = asyncio.get_running_loop().time
        started = clock()
        written: list[range] = []
        layout = buffers.layout
        held = writing.start

        def write(tokens: range, kv: torch.Tensor) -> None:
            expected = layout.shape(len(tokens))
            if tuple(kv.shape) != expected:
                raise FailedPrecondition(
                    f"the published prompt's KV is {tuple(kv.shape)} for {len(tokens)} tokens;"
                    f" these buffers hold {expected}: another model or layout"
                )
            kept = range(tokens.start, min(tokens.stop, writing.stop))
            if not kept:
                return
            buffers.write(destination, kept, kv[:, :, : len(kept)])
            written.append(kept)
            emit(ChunkWritten(kept))

        fetched: list[LoadedChunk] = []  # as the subscriber writes them: however the load ends
        local = self.prompts.local(buffers.model, token_ids)
        prompt, available = (local.prompt, local.tokens) if local else (None, 0)
        rejected: tuple[RejectedChunk, ...] = ()
        try:
            # What this sidecar published itself comes from its memory; the relay may have a
            # longer prompt (the query extends it), to load the rest from.
            stop = StopReason.RELAY_GONE
            start = held
            if local is not None:
                stop = self._load_local(local, write, held)
                start = max(held, local.tokens)
            if self.link.subscriber is not None and start < len(token_ids):
                resumed = await load_resuming(
                    self.link, buffers.model, token_ids, write, budget, choice, start,
                    buffers.device, fetched.append,
                )  # fmt: skip
                if local is None or resumed.stopped is not StopReason.NOT_FOUND:
                    stop = resumed.stopped
                if resumed.prompt is not None and resumed.available > available:
                    prompt, available = resumed.prompt, resumed.available
                rejected = resumed.rejected
        except asyncio.CancelledError:
            stop = StopReason.CANCELLED
        except Exception as exc:
            emit(exc)
            return
        outcome = LoadOutcome(
            len(token_ids),
            stop,
            contiguous_spans(written),
            held,
            prompt,
            available,
            tuple(fetched),
            rejected,
            choice.max_kl,
        )
        self._account(outcome, clock() - started)
        emit(outcome)

    def _track_choice(self, tracks: Sequence[str], max_kl: float | None) -> TrackChoice:
        """The request's tracks (all, best first, if it names none) and floor (the settings'
        if it sets none); InvalidArgument for an unknown track or a floor none meets."""
        for track in tracks:
            try:
                get_codec(track)
            except KVCodecError as exc:
                raise InvalidArgument(str(exc)) from None
        bound = self.settings.max_kl if max_kl is None else max_kl
        try:
            return TrackChoice(tuple(tracks) or QUALITY_ORDER, bound)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    def _load_local(self, match: PrefixMatch, write: KVSink, held: int) -> StopReason:
        chunks = self.prompts.chunks(match)
        for span in chunk_ranges(match.tokens, match.chunk_size)[held // match.chunk_size :]:
            write(span, chunks[span.start // match.chunk_size][:, :, : len(span)])
        return StopReason.COMPLETE

    def _account(self, outcome: LoadOutcome, seconds: float) -> None:
        metrics = self.metrics
        metrics.load_seconds.labels(outcome.stop.value).observe(seconds)
        metrics.lookups.labels("hit" if outcome.available else "miss").inc()
        metrics.verification_failures.inc(len(outcome.rejected))
        for chunk in outcome.chunks:
            metrics.loaded_bytes.labels(chunk.track).inc(chunk.nbytes)
            metrics.loaded_chunks.labels(chunk.track).inc()
        log.info(
            "load_finished",
            stop=outcome.stop.value,
            prompt=outcome.prompt.prompt_id if outcome.prompt else None,
            loaded=[(span.start, span.stop) for span in outcome.loaded],
            compute_tokens=outcome.compute_tokens,
            rejected=len(outcome.rejected),
            max_kl=outcome.max_kl,
            expected_kl=outcome.expected_kl,
            seconds=round(seconds, 4),
        )

    # Shutdown ---------------------------------------------------------------------------

    async def drain(self, grace: float) -> None:
        """Take no new work; give running loads `grace` seconds, then cancel the rest (each
        still ends with a LoadFinished that says what it wrote)."""
        self.draining = True
        running = set(self._loads)
        if not running:
            return
        log.info("draining", loads=len(running), grace=grace)
        _, pending = await asyncio.wait(running, timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
