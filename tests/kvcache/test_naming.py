"""Namespace, track names and the hash chain that names prompts."""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.kvcache.naming import (
    CATALOG_TRACK,
    CHAIN_TAG,
    MAX_CHUNKS,
    MAX_FULL_TRACK_NAME,
    MAX_MODEL_NAME_BYTES,
    MAX_TOKENS,
    NAMESPACE_ROOT,
    PAYLOAD_TRACKS,
    TRACK_NAMES,
    NamingError,
    PromptName,
    check_model_name,
    chunk_count,
    chunk_links,
    namespace_prefix,
    prompt_id,
)

# Test vector, also in docs/wire-format.md ("Naming and catalog").
VECTOR_TOKENS = [1, 2, 3, 4, 5]
VECTOR_CHUNK_SIZE = 4
VECTOR_PROMPT_ID = "03aaa7d066fddc5f48024e93d48c23cdb66298c302ea17bf52ede8cc4bfc84b2"

token_lists = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300)
chunk_sizes = st.integers(1, 64)


def test_prompt_id_vector() -> None:
    assert prompt_id(VECTOR_TOKENS, VECTOR_CHUNK_SIZE) == VECTOR_PROMPT_ID


def test_chain_follows_the_documented_construction() -> None:
    tail = CHAIN_TAG + struct.pack("<I", 4)
    link0 = hashlib.sha256(bytes(32) + tail + struct.pack("<4I", 1, 2, 3, 4)).digest()
    link1 = hashlib.sha256(link0 + tail + struct.pack("<I", 5)).digest()
    assert CHAIN_TAG == b"kvcache.moq.arpa/v1 chunk"
    assert chunk_links(VECTOR_TOKENS, 4) == [link0, link1]
    assert link1.hex() == VECTOR_PROMPT_ID


def test_a_keyed_chain_is_hmac_of_the_same_input_and_keeps_shared_prefixes() -> None:
    key = b"kvmoq test key 0"
    tail = CHAIN_TAG + struct.pack("<I", 4)
    link0 = hmac.new(key, bytes(32) + tail + struct.pack("<4I", 1, 2, 3, 4), "sha256").digest()
    link1 = hmac.new(key, link0 + tail + struct.pack("<I", 5), "sha256").digest()
    assert chunk_links(VECTOR_TOKENS, 4, key) == [link0, link1]
    assert prompt_id(VECTOR_TOKENS, 4, key) == link1.hex() != VECTOR_PROMPT_ID
    assert prompt_id(VECTOR_TOKENS, 4, b"another key 0123") != link1.hex()
    longer = chunk_links([*VECTOR_TOKENS[:4], 9, 9], 4, key)
    assert longer[0] == link0 and longer[1] != link1  # same first chunk, same first link


def shared_chunks(a: list[int], b: list[int], chunk_size: int) -> int:
    """Reference on the tokens themselves: leading chunks equal in content and length."""
    n = 0
    while n * chunk_size < min(len(a), len(b)) and (
        a[n * chunk_size : (n + 1) * chunk_size] == b[n * chunk_size : (n + 1) * chunk_size]
    ):
        n += 1
    return n


small_tokens = st.lists(st.integers(0, 3), max_size=40)


@given(small_tokens, small_tokens, small_tokens, st.integers(1, 8))
def test_links_agree_exactly_on_the_shared_whole_chunks(
    prefix: list[int], tail_a: list[int], tail_b: list[int], chunk_size: int
) -> None:
    a, b = prefix + tail_a, prefix + tail_b
    if not a or not b:
        return
    n = shared_chunks(a, b, chunk_size)
    links_a, links_b = chunk_links(a, chunk_size), chunk_links(b, chunk_size)
    agree = [x == y for x, y in zip(links_a, links_b, strict=False)]
    assert agree == [True] * n + [False] * (len(agree) - n)


@given(token_lists, chunk_sizes)
def test_chunk_size_is_part_of_every_link(tokens: list[int], chunk_size: int) -> None:
    assert not set(chunk_links(tokens, chunk_size)) & set(chunk_links(tokens, chunk_size + 1))


