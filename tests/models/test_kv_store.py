"""The KV disk cache: exact round trip, and a damaged file is detected and extracted again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from sidecar.models import kv_store
from sidecar.models.corpus import pydoc_token_ids
from sidecar.models.kv import extract_kv

pytestmark = pytest.mark.model

TOKENS = 24


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KVMOQ_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_cached_kv_is_the_extracted_kv(smollm2: PreTrainedModel, cache_dir: Path) -> None:
    ids = pydoc_token_ids(TOKENS)
    first = kv_store.cached_kv(ids)
    path = kv_store.cache_path(ids)
    assert path.parent == cache_dir and path.exists()
    kv, last_logits = extract_kv(smollm2, ids)
    assert torch.equal(first.kv, kv) and torch.equal(first.last_logits, last_logits)
    assert first.token_ids == tuple(ids)
    from_disk = kv_store.read_kv_file(path, ids)
    assert torch.equal(from_disk.kv, kv)


def test_key_depends_on_the_tokens(cache_dir: Path) -> None:
    assert kv_store.cache_path(pydoc_token_ids(TOKENS)) != kv_store.cache_path(
        pydoc_token_ids(TOKENS + 1)
    )


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_corrupted_file_is_detected_and_reextracted(cache_dir: Path) -> None:
    ids = pydoc_token_ids(TOKENS)
    original = kv_store.cached_kv(ids)
    path = kv_store.cache_path(ids)
    _flip_last_byte(path)
    with pytest.raises(kv_store.CorruptCacheError, match="SHA-256"):
        kv_store.read_kv_file(path, ids)
    again = kv_store.cached_kv(ids)
    assert torch.equal(again.kv, original.kv)
    assert torch.equal(kv_store.read_kv_file(path, ids).kv, original.kv)


def test_truncated_file_is_detected(cache_dir: Path) -> None:
    ids = pydoc_token_ids(TOKENS)
    kv_store.cached_kv(ids)
    path = kv_store.cache_path(ids)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(kv_store.CorruptCacheError, match="unreadable"):
        kv_store.read_kv_file(path, ids)


def test_file_of_another_prompt_is_rejected(cache_dir: Path) -> None:
    ids = pydoc_token_ids(TOKENS)
    kv_store.cached_kv(ids)
    other = [*ids[:-1], ids[-1] + 1]
    with pytest.raises(kv_store.CorruptCacheError, match="different prompt"):
        kv_store.read_kv_file(kv_store.cache_path(ids), other)


@pytest.mark.slow
def test_shared_prompt_fixture(pydoc_kv: kv_store.PromptKV) -> None:
    assert pydoc_kv.kv.shape == (30, 2, 4096, 3, 64)
    assert pydoc_kv.token_ids == tuple(pydoc_token_ids(4096))
