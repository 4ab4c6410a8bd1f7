"""Request messages built from plain Python values, shared by the sync and asyncio clients."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence

from kvmoq_client.v1 import kv_cache_pb2


def token_slots(start: int, end: int) -> kv_cache_pb2.KVLocation:
    """Slots `[start, end)` of contiguous buffers, holding the request's tokens in order."""
    return kv_cache_pb2.KVLocation(token_range=kv_cache_pb2.TokenRange(start=start, end=end))


def paged_blocks(block_ids: Iterable[int]) -> kv_cache_pb2.KVLocation:
    """Paged blocks: token i of the request is in `block_ids[i // block_size]`."""
    return kv_cache_pb2.KVLocation(blocks=kv_cache_pb2.BlockList(block_ids=list(block_ids)))


def publish_request(
    buffer_set_id: str,
    token_ids: Sequence[int],
    source: kv_cache_pb2.KVLocation,
    tracks: Sequence[str],
    default_track: str,
) -> kv_cache_pb2.PublishRequest:
    return kv_cache_pb2.PublishRequest(
        buffer_set_id=buffer_set_id,
        token_ids=list(token_ids),
        source=source,
        tracks=list(tracks),
        default_track=default_track,
    )


def lookup_request(
    buffer_set_id: str, token_ids: Sequence[int], max_kl: float | None = None
) -> kv_cache_pb2.LookupRequest:
    return kv_cache_pb2.LookupRequest(
        buffer_set_id=buffer_set_id, token_ids=list(token_ids), max_kl=_kl_bound(max_kl)
    )


def load_request(
    buffer_set_id: str,
    token_ids: Sequence[int],
    destination: kv_cache_pb2.KVLocation,
    tracks: Sequence[str],
    held_tokens: int = 0,
    relay_wait: float | None = None,
    write_tokens: int = 0,
    max_kl: float | None = None,
    compute_tokens_per_second: float | None = None,
    deadline: float | None = None,
) -> kv_cache_pb2.LoadRequest:
    rate = compute_tokens_per_second
    if rate is not None and not 0 < rate < float("inf"):
        raise ValueError(f"compute_tokens_per_second is a rate > 0, got {rate}")
    request = kv_cache_pb2.LoadRequest(
        buffer_set_id=buffer_set_id,
        token_ids=list(token_ids),
        destination=destination,
        tracks=list(tracks),
        held_tokens=held_tokens,
        write_tokens=write_tokens,
        max_kl=_kl_bound(max_kl),
        compute_tokens_per_second=rate or 0.0,
    )
    if relay_wait is not None:
        if not 0 <= relay_wait < float("inf"):
            raise ValueError(f"relay_wait is seconds >= 0, got {relay_wait}")
        request.relay_wait.FromNanoseconds(round(relay_wait * 1e9))
    if deadline is not None:
        if not 0 <= deadline < math.inf:
            raise ValueError(f"deadline is seconds from now >= 0, got {deadline}")
        request.deadline.FromNanoseconds(round((time.time() + deadline) * 1e9))
    return request


ANSWER_GRACE_S = 2.0
"""How long past a load's own deadline its call waits for the sidecar's answer. The sidecar
stops the load at the deadline and says what it wrote; on a busy CPU its loop may run that
late, and a call that times out first says nothing, so every loaded token is computed again."""


def load_call_timeout(
    timeout: float | None, deadline: float | None, default: float | None
) -> float | None:
    """A Load call's gRPC timeout: `timeout` where given, else `ANSWER_GRACE_S` past the
    load's `deadline`, else the client's `default`."""
    if timeout is not None:
        return timeout
    if deadline is not None:
        return deadline + ANSWER_GRACE_S
    return default


def _kl_bound(max_kl: float | None) -> float:
    """A quality floor on the wire: 0 for None (the sidecar's own)."""
    if max_kl is None:
        return 0.0
    if not max_kl > 0:
        raise ValueError(f"max_kl is a KL bound > 0 (inf: none), got {max_kl}")
    return max_kl


def no_finish(buffer_set_id: str) -> str:
    """The message for a Load stream that ended without its LoadFinished."""
    return f"the load into buffer set {buffer_set_id} ended without a LoadFinished"
