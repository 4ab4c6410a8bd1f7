"""A long, deterministic, real English text: CPython's pydoc topics.

Every Python install carries `pydoc_data.topics` (about 465k characters of reference
documentation), so tests and benchmarks get the same real prose and code on every machine
without downloading a data set.
"""

from __future__ import annotations

import functools
from pydoc_data.topics import topics

from sidecar.models.smollm2 import load_tokenizer


def pydoc_text() -> str:
    """All topics, sorted by name so the order never depends on dict insertion."""
    return "\n\n".join(topics[name] for name in sorted(topics))


@functools.cache
def _all_token_ids() -> tuple[int, ...]:
    # Tokenized whole and sliced, so a shorter prompt is always a prefix of a longer one.
    return tuple(load_tokenizer()(pydoc_text(), add_special_tokens=False)["input_ids"])


def pydoc_token_ids(num_tokens: int) -> list[int]:
    """The first `num_tokens` tokens of the pydoc text."""
    ids = _all_token_ids()
    if not 0 < num_tokens <= len(ids):
        raise ValueError(f"num_tokens must be in 1..{len(ids)}, got {num_tokens}")
    return list(ids[:num_tokens])
