"""The connector's scheduler side: how many leading tokens the sidecar can supply, which
blocks to load them into, and which prompts to publish once their prefill is done.

It asks the sidecar over gRPC (Lookup, in a thread) and otherwise only keeps books: the
worker side does the copying. Any failure of the sidecar is a miss, never an error of the
request.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvmoq_client.errors import SidecarError
from kvmoq_client.vllm.jobs import LoadJob, SaveJob, StepJobs
from kvmoq_client.vllm.registration import Registration

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

LOOKUP_THREADS = 4
"""Lookups under way at once; a request beyond them waits its turn (and says None)."""
TRACKS_PARAM = "kvmoq_tracks"
"""A request's `kv_transfer_params` key for the tracks its load may use, best first
(`SamplingParams(extra_args={"kv_transfer_params": {"kvmoq_tracks": ["int8"]}})`)."""


DEADLINE_PARAM = "kvmoq_deadline"
"""A request's `kv_transfer_params` key for a load deadline of its own, in seconds: shorter
than the connector's `load_deadline`, which bounds it (whoever sends requests can tighten
the operator's bound, not widen it). A caller that knows how fast the engine computes a
prompt gives its load no longer than computing it would take."""


MAX_KL_PARAM = "kvmoq_max_kl"
"""A request's `kv_transfer_params` key for a quality floor of its own (see
`KVCacheClient.load`'s `max_kl`): it replaces the connector's `max_kl`, looser or tighter,
as the answer it changes is the request's own."""


def request_max_kl(params: dict[str, Any] | None) -> float | None:
    """The quality floor a request asks for; None (the connector's) when it asks none, and
    a malformed value is logged and ignored. Infinity is a floor too: none."""
    return _positive_number(params, MAX_KL_PARAM, "a KL bound > 0", finite=False)


def request_deadline(params: dict[str, Any] | None) -> float | None:
    """The load deadline a request asks for; None (the connector's) when it asks none, and
    a malformed value is logged and ignored."""
    return _positive_number(params, DEADLINE_PARAM, "seconds > 0", finite=True)


def _positive_number(
    params: dict[str, Any] | None, key: str, expected: str, *, finite: bool
) -> float | None:
    """`params[key]` when it is a number > 0 (and finite, if asked); None when absent or,
    logged, when malformed."""
    value = (params or {}).get(key)
    if value is None:
        return None
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value > 0
        and (math.isfinite(value) or not finite)
    ):
        return float(value)
    log.warning("kvmoq: ignoring %s=%r: expected %s", key, value, expected)
    return None


def request_tracks(params: dict[str, Any] | None) -> tuple[str, ...]:
    """The tracks a request asks for; a malformed value is logged and ignored."""
    tracks = (params or {}).get(TRACKS_PARAM, ())
    if isinstance(tracks, list | tuple) and all(isinstance(t, str) for t in tracks):
        return tuple(tracks)
    log.warning("kvmoq: ignoring %s=%r: expected a list of track names", TRACKS_PARAM, tracks)
    return ()


@dataclass
class _Prefill:
    """A request whose prompt is being computed here, to publish once it is complete."""

    token_ids: list[int]
    block_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _Hit:
    local_tokens: int
    """Tokens vLLM's own prefix cache had."""
    tokens: int
    """Leading tokens this request will have after the load: every one but the last."""
    ready: int
    """Leading tokens the sidecar can load (whole chunks, or the whole prompt): past
    `tokens` when the last chunk holds the prompt's last token, which is computed here."""


