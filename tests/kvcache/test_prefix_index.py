"""Finding the longest published prefix of a prompt from hash-chain links alone."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.layout import KVLayout
from sidecar.kvcache.naming import MAX_CHUNKS, PromptName, chunk_count, prompt_id
from sidecar.kvcache.prefix_index import (
    MAX_CHUNK_SIZES_PER_MODEL,
    ChunkSizeLimitError,
    PrefixIndex,
    PrefixMatch,
)

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=2)


def catalog(tokens: list[int], chunk_size: int = 4, model: str = "m") -> Catalog:
    return Catalog.for_prompt(model, LAYOUT, tokens, {"int8": None}, chunk_size)


def name(tokens: list[int], chunk_size: int = 4, model: str = "m") -> PromptName:
    return PromptName(model, prompt_id(tokens, chunk_size))


def test_exact_prompt_is_found_whole() -> None:
    index = PrefixIndex()
    index.add_catalog(catalog(list(range(10))))
    assert index.lookup("m", list(range(10))) == PrefixMatch(name(list(range(10))), 4, 3, 10)


def test_a_longer_query_loads_the_published_whole_chunks() -> None:
    index = PrefixIndex()
    published = list(range(10))
    index.add_catalog(catalog(published))
    assert index.lookup("m", [*range(10), 99]) == PrefixMatch(name(published), 4, 2, 8)
    assert index.lookup("m", [*range(8), 99]) == PrefixMatch(name(published), 4, 2, 8)
    assert index.lookup("m", [*range(6), 99]) == PrefixMatch(name(published), 4, 1, 4)
    assert index.lookup("m", [99, *range(1, 10)]) is None


def test_a_shorter_query_loads_from_a_longer_prompt() -> None:
    index = PrefixIndex()
    index.add_catalog(catalog(list(range(20))))
    assert index.lookup("m", list(range(8))) == PrefixMatch(name(list(range(20))), 4, 2, 8)
    # A partial last chunk of the query is not covered by any link of the prompt.
    assert index.lookup("m", list(range(10))) == PrefixMatch(name(list(range(20))), 4, 2, 8)


def test_models_and_chunk_sizes_do_not_mix() -> None:
    index = PrefixIndex()
    index.add_catalog(catalog(list(range(8)), model="a"))
    index.add_catalog(catalog(list(range(8)), chunk_size=2, model="b"))
    assert index.lookup("c", list(range(8))) is None
    assert index.lookup("a", list(range(8))) == PrefixMatch(name(list(range(8)), 4, "a"), 4, 2, 8)
    match = PrefixMatch(name(list(range(8)), 2, "b"), 2, 4, 8)
    assert index.lookup("b", list(range(8))) == match


def test_the_chunk_size_that_covers_more_wins() -> None:
    index = PrefixIndex()
    index.add_catalog(catalog(list(range(8)), chunk_size=8))
    index.add_catalog(catalog([*range(6), 9, 9], chunk_size=2))
    assert index.lookup("m", [*range(7), 5]) == PrefixMatch(name([*range(6), 9, 9], 2), 2, 3, 6)
    assert index.lookup("m", list(range(8))) == PrefixMatch(name(list(range(8)), 8), 8, 1, 8)


def test_the_most_recently_learned_prompt_wins_a_tie() -> None:
    index = PrefixIndex()
    first, second = [*range(4), 7], [*range(4), 8]
    index.add_catalog(catalog(first))
    index.add_catalog(catalog(second))
    assert index.lookup("m", list(range(4))).prompt == name(second)  # type: ignore[union-attr]
    index.add_catalog(catalog(first))
    assert index.lookup("m", list(range(4))).prompt == name(first)  # type: ignore[union-attr]


def test_removed_prompts_are_forgotten() -> None:
    index = PrefixIndex()
    index.add_catalog(catalog(list(range(8))))
    index.add_catalog(catalog(list(range(4))))
    index.remove(name(list(range(8))))
    index.remove(name([5]))
    assert index.lookup("m", list(range(8))) == PrefixMatch(name(list(range(4))), 4, 1, 4)
    index.remove(name(list(range(4))))
    assert index.lookup("m", list(range(8))) is None
    assert len(index) == 0


def test_the_oldest_prompts_are_evicted_past_the_link_cap() -> None:
    index = PrefixIndex(max_links=MAX_CHUNKS)
    old, new = list(range(MAX_CHUNKS // 2 + 1)), list(range(1, MAX_CHUNKS // 2 + 2))
    index.add_catalog(catalog(old, chunk_size=1))
    index.add_catalog(catalog(new, chunk_size=1))
    assert len(index) == 1
    assert index.lookup("m", old) is None
    assert index.lookup("m", new) == PrefixMatch(name(new, 1), 1, len(new), len(new))
    with pytest.raises(ValueError):
        PrefixIndex(max_links=MAX_CHUNKS - 1)


def test_chunk_sizes_per_model_are_bounded() -> None:
    index = PrefixIndex()
    for chunk_size in range(1, MAX_CHUNK_SIZES_PER_MODEL + 1):
        index.add_catalog(catalog([1, 2], chunk_size))
    with pytest.raises(ChunkSizeLimitError):
        index.add_catalog(catalog([1, 2], MAX_CHUNK_SIZES_PER_MODEL + 1))
    with pytest.raises(ChunkSizeLimitError):
        index.add_catalog(catalog([5, 6], 9))
    assert index.lookup("m", [5, 6]) is None
    # The bound is per model, and a chunk size is free again once its last prompt is gone.
    index.add_catalog(catalog([1, 2], 9, model="other"))
    index.add_catalog(catalog([3, 4], 1))
    index.remove(name([1, 2], 1))
    index.remove(name([3, 4], 1))
    index.add_catalog(catalog([5, 6], 9))
    assert index.lookup("m", [5, 6]) == PrefixMatch(name([5, 6], 9), 9, 1, 2)


def test_an_empty_query_matches_nothing() -> None:
    index = PrefixIndex()
    index.add_catalog(catalog([1]))
    assert index.lookup("m", []) is None


@dataclass(frozen=True)
class Published:
    model: str
    tokens: tuple[int, ...]
    chunk_size: int


def reference_tokens(p: Published, query: list[int]) -> int:
    """Loadable tokens computed on the token ids themselves, as the hashes must agree."""
    cs, shared = p.chunk_size, 0
    while (
        shared * cs < min(len(p.tokens), len(query))
        and list(p.tokens[shared * cs : (shared + 1) * cs])
        == query[shared * cs : (shared + 1) * cs]
    ):
        shared += 1
    return min(shared * cs, len(query))


published_prompts = st.builds(
    Published,
    st.sampled_from(["a", "b"]),
    st.lists(st.integers(0, 1), min_size=1, max_size=12).map(tuple),
    st.sampled_from([2, 3]),
)


@settings(max_examples=200)
@given(
    st.lists(published_prompts, max_size=8),
    st.sampled_from(["a", "b"]),
    st.lists(st.integers(0, 1), min_size=1, max_size=14),
)
def test_lookup_agrees_with_a_reference_on_the_tokens(
    prompts: list[Published], model: str, query: list[int]
) -> None:
    index = PrefixIndex()
    for p in prompts:
        index.add_catalog(catalog(list(p.tokens), p.chunk_size, p.model))
    learned = {name(list(p.tokens), p.chunk_size, p.model): p for p in prompts}
    best = max(
        (reference_tokens(p, query) for p in learned.values() if p.model == model), default=0
    )
    match = index.lookup(model, query)
    if best == 0:
        assert match is None
        return
    assert match is not None and match.tokens == best
    assert reference_tokens(learned[match.prompt], query) == best
    assert match.chunks == chunk_count(best, match.chunk_size)
