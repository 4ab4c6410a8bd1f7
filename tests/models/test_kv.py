"""KV extraction and reload: a model that continues from a loaded KV behaves as if it had prefilled."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from sidecar.kvcache.errors import TensorError
from sidecar.kvcache.layout import KVLayout
from sidecar.models.corpus import pydoc_token_ids
from sidecar.models.kv import (
    K,
    V,
    cache_from_kv,
    extract_kv,
    forward_with_kv,
    kv_from_cache,
    kv_layout,
)

pytestmark = pytest.mark.model

PREFIX, SUFFIX = 96, 32


@pytest.fixture(scope="module")
def full_logits(smollm2: PreTrainedModel) -> torch.Tensor:
    with torch.inference_mode():
        return smollm2(torch.tensor([pydoc_token_ids(PREFIX + SUFFIX)])).logits[0]


def test_layout_of_smollm2(smollm2: PreTrainedModel) -> None:
    layout = kv_layout(smollm2)
    assert layout == KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, dtype="float32")
    assert layout.torch_dtype == smollm2.dtype


def test_extracted_kv_shape_and_determinism(smollm2: PreTrainedModel) -> None:
    ids = pydoc_token_ids(PREFIX)
    kv, last_logits = extract_kv(smollm2, ids)
    assert kv.shape == (30, 2, PREFIX, 3, 64)
    assert kv.dtype == torch.float32 and kv.is_contiguous()
    assert last_logits.shape == (smollm2.config.vocab_size,)
    assert not torch.equal(kv[:, K], kv[:, V])
    again, _ = extract_kv(smollm2, ids)
    assert torch.equal(kv, again)


def test_kv_of_a_prefix_is_a_prefix_of_the_kv(smollm2: PreTrainedModel) -> None:
    # Causal attention: what chunked publishing relies on.
    short, _ = extract_kv(smollm2, pydoc_token_ids(PREFIX // 2))
    long, _ = extract_kv(smollm2, pydoc_token_ids(PREFIX))
    torch.testing.assert_close(long[:, :, : PREFIX // 2], short, rtol=0, atol=1e-4)


def test_cache_round_trip_is_exact(smollm2: PreTrainedModel) -> None:
    kv, _ = extract_kv(smollm2, pydoc_token_ids(PREFIX))
    assert torch.equal(kv_from_cache(cache_from_kv(smollm2, kv)), kv)


def test_continuing_from_loaded_kv_matches_full_forward(
    smollm2: PreTrainedModel, full_logits: torch.Tensor
) -> None:
    ids = pydoc_token_ids(PREFIX + SUFFIX)
    kv, last_logits = extract_kv(smollm2, ids[:PREFIX])
    continued = forward_with_kv(smollm2, kv, ids[PREFIX:])
    torch.testing.assert_close(last_logits, full_logits[PREFIX - 1], rtol=0, atol=1e-3)
    torch.testing.assert_close(continued, full_logits[PREFIX:], rtol=0, atol=1e-3)
    assert torch.equal(continued.argmax(-1), full_logits[PREFIX:].argmax(-1))


def test_half_precision_kv_loads_into_fp32_model(
    smollm2: PreTrainedModel, full_logits: torch.Tensor
) -> None:
    ids = pydoc_token_ids(PREFIX + SUFFIX)
    kv, _ = extract_kv(smollm2, ids[:PREFIX])
    continued = forward_with_kv(smollm2, kv.half(), ids[PREFIX:])
    assert continued.dtype == torch.float32
    agreement = (continued.argmax(-1) == full_logits[PREFIX:].argmax(-1)).float().mean()
    assert agreement >= 0.9


def test_wrong_shape_is_rejected(smollm2: PreTrainedModel) -> None:
    with pytest.raises(TensorError, match="does not match"):
        cache_from_kv(smollm2, torch.zeros(30, 2, 4, 9, 64))
