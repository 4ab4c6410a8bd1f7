"""Long, deterministic, real texts of different kinds, from files every machine here has.

Quality figures depend on the text: reference prose, source code and legal prose give the
model different attention patterns, so a codec is judged on all three and by the worst. Each
text ships with Python or with Debian, so tests and benchmarks get the same real text on
every machine without downloading a data set:

* `pydoc`: CPython's pydoc topics (`pydoc_data.topics`, about 465k characters of reference
  documentation mixing prose and code examples);
* `code`: the source of the standard library's `argparse` module (about 100k characters);
* `legal`: the GNU GPL version 3 as Debian's base-files ships it (about 35k characters).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path
from pydoc_data.topics import topics

from sidecar.models.smollm2 import load_tokenizer

LEGAL_TEXT = Path("/usr/share/common-licenses/GPL-3")


def pydoc_text() -> str:
    """All topics, sorted by name so the order never depends on dict insertion."""
    return "\n\n".join(topics[name] for name in sorted(topics))


def _code_text() -> str:
    return Path(argparse.__file__).read_text(encoding="utf-8")


def _legal_text() -> str:
    if not LEGAL_TEXT.is_file():
        raise FileNotFoundError(f"{LEGAL_TEXT} is missing (Debian's base-files package ships it)")
    return LEGAL_TEXT.read_text(encoding="utf-8")


TEXTS: dict[str, Callable[[], str]] = {
    "pydoc": pydoc_text,
    "code": _code_text,
    "legal": _legal_text,
}
"""Every text by name; `pydoc` first, the one the demo and the transfer tests use."""


@functools.cache
def _all_token_ids(name: str) -> tuple[int, ...]:
    # Tokenized whole and sliced, so a shorter prompt is always a prefix of a longer one.
    return tuple(load_tokenizer()(TEXTS[name](), add_special_tokens=False)["input_ids"])


def text_token_ids(name: str, num_tokens: int) -> list[int]:
    """The first `num_tokens` tokens of the text `name` (one of `TEXTS`)."""
    if name not in TEXTS:
        raise ValueError(f"unknown text {name!r}; known: {', '.join(TEXTS)}")
    ids = _all_token_ids(name)
    if not 0 < num_tokens <= len(ids):
        raise ValueError(f"num_tokens must be in 1..{len(ids)} for {name!r}, got {num_tokens}")
    return list(ids[:num_tokens])


def pydoc_token_ids(num_tokens: int) -> list[int]:
    """The first `num_tokens` tokens of the pydoc text."""
    return text_token_ids("pydoc", num_tokens)
