"""The kvmoq connector in real vLLM engines: D loads what P served, through P's sidecar, the
relay and D's sidecar, and generates exactly what P generated; what cannot be loaded is
recomputed, never wrong."""

from __future__ import annotations

import time

import pytest
from kvmoq_client.client import RECONNECT_WITHIN_S

from sidecar.models.corpus import text_token_ids
from tests.transfer.kv_net import publisher_process
from tests.vllm.conftest import MODEL_DIR, Engine, Output, Stack

pytestmark = pytest.mark.slow

CHUNK = 128
PROMPT = 1000
"""Tokens of a prompt: 7 whole chunks and a partial one, so a load brings 896."""
LOADED = (PROMPT - 1) // CHUNK * CHUNK
NEW_TOKENS = 16
PUBLISH_WAIT_S = 60.0


def prompt(number: int, tokens: int = PROMPT) -> list[int]:
    """Prompt `number`: pydoc tokens of its own, so no engine has seen it before."""
    start = number * 2000
    return text_token_ids("pydoc", start + tokens)[start:]


def request(token_ids: list[int], *tracks: str) -> dict[str, object]:
    return {"token_ids": token_ids, "max_tokens": NEW_TOKENS, "tracks": list(tracks)}


def served_by_p(stack: Stack, *prompts: list[int]) -> list[Output]:
    """P generates for `prompts`, one at a time; returns once P's sidecar has published
    every one. One at a time: vLLM's CPU kernels do not give a prompt prefilled in a batch
    with others bit for bit the logits it gets alone, and a greedy text can turn on that."""
    before = stack.sidecar_p.counter("kvmoq_published_chunks").get("fp16", 0)
    outputs = [generate(stack.p, ids) for ids in prompts]
    chunks = sum(-(-len(ids) // CHUNK) for ids in prompts)
    end = time.monotonic() + PUBLISH_WAIT_S
    while stack.sidecar_p.counter("kvmoq_published_chunks").get("fp16", 0) < before + chunks:
        assert time.monotonic() < end, f"P's sidecar did not publish:\n{stack.p.child.log_tail()}"
        time.sleep(0.1)
    return outputs


def loaded_bytes(stack: Stack) -> dict[str, float]:
    return stack.sidecar_d.counter("kvmoq_loaded_bytes")


def generate(engine: Engine, token_ids: list[int], *tracks: str) -> Output:
    (output,) = engine.generate(request(token_ids, *tracks))
    return output


@pytest.mark.parametrize(("number", "track"), [(1, "fp16"), (2, "int8")])
def test_d_loads_what_p_served_and_generates_the_same_text(
    stack: Stack, number: int, track: str
) -> None:
    ids = prompt(number)
    (served,) = served_by_p(stack, ids)
    before = loaded_bytes(stack)
    loaded = generate(stack.d, ids, track)
    assert loaded.token_ids == served.token_ids
    assert served.cached_tokens == 0
    assert loaded.cached_tokens == LOADED
    after = loaded_bytes(stack)
    assert after.get(track, 0) > before.get(track, 0)
    other = {"fp16": "int8", "int8": "fp16"}[track]
    assert after.get(other, 0) == before.get(other, 0)


def test_a_longer_prompt_loads_the_shared_chunks_and_computes_the_rest(stack: Stack) -> None:
    shared = prompt(3)
    longer = prompt(3, PROMPT + 500)
    served_by_p(stack, shared)
    extended = generate(stack.d, longer)
    assert extended.cached_tokens == LOADED
    (reference,) = stack.p.generate(request(longer))  # P computes it (its own cache aside)
    assert extended.token_ids == reference.token_ids


def test_concurrent_hits_and_misses(stack: Stack) -> None:
    hits = [prompt(4), prompt(5)]
    misses = [prompt(6, 700), prompt(7, 300)]
    served = served_by_p(stack, *hits)
    outputs = stack.d.generate(*(request(ids) for ids in (hits[0], misses[0], hits[1], misses[1])))
    assert [o.cached_tokens for o in outputs] == [LOADED, 0, LOADED, 0]
    references = [generate(stack.p, ids) for ids in misses]
    assert [o.token_ids for o in outputs] == [
        served[0].token_ids,
        references[0].token_ids,
        served[1].token_ids,
        references[1].token_ids,
    ]


def test_without_its_sidecar_d_computes_and_after_a_restart_loads_again(stack: Stack) -> None:
    down, back = prompt(8), prompt(9)
    served = served_by_p(stack, down, back)
    stack.sidecar_d.child.process.kill()
    stack.sidecar_d.child.process.wait()
    computed = generate(stack.d, down)
    assert computed.cached_tokens == 0
    assert computed.token_ids == served[0].token_ids
    stack.restart_sidecar_d()  # new process, same socket: the connector registers again
    time.sleep(RECONNECT_WITHIN_S + 0.5)  # D's channel tries the socket again by then
    loaded = generate(stack.d, back)
    assert loaded.cached_tokens == LOADED, stack.d.child.log_tail()
    assert loaded.token_ids == served[1].token_ids


def test_a_chunk_that_fails_verification_is_recomputed(stack: Stack) -> None:
    """A publisher whose chunk 2 does not match its catalog's digest: the connector reports
    block 2 failed, vLLM recomputes from there on, and the text is P's. The KV comes from the
    transformers model in this process (vLLM's own cannot be published twice under one
    prompt id), rounded to fp16 as vLLM keeps it."""
    from sidecar.models.kv import extract_kv
    from sidecar.models.smollm2 import load_model

    ids = prompt(10)
    kv = extract_kv(load_model(), ids)[0].half()
    with publisher_process(
        stack.relay.url, stack.cert, kv, ids, stack.scratch, ("fp16",),
        model=str(MODEL_DIR), corrupt_chunk=2,
    ):  # fmt: skip
        before = stack.sidecar_d.total("kvmoq_verification_failures")
        loaded = generate(stack.d, ids, "fp16")
        assert stack.sidecar_d.total("kvmoq_verification_failures") == before + 1
    (reference,) = served_by_p(stack, ids)
    assert loaded.token_ids == reference.token_ids
    # vLLM counts the load's tokens as cached when it schedules it (896) and says what it
    # recomputed once the connector reported block 2 failed: everything from there on.
    recovered = [line for line in stack.d.child.extra_lines if "KV load failure" in line]
    assert recovered and f"({LOADED - 2 * CHUNK} tokens affected)" in recovered[-1]
