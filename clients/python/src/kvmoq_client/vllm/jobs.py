"""What the scheduler-side connector tells the worker-side one each step: loads to start and
prompts to publish. Plain dataclasses: vLLM sends them between processes."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass(frozen=True)
class LoadJob:
    """Load the KV of `token_ids` (a prompt's leading tokens, whole blocks) into `block_ids`
    (vLLM's, one per block of `token_ids`); blocks before `first_block` vLLM already holds."""

    request_id: str
    token_ids: list[int]
    block_ids: list[int]
    first_block: int
    tracks: tuple[str, ...] = ()
    """The request's own choice of tracks, best first; empty: the connector's."""


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
