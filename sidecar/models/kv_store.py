"""Disk cache of extracted KV caches, so tests and benchmarks prefill the model once per machine.

A 4096-token SmolLM2 prefill takes ~20 s on two cores and its fp32 KV is ~189 MB; every test
session and benchmark needs the same one. Files are safetensors (no pickle: a cache file is
data, never code), written atomically (temp file + rename), named by a key over the model
file, the library versions and the token ids, and verified against a SHA-256 of their
contents on every load: a damaged file is discarded and the KV extracted again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sidecar.log import get_logger
from sidecar.models.corpus import text_token_ids
from sidecar.models.kv import extract_kv
from sidecar.models.smollm2 import MODEL_NAME, cache_dir, load_model, model_fingerprint

FORMAT = "kvmoq-kv-cache/1"

log = get_logger(__name__)


class CorruptCacheError(ValueError):
    """A cache file that does not hold what its name and header promise."""


@dataclass(frozen=True)
class PromptKV:
    """A prompt's token ids, its KV `[layers, 2, tokens, kv_heads, head_dim]` and last logits."""

    token_ids: tuple[int, ...]
    kv: torch.Tensor
    last_logits: torch.Tensor


def _ids_tensor(token_ids: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(token_ids), dtype=torch.int64)


def cache_path(token_ids: Sequence[int]) -> Path:
    """Where the KV of `token_ids` is cached; the versions are in the key because kernels change numerics."""
    key = hashlib.sha256()
    for part in (
        FORMAT,
        model_fingerprint(),
        torch.__version__,
        importlib.metadata.version("transformers"),
    ):
        key.update(part.encode() + b"\0")
    key.update(_ids_tensor(token_ids).numpy().tobytes())
    return cache_dir() / f"{MODEL_NAME}-{len(token_ids)}-{key.hexdigest()[:32]}.safetensors"


def _content_digest(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode() + b"\0")
        digest.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# safetensors comes with the `model` extra; it is imported where used so that `kvmoq`
# (whose bench table imports this module) still starts on an install without that extra.


def write_kv_file(path: Path, prompt: PromptKV) -> None:
    import safetensors.torch

    tensors = {
        "token_ids": _ids_tensor(prompt.token_ids),
        "kv": prompt.kv.contiguous(),
        "last_logits": prompt.last_logits.contiguous(),
    }
    metadata = {"format": FORMAT, "model": MODEL_NAME, "sha256": _content_digest(tensors)}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        safetensors.torch.save_file(tensors, tmp_name, metadata=metadata)
        os.chmod(tmp_name, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def read_kv_file(path: Path, token_ids: Sequence[int]) -> PromptKV:
    """Load and verify a cache file; raise CorruptCacheError unless it is exactly what was stored."""
    import safetensors

    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not a dict)
    except (OSError, safetensors.SafetensorError) as error:
        raise CorruptCacheError(f"{path}: unreadable ({error})") from error
    if metadata.get("format") != FORMAT or set(tensors) != {"token_ids", "kv", "last_logits"}:
        raise CorruptCacheError(f"{path}: not a {FORMAT} file")
    if metadata.get("sha256") != _content_digest(tensors):
        raise CorruptCacheError(f"{path}: contents do not match their SHA-256")
    if not torch.equal(tensors["token_ids"], _ids_tensor(token_ids)):
        raise CorruptCacheError(f"{path}: holds a different prompt")
    return PromptKV(tuple(token_ids), tensors["kv"], tensors["last_logits"])


def cached_kv(token_ids: Sequence[int]) -> PromptKV:
    """The KV of `token_ids` from the disk cache, extracted (and cached) when absent or damaged."""
    path = cache_path(token_ids)
    if path.exists():
        try:
            return read_kv_file(path, token_ids)
        except CorruptCacheError as error:
            log.warning("kv_cache_discarded", path=str(path), reason=str(error))
    kv, last_logits = extract_kv(load_model(), token_ids)
    prompt = PromptKV(tuple(token_ids), kv, last_logits)
    write_kv_file(path, prompt)
    return prompt


def text_kv(text: str, num_tokens: int) -> PromptKV:
    """The KV of the first `num_tokens` tokens of a corpus text (see corpus.py)."""
    return cached_kv(text_token_ids(text, num_tokens))


def pydoc_kv(num_tokens: int) -> PromptKV:
    """The KV of the first `num_tokens` tokens of the pydoc text."""
    return text_kv("pydoc", num_tokens)
