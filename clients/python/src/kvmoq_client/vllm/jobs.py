"""What the scheduler-side connector tells the worker-side one each step: loads to start and
prompts to publish. Plain dataclasses: vLLM sends them between processes."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass(frozen=True)
class LoadJob:
    """Load the KV of `token_ids` (a prompt's leading tokens: whole chunks, or the whole
    prompt) and write its first `tokens` into `block_ids` (vLLM's, one per block it loads,
    the last one partly used where `tokens` ends inside it); blocks before `first_block`
    vLLM already holds. `token_ids` runs past `tokens` to the end of the chunk that holds
    the prompt's last token, which vLLM computes."""

    request_id: str
    token_ids: list[int]
    block_ids: list[int]
    first_block: int
    tokens: int
    tracks: tuple[str, ...] = ()
    """The request's own choice of tracks, best first; empty: the connector's."""
    deadline: float | None = None
    """The request's own load deadline, seconds (the connector's bounds it); None: the
    connector's."""
    max_kl: float | None = None
    """The request's own quality floor; None: the connector's."""


@dataclass(frozen=True)
class SaveJob:
    """Publish a prompt whose KV is complete in `block_ids` after this step's forward."""

    request_id: str
    token_ids: list[int]
    block_ids: list[int]


@dataclass
class StepJobs(KVConnectorMetadata):
    loads: list[LoadJob] = field(default_factory=list)
    saves: list[SaveJob] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    """Requests finished while the sidecar may still read their blocks in place: vLLM frees
    those blocks once the worker names the request in its finished sends."""
    computed_tokens: int = 0
    """Tokens this step's forward computes: the worker times prefill steps (`ComputeRate`)."""

    @property
    def idle(self) -> bool:
        """Nothing is computed this step. vLLM steps with nothing to compute while a request
        waits for its KV, only to ask whether the load is done; the worker may then wait a
        little for it instead of answering at once, or that loop takes the cores the sidecar
        loads with (on a 2-core machine it halved the speed of a load)."""
        return self.computed_tokens == 0
