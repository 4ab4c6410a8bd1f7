"""A load its deadline stopped, as the decode node judges it (`sidecar.demo.decode`): the
rest of the prompt is computed on top of what the load wrote, then scored."""

from __future__ import annotations

import pytest
from transformers import PreTrainedModel

from sidecar.demo.decode import quality_after, recompute, score
from sidecar.models.corpus import pydoc_token_ids

pytestmark = [pytest.mark.model, pytest.mark.slow]

PROMPT = 192
LOADED = 128
SCORED = 16


def test_the_rest_of_a_stopped_load_is_computed_before_scoring(smollm2: PreTrainedModel) -> None:
    ids = pydoc_token_ids(PROMPT + SCORED)
    prompt, continuation = ids[:PROMPT], ids[PROMPT:]
    reference = recompute(smollm2, prompt, continuation)
    # An exact load that stopped after its first chunk: the rest of the buffer never written.
    kv = reference.kv.clone()
    kv[:, :, LOADED:] = 0

    kl, top1, generated, compute_s = quality_after(
        smollm2, kv, LOADED, prompt, continuation, reference
    )
    assert compute_s > 0
    assert kl < 1e-4 and top1 == 1.0 and generated == reference.generated

    # Scored as if whole, the unwritten tokens would count as zeros.
    unwritten_kl, _, _ = score(smollm2, kv, prompt, continuation, reference)
    assert unwritten_kl > 100 * max(kl, 1e-6)

    # A whole load is scored as it is, with nothing computed.
    whole = quality_after(smollm2, reference.kv, PROMPT, prompt, continuation, reference)
    assert whole[3] == 0.0 and whole[0] < 1e-4 and whole[2] == reference.generated
