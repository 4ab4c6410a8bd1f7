"""SmolLM2 as a model server on both ends: one publishes its prompt's cache after prefill
through its sidecar, another loads it through its own sidecar and the relay, and
`generate()` continues from the loaded cache with the same text as after recomputing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kvmoq_client import KVCacheClient
from kvmoq_client.dynamic_cache import cache_from_kv, kv_from_cache
from kvmoq_client.transformers_cache import TransformersKV
from kvmoq_client.v1 import kv_cache_pb2 as pb
from transformers import PreTrainedModel

from sidecar.models.corpus import pydoc_text
from sidecar.models.smollm2 import MODEL_NAME, load_tokenizer
from tests.support.sidecar import SidecarProcess

PROMPT_TOKENS = 150
NEW_TOKENS = 24


@pytest.mark.slow
@pytest.mark.model
def test_the_conversion_round_trips_a_real_cache(smollm2: PreTrainedModel) -> None:
    ids = load_tokenizer()(pydoc_text()[:400], add_special_tokens=False)["input_ids"][:40]
    with torch.inference_mode():
        cache = smollm2(torch.tensor([ids]), use_cache=True).cache
    kv = kv_from_cache(cache)
    assert kv.shape == (30, 2, len(ids), 3, 64)
    assert torch.equal(kv_from_cache(cache_from_kv(kv, smollm2.config)), kv)
    with pytest.raises(ValueError, match="does not fit a 30-layer model"):
        cache_from_kv(kv[:29], smollm2.config)


@pytest.mark.slow
@pytest.mark.model
def test_generation_after_loading_matches_recompute(
    smollm2: PreTrainedModel, prefill: SidecarProcess, decode: SidecarProcess, shm: Path
) -> None:
    tokenizer = load_tokenizer()
    ids = tokenizer(pydoc_text()[:2000], add_special_tokens=False)["input_ids"][:PROMPT_TOKENS]
    input_ids = torch.tensor([ids])
    greedy = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "pad_token_id": 0}
    recomputed = smollm2.generate(input_ids, **greedy)[0, len(ids) :]

    with (
        KVCacheClient(prefill.grpc, timeout=120) as prefill_client,
        KVCacheClient(decode.grpc, timeout=120) as decode_client,
        TransformersKV(prefill_client, smollm2, MODEL_NAME, 256, shm) as publisher,
        TransformersKV(decode_client, smollm2, MODEL_NAME, 256, shm) as loader,
    ):
        with torch.inference_mode():
            prompt_cache = smollm2(input_ids, use_cache=True).cache
        publisher.publish(ids, prompt_cache, tracks=["fp16"], default_track="fp16")
        loaded = loader.load(ids, tracks=["fp16"])

    assert loaded.finished.stop_reason == pb.STOP_REASON_COMPLETE
    assert loaded.finished.prefix_tokens == len(ids)
    assert loaded.tokens == len(ids) - 1  # the last one is computed for its logits
    assert loaded.cache is not None
    expected = kv_from_cache(prompt_cache)[:, :, : loaded.tokens]
    assert torch.allclose(kv_from_cache(loaded.cache), expected, rtol=1e-3, atol=1e-3)

    continued = smollm2.generate(input_ids, cache=loaded.cache, **greedy)[0, len(ids) :]
    # generate() extended the loaded cache rather than recomputing the prompt into a new one.
    assert loaded.cache.get_seq_length() == len(ids) + NEW_TOKENS - 1
    assert tokenizer.decode(continued) == tokenizer.decode(recomputed)
    assert torch.equal(continued, recomputed)
