"""`Codec.encode` takes a chunk in batches of `ENCODE_BATCH_ELEMENTS` values: the payloads
must be those of each token encoded alone, whatever the batch boundaries."""

from __future__ import annotations

import pytest
import torch

from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.codecs.base import ENCODE_BATCH_ELEMENTS
from sidecar.kvcache.errors import TensorError
from sidecar.kvcache.layout import KVLayout

LAYOUT = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64)
"""SmolLM2-135M's: a batch is 22 of its tokens."""
TOKENS = 50
"""Three batches, the last one short."""


def _kv(tokens: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    return torch.randn(LAYOUT.shape(tokens), generator=generator).to(torch.float16)


def test_the_chunk_spans_several_batches() -> None:
    per_batch = ENCODE_BATCH_ELEMENTS // LAYOUT.elements_per_token
    assert 1 < per_batch < TOKENS and TOKENS % per_batch != 0


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_a_chunk_encodes_as_its_tokens_do_one_by_one(name: str) -> None:
    codec = get_codec(name)
    kv = _kv(TOKENS)
    tables = codec.fit_tables(LAYOUT, kv)
    alone = [codec.encode(kv[:, :, t : t + 1], LAYOUT, tables)[0] for t in range(TOKENS)]
    assert codec.encode(kv, LAYOUT, tables) == alone


@pytest.mark.parametrize("name", ["fp16", "int8", "int4"])
def test_a_bad_value_in_the_last_batch_is_refused(name: str) -> None:
    kv = _kv(TOKENS)
    kv[7, 1, TOKENS - 1, 2, 5] = float("nan")
    with pytest.raises(TensorError):
        get_codec(name).encode(kv, LAYOUT)