class SchedulerSide:
    def __init__(
        self,
        registration: Registration,
        block_size: int,
        *,
        loads: bool,
        saves: bool,
        keep_published_blocks: bool = False,
    ) -> None:
        self._registration = registration
        self._block_size = block_size
        self._loads = loads
        self._saves = saves
        self._keep_published_blocks = keep_published_blocks
        """A GPU cache, which the sidecar reads in place: a published request's blocks stay
        allocated past its end until the worker says they were read."""
        self._publishing: set[str] = set()
        self._kept: list[str] = []
        """Requests finished since the last step whose blocks vLLM keeps for the sidecar."""
        self._pool = ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="kvmoq-lookup")
        self._lookups: dict[str, Future[int]] = {}
        self._hits: dict[str, _Hit] = {}
        self._pending: list[LoadJob] = []
        self._prefilling: dict[str, _Prefill] = {}
        self._loaded: set[str] = set()
        """Requests that load from the sidecar: not published again from here."""

    def matched_tokens(self, request: Request, local_tokens: int) -> tuple[int | None, bool]:
        """vLLM's `get_num_new_matched_tokens`: tokens to load beyond `local_tokens`, and
        whether the load is asynchronous (always: the scheduler serves others meanwhile).

        The Lookup runs in a thread: until it answers this says None ("ask again"), and the
        scheduler goes on with other requests instead of waiting on the sidecar.
        """
        if not self._loads or request.request_id in self._loaded:
            # One load per request: after a failed one vLLM may schedule the request as new,
            # and the same load would fail the same way again.
            return 0, False
        token_ids = list(request.prompt_token_ids or ())
        lookup = self._lookups.get(request.request_id)
        if lookup is None:
            self._lookups[request.request_id] = self._pool.submit(self._ready_tokens, token_ids)
            return None, False
        if not lookup.done():
            return None, False
        del self._lookups[request.request_id]
        ready = min(lookup.result(), len(token_ids))
        # The last prompt token is always computed here: its logits give the first token.
        # Every token before it is loaded, its block partly used (vLLM counts the tokens it
        # is told of, and computes the rest of that block); the chunk that holds it is still
        # fetched whole (the sidecar loads whole chunks).
        usable = min(ready, len(token_ids) - 1)
        if usable <= local_tokens:
            return 0, False
        self._hits[request.request_id] = _Hit(local_tokens, usable, ready)
        return usable - local_tokens, True

    def _ready_tokens(self, token_ids: list[int]) -> int:
        """Leading tokens of `token_ids` the sidecar can load now; 0 when it cannot answer."""
        try:
            found = self._registration.call(
                lambda set_id: self._registration.client.lookup(set_id, token_ids)
            )
        except SidecarError as exc:
            log.warning("kvmoq lookup failed, computing the prompt: %s", exc)
            return 0
        return int(found.ready_tokens)

    def allocated(self, request: Request, blocks: KVCacheBlocks, external_tokens: int) -> None:
        """vLLM's `update_state_after_alloc`: the blocks of a hit are known, queue its load."""
        hit = self._hits.pop(request.request_id, None)
        if hit is None or external_tokens == 0:
            return
        self._loaded.add(request.request_id)
        block_ids = list(blocks.get_block_ids()[0])
        count = -(-hit.tokens // self._block_size)
        self._pending.append(
            LoadJob(
                request.request_id,
                list(request.prompt_token_ids or ())[: hit.ready],
                block_ids[:count],
                hit.local_tokens // self._block_size,
                hit.tokens,
                request_tracks(request.kv_transfer_params),
                request_deadline(request.kv_transfer_params),
                request_max_kl(request.kv_transfer_params),
            )
        )

    def step_jobs(self, output: SchedulerOutput) -> StepJobs:
        """vLLM's `build_connector_meta`: the loads queued since the last step, and the
        prompts whose prefill this step completes."""
        jobs = StepJobs(
            loads=self._pending, kept=self._kept, computed_tokens=output.total_num_scheduled_tokens
        )
        self._pending, self._kept = [], []
        if self._saves:
            jobs.saves = self._completed_prefills(output)
        return jobs

    def _completed_prefills(self, output: SchedulerOutput) -> list[SaveJob]:
        done: list[SaveJob] = []
        scheduled = output.num_scheduled_tokens
        for new in output.scheduled_new_reqs:
            if new.req_id in self._loaded:
                continue  # its prompt is published elsewhere already
            self._prefilling[new.req_id] = _Prefill(
                list(new.prompt_token_ids or ()), list(new.block_ids[0])
            )
            self._advance(new.req_id, new.num_computed_tokens + scheduled[new.req_id], done)
        cached = output.scheduled_cached_reqs
        for index, request_id in enumerate(cached.req_ids):
            prefill = self._prefilling.get(request_id)
            if prefill is None:
                continue
            new_blocks = cached.new_block_ids[index]
            if request_id in cached.resumed_req_ids:
                prefill.block_ids = list(new_blocks[0]) if new_blocks else []
            elif new_blocks:
                prefill.block_ids += new_blocks[0]
            computed = cached.num_computed_tokens[index] + scheduled.get(request_id, 0)
            self._advance(request_id, computed, done)
        return done

    def _advance(self, request_id: str, computed: int, done: list[SaveJob]) -> None:
        prefill = self._prefilling[request_id]
        if computed < len(prefill.token_ids) or not prefill.token_ids:
            return
        del self._prefilling[request_id]
        if self._keep_published_blocks:
            self._publishing.add(request_id)
        blocks = -(-len(prefill.token_ids) // self._block_size)
        done.append(SaveJob(request_id, prefill.token_ids, prefill.block_ids[:blocks]))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._registration.close()

    def finished(self, request: Request) -> bool:
        """vLLM's `request_finished`: forget the request; True when its blocks must outlive
        it, until the worker reports the sidecar's read of them done (`finished_saves`)."""
        self._prefilling.pop(request.request_id, None)
        self._lookups.pop(request.request_id, None)
        self._hits.pop(request.request_id, None)
        self._loaded.discard(request.request_id)
        if request.request_id in self._publishing:
            self._publishing.remove(request.request_id)
            self._kept.append(request.request_id)
            return True
        return False
