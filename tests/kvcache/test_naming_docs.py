"""The test vectors printed in docs/wire-format.md are the ones the code produces."""

from __future__ import annotations

from pathlib import Path

from sidecar.kvcache.catalog import payload_digest
from sidecar.kvcache.naming import chunk_links
from tests.support.vectors import VECTOR_INT8_CHUNK0, vector_catalog

DOC = Path(__file__).parents[2] / "docs" / "wire-format.md"


def naming_section() -> str:
    text = DOC.read_text()
    start = text.index("\n## Naming and catalog\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_documented_vectors_match_the_code() -> None:
    section = naming_section()
    for link in chunk_links([1, 2, 3, 4, 5], 4):
        assert link.hex() in section
    for link in chunk_links([1, 2, 3, 4, 5], 4, b"kvmoq test key 0"):  # keyed
        assert link.hex() in section
    assert payload_digest(VECTOR_INT8_CHUNK0).hex() in section
    catalog = vector_catalog().encode()
    assert f"\n{catalog.decode()}\n" in section
    assert f"{len(catalog)} bytes" in section
