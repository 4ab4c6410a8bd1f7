"""Shared fixtures for real model data: SmolLM2-135M and the KV of a 4096-token pydoc prompt.

Session-scoped because loading the model and reading the KV cost seconds; the KV comes from
the disk cache (sidecar/models/kv_store.py), extracted once per machine. Tests that use them
are marked `model` (and `slow` where the first extraction may run).
"""

from __future__ import annotations

import pytest
from transformers import PreTrainedModel

from sidecar.models import kv_store
from sidecar.models.smollm2 import load_model

PROMPT_TOKENS = 4096


@pytest.fixture(scope="session")
def smollm2() -> PreTrainedModel:
    return load_model()


@pytest.fixture(scope="session")
def pydoc_kv() -> kv_store.PromptKV:
    """Token ids, fp32 KV `[30, 2, 4096, 3, 64]` and last logits of the 4096-token pydoc prompt."""
    return kv_store.pydoc_kv(PROMPT_TOKENS)
