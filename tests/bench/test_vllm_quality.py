"""`kvmoq bench vllm`'s quality measure on both forms an engine answers in: the stdio
engine's whole-vocabulary table (base64 float32) and an OpenAI-style server's per-position
objects (Mooncake's vLLM servers)."""

from __future__ import annotations

import base64

import torch

from bench.vllm import quality
from sidecar.demo.vllm_engines import Output
from sidecar.models.quality import mean_kl


def table(seed: int, positions: int = 3, vocabulary: int = 50) -> torch.Tensor:
    logits = torch.randn(positions, vocabulary, generator=torch.Generator().manual_seed(seed))
    return torch.log_softmax(logits, dim=-1).to(torch.float32)


def flat(log_probs: torch.Tensor, token_ids: list[int]) -> Output:
    encoded = base64.b64encode(log_probs.numpy().astype("<f4").tobytes()).decode()
    return Output(token_ids, "", 0, [], vocabulary_logprobs=encoded)


def per_position(log_probs: torch.Tensor, token_ids: list[int]) -> Output:
    rows = [{str(t): float(v) for t, v in enumerate(row)} for row in log_probs.tolist()]
    return Output(token_ids, "", 0, rows)


def test_both_forms_give_the_same_table_and_kl() -> None:
    reference, loaded = table(1), table(2)
    tokens = [4, 8, 15]
    assert torch.equal(flat(reference, tokens).vocabulary_table(), reference.double())
    assert torch.equal(per_position(reference, tokens).vocabulary_table(), reference.double())
    expected = mean_kl(reference.double(), loaded.double())
    for got in (flat(loaded, tokens), per_position(loaded, tokens)):
        judged = quality(flat(reference, tokens), got)
        assert judged["same_text"] and abs(judged["kl"] - expected) < 1e-12


def test_kl_stops_at_the_first_token_where_the_texts_differ() -> None:
    """Past it the two continue different contexts: only positions up to it compare."""
    reference, loaded = table(1), table(2)
    judged = quality(flat(reference, [4, 8, 15]), flat(loaded, [4, 9, 16]))
    assert not judged["same_text"]
    assert abs(judged["kl"] - mean_kl(reference[:2].double(), loaded[:2].double())) < 1e-12
