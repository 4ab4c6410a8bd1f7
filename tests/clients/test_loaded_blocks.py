"""The connector's rule for which blocks of a load vLLM may use and which it recomputes
(`kvmoq_client.vllm.blocks`), on the ranges a LoadFinished reports."""

from __future__ import annotations

from kvmoq_client.v1 import kv_cache_pb2
from kvmoq_client.vllm.blocks import loaded_blocks

SIZE = 16


def ranges(*spans: tuple[int, int]) -> list[kv_cache_pb2.TokenRange]:
    return [kv_cache_pb2.TokenRange(start=start, end=end) for start, end in spans]


def test_a_whole_load_hands_over_every_block_after_those_vllm_holds() -> None:
    assert loaded_blocks(ranges((0, 64)), 1, 4, 64, SIZE) == [1, 2, 3]


def test_a_block_with_one_token_missing_is_failed() -> None:
    # Chunk 2 (tokens 32-47) was rejected: block 2 fails, and so does a block cut by a hole.
    assert loaded_blocks(ranges((0, 32), (48, 64)), 0, 4, 64, SIZE) == [0, 1, 3]
    assert loaded_blocks(ranges((0, 40)), 0, 4, 64, SIZE) == [0, 1]


def test_the_last_block_counts_only_the_tokens_of_the_load() -> None:
    # 50 tokens: block 3 holds 2 of them; the load need not cover past token 50.
    assert loaded_blocks(ranges((0, 50)), 0, 4, 50, SIZE) == [0, 1, 2, 3]
    assert loaded_blocks(ranges((0, 49)), 0, 4, 50, SIZE) == [0, 1, 2]


def test_a_block_across_two_ranges_is_failed() -> None:
    """Ranges are what the sidecar wrote and verified chunk by chunk; a block straddling
    two of them is only whole if one covers it (the sidecar merges adjacent ranges)."""
    assert loaded_blocks(ranges((0, 24), (24, 64)), 0, 4, 64, SIZE) == [0, 2, 3]


def test_nothing_reported_fails_every_block() -> None:
    assert loaded_blocks([], 0, 4, 64, SIZE) == []
