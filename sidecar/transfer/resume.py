"""A load's time budget, and a load that outlives the relay session it started on.

The budget is made once, where the request arrives (the servicer: the request's deadline,
the call's own, or the sidecar's default), and passed down whole: every bound below it is
read from it, never cut again. `load_resuming` runs a load through the relay link's
subscriber; when the session is lost mid-load it waits up to the budget's `relay_wait` for
the link to reconnect and goes on from the first chunk not yet in place, and it returns one
result for the whole load, however many sessions it took, whose stop reason says why it
ended (the service maps it to the proto's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from sidecar.kvcache.naming import PromptName
from sidecar.log import get_logger
from sidecar.moqt.aio.api import MoqtApiError
from sidecar.transfer.subscriber import (
    KVSink,
    KVSubscriber,
    LoadedChunk,
    LoadResult,
    RejectedChunk,
    StopReason,
    contiguous_spans,
    leading_tokens,
)
from sidecar.transfer.track_quality import TrackChoice

log = get_logger(__name__)

FINISH_MARGIN_S = 0.2
FINISH_MARGIN_SHARE = 0.1
"""What a bounded step leaves of its bound for reporting how it ended: 0.2 s, or a tenth
of a shorter bound (a few ms do on a local socket)."""

RESUME_POLL_S = 0.1
"""How often a load whose session was lost looks whether the link has seen it end, and then
whether the prompt is published again."""


def within(seconds: float) -> float:
    """The part of a `seconds` bound that work inside it may plan for: the rest is left for
    saying how it ended, before whoever set the bound gives up on it."""
    return seconds - min(FINISH_MARGIN_S, FINISH_MARGIN_SHARE * seconds)


@dataclass(frozen=True, slots=True)
class LoadBudget:
    """A load's time: `seconds` from `started` (event-loop time) to its deadline, and how
    long it waits for a relay session lost mid-load to come back (`relay_wait`, counted
    from the loss); the deadline bounds both. Chunks are planned to end a margin before the
    deadline (`planned_end`), so that a load merely out of time still says what it wrote;
    at the deadline itself (`deadline`) the load is stopped whatever it waits on.

    `compute_rate`: the model server's own prefill rate, tokens per second, where it said
    one: what a chunk's load must beat to be worth its time (`transfer.adapt.paying_tracks`)."""

    seconds: float
    relay_wait: float
    started: float
    compute_rate: float | None = None

    @classmethod
    def starting_now(
        cls, seconds: float, relay_wait: float, compute_rate: float | None = None
    ) -> LoadBudget:
        return cls(seconds, relay_wait, asyncio.get_running_loop().time(), compute_rate)

    @property
    def deadline(self) -> float:
        return self.started + self.seconds

    @property
    def planned_end(self) -> float:
        return self.started + within(self.seconds)


class Sessions(Protocol):
    """The relay link as a load sees it (`service.relay_link.RelayLink`)."""

    @property
    def chunk_size(self) -> int: ...

    async def subscriber_when_up(self) -> KVSubscriber: ...


@dataclass(frozen=True, slots=True)
class ResumedLoad:
    """One load's result over every session it took."""

    stopped: StopReason
    prompt: PromptName | None = None
    available: int = 0
    rejected: tuple[RejectedChunk, ...] = ()


