"""Request messages built from plain Python values, shared by the sync and asyncio clients."""

from __future__ import annotations

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
    return request


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
