"""Which of a load's vLLM blocks may be handed to vLLM, from what the sidecar reported.

The one rule between a LoadFinished and vLLM's `get_block_ids_with_load_errors`: a block
counts as loaded only when one reported range covers every token of the load that it holds
(the last block may hold fewer than a block's worth); every other block of the load is
failed, and vLLM recomputes it. Apart from the worker so that it is tested without vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class TokenRange(Protocol):
    """`start` inclusive, `end` exclusive (the proto's TokenRange)."""

    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


def loaded_blocks(
    loaded: Iterable[TokenRange], first_block: int, blocks: int, tokens: int, block_size: int
) -> list[int]:
    """Indexes, among the load's `blocks` (vLLM holds those before `first_block`), of the
    blocks whose every token under `tokens` lies in one range of `loaded`."""
    ranges = list(loaded)
    return [
        index
        for index in range(first_block, blocks)
        if any(
            r.start <= index * block_size and min((index + 1) * block_size, tokens) <= r.end
            for r in ranges
        )
    ]
