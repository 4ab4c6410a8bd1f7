"""The corpus texts: long, deterministic, of different kinds, and every shorter prompt a prefix."""

from __future__ import annotations

import pytest

from sidecar.models.corpus import TEXTS, pydoc_text, pydoc_token_ids, text_token_ids
from sidecar.models.quality import PLACES
from sidecar.models.smollm2 import load_tokenizer

QUALITY_TOKENS = max(place.context + place.score for place in PLACES) + 1
"""The longest prompt the quality harness reads (its last token is only a target)."""


def test_text_is_long_and_stable() -> None:
    text = pydoc_text()
    assert len(text) > 100_000
    assert text == pydoc_text()


def test_token_ids_are_prefixes_and_decode_to_the_text() -> None:
    long_ids = pydoc_token_ids(4096 + 1024 + 1)
    assert len(long_ids) == 5121
    assert pydoc_token_ids(128) == long_ids[:128]
    assert pydoc_text().startswith(load_tokenizer().decode(long_ids[:200]))


@pytest.mark.parametrize("name", list(TEXTS))
def test_every_text_is_long_enough_for_the_quality_harness(name: str) -> None:
    ids = text_token_ids(name, QUALITY_TOKENS)
    assert text_token_ids(name, 128) == ids[:128]
    assert TEXTS[name]().startswith(load_tokenizer().decode(ids[:100]))


def test_the_texts_differ_in_kind() -> None:
    code, legal = TEXTS["code"](), TEXTS["legal"]()
    assert "def " in code and "class " in code
    assert "GNU GENERAL PUBLIC LICENSE" in legal
    assert len({text_token_ids(name, 64)[0] for name in TEXTS}) == len(TEXTS)


@pytest.mark.parametrize("bad", [0, -1, 10**7])
def test_out_of_range_length_is_rejected(bad: int) -> None:
    with pytest.raises(ValueError):
        pydoc_token_ids(bad)


def test_unknown_text_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown text"):
        text_token_ids("poetry", 10)