async def load_resuming(
    sessions: Sessions,
    model: str,
    token_ids: Sequence[int],
    write: KVSink,
    budget: LoadBudget,
    choice: TrackChoice,
    held: int,
    device: torch.device,
    on_loaded: Callable[[LoadedChunk], None],
) -> ResumedLoad:
    """Load through the relay from the chunk that holds token `held`, resuming on a new
    session after a loss (see the module docstring); `on_loaded` hears of each chunk as it
    is written, whatever ends the load, cancellation included.

    Stopped at the budget's deadline whatever it waits on: a relay gone silent can hold a
    request past it, and the client must still hear what was written. That is DEADLINE,
    unless the load was waiting for a lost session (RELAY_GONE) or a request to a silent
    relay timed out before the deadline (RELAY_GONE too)."""
    load = _Resuming(sessions, model, token_ids, write, budget, choice, device, on_loaded)
    bound = asyncio.timeout_at(budget.deadline)
    try:
        async with bound:
            await load.sessions_in_turn(held)
        stopped = load.results[-1].stopped
    except TimeoutError:
        resuming = bool(load.results) and load.results[-1].stopped is StopReason.RELAY_GONE
        expired = bound.expired() and not resuming
        stopped = StopReason.DEADLINE if expired else StopReason.RELAY_GONE
    found = [result for result in load.results if result.prompt is not None]
    best = max(found, key=lambda result: result.available, default=None)
    return ResumedLoad(
        stopped,
        None if best is None else best.prompt,
        0 if best is None else best.available,
        tuple(chunk for result in load.results for chunk in result.rejected),
    )


@dataclass(slots=True)
class _Resuming:
    """One load over as many sessions as it takes; `results` gets each session's result,
    the last one saying why the load ended."""

    sessions: Sessions
    model: str
    token_ids: Sequence[int]
    write: KVSink
    budget: LoadBudget
    choice: TrackChoice
    device: torch.device
    on_loaded: Callable[[LoadedChunk], None]
    results: list[LoadResult] = field(default_factory=list)

    async def sessions_in_turn(self, held: int) -> None:
        """A relay that restarted knows no prompt until their publishers have reconnected
        and announced them again, so after a loss NOT_FOUND means "not yet": tried again
        every `RESUME_POLL_S` within the same wait (and not recorded, so that the load then
        ends RELAY_GONE)."""
        in_place = [range(held)]

        def loaded(chunk: LoadedChunk) -> None:
            in_place.append(chunk.tokens)
            self.on_loaded(chunk)

        chunk_size = self.sessions.chunk_size
        first_chunk = held // chunk_size
        loop = asyncio.get_running_loop()
        lost: KVSubscriber | None = None
        give_up: float | None = None  # loop time, once a session is lost
        while True:
            subscriber = await _session_after(self.sessions, lost, give_up)
            if subscriber is None:  # none came back in time: the last result says RELAY_GONE
                return
            try:
                result = await subscriber.load(
                    self.model,
                    self.token_ids,
                    self.write,
                    self.budget.planned_end - loop.time(),
                    choice=self.choice,
                    compute_rate=self.budget.compute_rate,
                    first_chunk=first_chunk,
                    on_loaded=loaded,
                    device=self.device,
                )
            except (MoqtApiError, ConnectionError):
                result = LoadResult(None, 0, (), (), StopReason.RELAY_GONE)
            if lost is not None and result.stopped is StopReason.NOT_FOUND:
                assert give_up is not None
                if loop.time() + RESUME_POLL_S > give_up:
                    return
                await asyncio.sleep(RESUME_POLL_S)
                continue
            self.results.append(result)
            if result.stopped is not StopReason.RELAY_GONE or not subscriber.session.closed:
                return
            first_chunk = leading_tokens(contiguous_spans(in_place)) // chunk_size
            log.info("load_resuming", first_chunk=first_chunk, wait=self.budget.relay_wait)
            lost = subscriber
            give_up = loop.time() + self.budget.relay_wait


async def _session_after(
    sessions: Sessions, lost: KVSubscriber | None, give_up: float | None
) -> KVSubscriber | None:
    """The link's subscriber once it is up on a session other than `lost`; None if none is
    by `give_up` (loop time; None: no bound but the caller's)."""
    try:
        async with asyncio.timeout_at(give_up):
            while (subscriber := await sessions.subscriber_when_up()) is lost:
                # the link has not seen the lost session end yet
                await asyncio.sleep(RESUME_POLL_S)
            return subscriber
    except TimeoutError:
        return None
