"""The pydoc prompt: long, deterministic, and every shorter prompt a prefix of a longer one."""

from __future__ import annotations

import pytest

from sidecar.models.corpus import pydoc_text, pydoc_token_ids
from sidecar.models.smollm2 import load_tokenizer


def test_text_is_long_and_stable() -> None:
    text = pydoc_text()
    assert len(text) > 100_000
    assert text == pydoc_text()


def test_token_ids_are_prefixes_and_decode_to_the_text() -> None:
    long_ids = pydoc_token_ids(4096 + 1024 + 1)
    assert len(long_ids) == 5121
    assert pydoc_token_ids(128) == long_ids[:128]
    assert pydoc_text().startswith(load_tokenizer().decode(long_ids[:200]))


@pytest.mark.parametrize("bad", [0, -1, 10**7])
def test_out_of_range_length_is_rejected(bad: int) -> None:
    with pytest.raises(ValueError):
        pydoc_token_ids(bad)
