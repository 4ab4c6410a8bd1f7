"""The kvmoq connector in real vLLM engines: D loads what P served, through P's sidecar, the
relay and D's sidecar, and generates exactly what P generated; what cannot be loaded is
recomputed, never wrong."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import threading
import time

import pytest
from kvmoq_client.client import RECONNECT_WITHIN_S
from kvmoq_client.vllm.settings import DEFAULT_LOAD_DEADLINE_S

from sidecar.demo.vllm_engines import MODEL_DIR, REPO, VLLM_PYTHON, Engine, Output
from sidecar.kvcache.naming import chunk_count
from sidecar.models.corpus import text_token_ids
from sidecar.transfer.track_quality import DEFAULT_MAX_KL
from tests.support.kv_net import publisher_process
from tests.vllm.conftest import Stack

pytestmark = pytest.mark.slow

CHUNK = 128
PROMPT = 1000
"""Tokens of a prompt: 7 whole chunks and a partial one (tests/test_demo.py has a prompt of
whole chunks)."""
LOADED = PROMPT - 1
"""Every token but the last, which vLLM computes for its logits: the last block is loaded
partly."""
SHARED = PROMPT // CHUNK * CHUNK
"""What a longer prompt loads of it: its whole chunks (the partial one's digest differs)."""
LONG_PROMPT = 4000
"""Long enough (31 chunks, 92 MB of fp16, about 0.4 s on loopback) to kill a load half way."""
KILL_AFTER_S = 0.1
TIE = 0.01
"""Log-probabilities this close are a tie for greedy decoding: which token wins then turns on
rounding, and a prefill split differently (a loaded prefix, then the rest) rounds
differently (seen: two tokens at -2.0565 each, 16 positions into a 4000-token prompt)."""
LOGPROB_TOLERANCE = 0.05
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
    chunks = sum(chunk_count(len(ids), CHUNK) for ids in prompts)
    stack.sidecar_p.wait_counter("kvmoq_published_chunks", "fp16", before + chunks, PUBLISH_WAIT_S)
    return outputs


def loaded_bytes(stack: Stack) -> dict[str, float]:
    return stack.sidecar_d.counter("kvmoq_loaded_bytes")


def assert_same_greedy_text(got: Output, expected: Output) -> None:
    """`got` is `expected`'s greedy text up to rounding: the same token wherever `expected`
    had a clear winner, each with about the same log-probability; at a tie either token may
    win, and the texts may go separate ways after it."""
    for position, (mine, theirs) in enumerate(zip(got.token_ids, expected.token_ids, strict=True)):
        odds = expected.logprobs[position]
        if mine != theirs:
            assert odds[str(theirs)] - odds.get(str(mine), -math.inf) <= TIE, (
                f"position {position}: {mine} instead of {theirs} ({odds})"
            )
            return
        mine_odds = got.logprobs[position][str(mine)]
        assert abs(mine_odds - odds[str(theirs)]) <= LOGPROB_TOLERANCE, (position, mine_odds, odds)


def generate(engine: Engine, token_ids: list[int], *tracks: str) -> Output:
    (output,) = engine.run(request(token_ids, *tracks)).outputs
    return output


@pytest.mark.parametrize(("number", "track"), [(1, "fp16"), (2, "int8")])
def test_d_loads_what_p_served_and_generates_the_same_text(
    stack: Stack, number: int, track: str
) -> None:
    ids = prompt(number)
    (served,) = served_by_p(stack, ids)
    before = loaded_bytes(stack)
    loaded = generate(stack.d, ids, track)
    assert_same_greedy_text(loaded, served)
    assert served.cached_tokens == 0
    assert loaded.cached_tokens == LOADED
    after = loaded_bytes(stack)
    assert after.get(track, 0) > before.get(track, 0)
    other = {"fp16": "int8", "int8": "fp16"}[track]
    assert after.get(other, 0) == before.get(other, 0)


def test_a_longer_prompt_loads_the_shared_chunks_and_computes_the_rest(stack: Stack) -> None:
    """...and the tokens D computed tell its connector how fast D computes: its next load
    carries that rate to the sidecar (on loopback every chunk beats it, and loads)."""
    shared = prompt(3)
    longer = prompt(3, PROMPT + 500)
    served_by_p(stack, shared)
    extended = generate(stack.d, longer)
    assert extended.cached_tokens == SHARED
    (reference,) = stack.p.run(request(longer)).outputs  # P computes it (its own cache aside)
    assert_same_greedy_text(extended, reference)

    mark = stack.sidecar_d.child.log_size()
    whole = generate(stack.d, shared)  # its whole chunks in D's prefix cache: the last loads
    assert whole.cached_tokens == LOADED
    (started,) = [json.loads(line) for line in stack.sidecar_d.child.log_since(mark)
                  if '"load_started"' in line]  # fmt: skip
    assert 10 < started["compute_rate"] < 1e6  # tokens per second


def test_concurrent_hits_and_misses(stack: Stack) -> None:
    hits = [prompt(4), prompt(5)]
    misses = [prompt(6, 700), prompt(7, 300)]
    served = served_by_p(stack, *hits)
    outputs = stack.d.run(
        *(request(ids) for ids in (hits[0], misses[0], hits[1], misses[1]))
    ).outputs
    assert [o.cached_tokens for o in outputs] == [LOADED, 0, LOADED, 0]
    references = [generate(stack.p, ids) for ids in misses]
    expected = (served[0], references[0], served[1], references[1])
    for output, reference in zip(outputs, expected, strict=True):
        assert_same_greedy_text(output, reference)


def test_without_its_sidecar_d_computes_and_after_a_restart_loads_again(stack: Stack) -> None:
    down, back = prompt(8), prompt(9)
    served = served_by_p(stack, down, back)
    stack.sidecar_d.child.process.kill()
    stack.sidecar_d.child.process.wait()
    computed = generate(stack.d, down)
    assert computed.cached_tokens == 0
    assert_same_greedy_text(computed, served[0])
    stack.restart_sidecar_d()  # new process, same socket: the connector registers again
    time.sleep(RECONNECT_WITHIN_S + 0.5)  # D's channel tries the socket again by then
    loaded = generate(stack.d, back)
    assert loaded.cached_tokens == LOADED, stack.d.child.log_tail()
    assert_same_greedy_text(loaded, served[1])


@pytest.mark.parametrize(("number", "corrupt"), [(10, 2), (12, 0)])
def test_a_chunk_that_fails_verification_is_recomputed(
    stack: Stack, number: int, corrupt: int
) -> None:
    """A publisher whose chunk `corrupt` does not match its catalog's digest: the connector
    reports that block and the ones after it failed, vLLM recomputes from there on, and the
    text is P's. Chunk 0: nothing loads, and vLLM, which then schedules the request as new,
    must not be offered the same load again (it would fail again, forever). The KV comes
    from the transformers model in this process (vLLM's own cannot be published twice under
    one prompt id)."""
    from sidecar.models.kv import extract_kv
    from sidecar.models.smollm2 import load_model

    ids = prompt(number)
    kv = extract_kv(load_model(), ids)[0].half()
    with publisher_process(
        stack.relay.url, stack.cert, kv, ids, stack.scratch, ("fp16",),
        model=str(MODEL_DIR), corrupt_chunk=corrupt,
    ):  # fmt: skip
        before = stack.sidecar_d.total("kvmoq_verification_failures")
        loads = stack.sidecar_d.child.log_tail(100_000).count("load_started")
        loaded = generate(stack.d, ids, "fp16")
        assert stack.sidecar_d.total("kvmoq_verification_failures") == before + 1
        assert stack.sidecar_d.child.log_tail(100_000).count("load_started") == loads + 1
    (reference,) = served_by_p(stack, ids)
    assert_same_greedy_text(loaded, reference)
    # vLLM counts the load's tokens as cached when it schedules it (999) and says what it
    # recomputed once the connector reported the block failed: everything from there on.
    recovered = [line for line in stack.d.child.extra_lines if "KV load failure" in line]
    assert recovered and f"({LOADED - corrupt * CHUNK} tokens affected)" in recovered[-1]


def test_a_request_sets_its_own_load_deadline_and_quality_floor(stack: Stack) -> None:
    """`kvmoq_deadline` in a request's kv_transfer_params: its load gets that long, and no
    longer than the connector's `load_deadline` however long it asks for (whoever sends
    requests may tighten the operator's bound, not widen it); `kvmoq_max_kl` replaces the
    quality floor, which is otherwise the sidecar's. The sidecar logs each Load's deadline
    and floor as it received them."""
    short, long = prompt(14), prompt(15)
    served = served_by_p(stack, short, long)
    for ids, reference, asked, bound, floor in (
        (short, served[0], 0.5, 0.5, {"max_kl": 0.02}),
        (long, served[1], 3600, DEFAULT_LOAD_DEADLINE_S, {}),
    ):
        (loaded,) = stack.d.run({**request(ids, "fp16"), "deadline": asked, **floor}).outputs
        assert_same_greedy_text(loaded, reference)
        log = stack.sidecar_d.child.log_tail(100_000).splitlines()
        started = json.loads([line for line in log if '"load_started"' in line][-1])
        assert bound - 0.5 < started["deadline"] <= bound, (asked, started)
        assert started["max_kl"] == floor.get("max_kl", DEFAULT_MAX_KL), started


def test_blocks_in_vllms_own_prefix_cache_are_not_fetched_again(stack: Stack) -> None:
    """D holds the first 512 tokens in its own prefix cache (it loaded a shorter prompt):
    for a longer prompt the relay has, it fetches only the chunks after them."""
    short, ids = prompt(13, 4 * CHUNK), prompt(13)
    _, served = served_by_p(stack, short, ids)
    # Loaded (so not published again by D) up to its last token, then cached.
    assert generate(stack.d, short, "fp16").cached_tokens == 4 * CHUNK - 1
    before = stack.sidecar_d.counter("kvmoq_loaded_chunks")
    loaded = generate(stack.d, ids, "fp16")
    assert loaded.cached_tokens == LOADED
    # The prompt's 8 chunks (the last one partial, loaded whole) less the 4 D holds.
    fetched = stack.sidecar_d.growth("kvmoq_loaded_chunks", before)
    assert fetched == {"fp16": chunk_count(PROMPT, CHUNK) - 4}
    assert_same_greedy_text(loaded, served)


def test_the_in_place_path_keeps_blocks_until_read_and_loads_whole_blocks(stack: Stack) -> None:
    """The connector's paths for GPU caches (tests/vllm/in_place_check.py): in place, its
    caches in shared memory as a GPU node's are shared over CUDA IPC, and the fallback
    through staging, checked through both sidecars."""
    result = subprocess.run(
        [str(VLLM_PYTHON), "-P", str(REPO / "tests" / "vllm" / "in_place_check.py"),
         stack.sidecar_p.grpc, stack.sidecar_d.grpc],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    findings = json.loads(result.stdout.strip().splitlines()[-1])
    assert findings == {
        # FlashAttention's and FlashInfer's caches as views; refused: 2 blocks, a wrong shape.
        "views": ["view", "view", "2 blocks", "neither"],
        "save_jobs": [["a", True]],
        "finished_published_keeps_blocks": True,
        "finished_other_keeps_blocks": False,
        "kept_next_step": ["a"],
        "freed_before_finished": [],  # read, but the request was still running
        "freed_after_read": ["a"],
        "ready_tokens": 300,
        "loaded": ["c"],
        "load_failed_blocks": [],  # every block, the last one partly: its chunk matched
        "exact": True,  # though P's blocks were reused once freed
        "unknown_failed_blocks": True,
        # A GPU cache the sidecar cannot map, staged through shared memory instead.
        "staged_freed_once_copied": ["e"],
        "staged_failed_blocks": [],
        "staged_exact": True,
    }


def test_relay_killed_in_the_middle_of_a_load(stack: Stack) -> None:
    """The last test of the module: the relay does not come back. D's sidecar notices it
    within about a second, reports the chunks it verified, and vLLM recomputes the rest."""
    ids = prompt(11, LONG_PROMPT)
    (served,) = served_by_p(stack, ids)
    starts = stack.sidecar_d.child.log_tail(10_000).count("load_started")
    killed = threading.Event()

    def kill_once_loading() -> None:
        end = time.monotonic() + PUBLISH_WAIT_S
        while stack.sidecar_d.child.log_tail(10_000).count("load_started") == starts:
            if time.monotonic() > end:
                return
            time.sleep(0.01)
        time.sleep(KILL_AFTER_S)
        os.kill(stack.relay.pid, signal.SIGKILL)
        killed.set()

    killer = threading.Thread(target=kill_once_loading)
    killer.start()
    loaded = generate(stack.d, ids, "fp16")
    killer.join()
    assert killed.is_set()
    recovered = [line for line in stack.d.child.extra_lines if "KV load failure" in line]
    assert recovered, "the load was over before the relay was killed"
    assert_same_greedy_text(loaded, served)