@given(token_lists, chunk_sizes)
def test_one_link_per_chunk_and_the_id_is_the_last(tokens: list[int], chunk_size: int) -> None:
    links = chunk_links(tokens, chunk_size)
    assert len(links) == chunk_count(len(tokens), chunk_size) == -(-len(tokens) // chunk_size)
    assert prompt_id(tokens, chunk_size) == links[-1].hex()


@pytest.mark.parametrize("bad", [[-1], [2**32], [1.0], ["1"], [None]])
def test_token_ids_must_be_u32(bad: list[object]) -> None:
    with pytest.raises(NamingError):
        chunk_links(bad)  # type: ignore[arg-type]


def test_largest_token_id_is_accepted() -> None:
    assert len(chunk_links([2**32 - 1])) == 1


@pytest.mark.parametrize(
    ("count", "chunk_size"), [(0, 128), (MAX_TOKENS + 1, 128), (MAX_CHUNKS + 1, 1)]
)
def test_token_and_chunk_counts_are_bounded(count: int, chunk_size: int) -> None:
    # A range is a cheap Sequence: the bounds are checked before any token is hashed.
    with pytest.raises(NamingError):
        chunk_links(range(count), chunk_size)


@pytest.mark.parametrize("chunk_size", [0, -1, 4097, True, 1.5])
def test_chunk_size_is_bounded(chunk_size: object) -> None:
    with pytest.raises(NamingError):
        chunk_count(10, chunk_size)  # type: ignore[arg-type]


def test_track_names() -> None:
    assert PAYLOAD_TRACKS == ("fp16", "bf16", "fp8", "int8", "fp4", "int4", "ac")
    assert CATALOG_TRACK == "catalog"
    assert TRACK_NAMES == ("fp16", "bf16", "fp8", "int8", "fp4", "int4", "ac", "catalog")


def test_longest_model_name_fills_the_draft14_budget_exactly() -> None:
    name = PromptName("m" * MAX_MODEL_NAME_BYTES, VECTOR_PROMPT_ID)
    longest_track = max(len(t) for t in TRACK_NAMES)
    assert sum(map(len, name.namespace())) + longest_track == MAX_FULL_TRACK_NAME
    with pytest.raises(NamingError):
        check_model_name("m" * (MAX_MODEL_NAME_BYTES + 1))


def test_model_name_budget_counts_utf8_bytes() -> None:
    check_model_name("é" * (MAX_MODEL_NAME_BYTES // 2))
    with pytest.raises(NamingError):
        check_model_name("é" * (MAX_MODEL_NAME_BYTES // 2 + 1))


@pytest.mark.parametrize("model", ["", "a\nb", "tab\there", "\ud800", b"bytes"])
def test_model_names_must_be_printable_text(model: object) -> None:
    with pytest.raises(NamingError):
        check_model_name(model)  # type: ignore[arg-type]
    with pytest.raises(NamingError):
        namespace_prefix(model)  # type: ignore[arg-type]


@given(
    st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "S")), min_size=1, max_size=64),
    token_lists,
)
def test_namespace_round_trip(model: str, tokens: list[int]) -> None:
    name = PromptName(model, prompt_id(tokens))
    fields = name.namespace()
    assert fields[0] == NAMESPACE_ROOT.encode() == b"kvcache.moq.arpa/v1"
    assert fields[:2] == namespace_prefix(model) == (fields[0], model.encode())
    assert PromptName.from_namespace(fields) == name


@pytest.mark.parametrize(
    "fields",
    [
        (),
        (b"kvcache.moq.arpa/v1", b"m"),
        (b"kvcache.moq.arpa/v2", b"m", VECTOR_PROMPT_ID.encode()),
        (b"kvcache.moq.arpa/v1", b"m", VECTOR_PROMPT_ID.encode(), b"extra"),
        (b"kvcache.moq.arpa/v1", b"m", VECTOR_PROMPT_ID.upper().encode()),
        (b"kvcache.moq.arpa/v1", b"m", VECTOR_PROMPT_ID[:-1].encode()),
        (b"kvcache.moq.arpa/v1", b"m", VECTOR_PROMPT_ID[:-1].encode() + b"\xff"),
        (b"kvcache.moq.arpa/v1", b"\xff\xfe", VECTOR_PROMPT_ID.encode()),
        (b"kvcache.moq.arpa/v1", b"", VECTOR_PROMPT_ID.encode()),
        (b"kvcache.moq.arpa/v1", b"m" * (MAX_MODEL_NAME_BYTES + 1), VECTOR_PROMPT_ID.encode()),
    ],
)
def test_foreign_or_malformed_namespaces_are_rejected(fields: tuple[bytes, ...]) -> None:
    with pytest.raises(NamingError):
        PromptName.from_namespace(fields)
