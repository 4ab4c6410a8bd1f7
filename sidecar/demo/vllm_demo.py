"""`kvmoq demo --engine vllm`: the demo's story told by two vLLM engines with the kvmoq
connector, each beside its own sidecar.

P (`kv_producer`) serves a pydoc prompt, the time a decode node would spend recomputing it,
and its connector publishes the prompt's KV through P's sidecar. D (`kv_consumer`, its
prefix cache off so every request loads again) asks for the same prompt with each track
alone, then with the connector's own choice, then for a longer prompt that starts with it;
each answer is set against P's text.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.demo.children import Children
    from sidecar.demo.nodes import SidecarNode
    from sidecar.demo.vllm_engines import Answer, Engine, Output

NEW_TOKENS = 24
EXTENSION_TOKENS = 256
"""Tokens the longer prompt adds to the published one."""
PUBLISH_WAIT_S = 120.0
DTYPE = "float32"
"""Not vLLM's bfloat16: there the logits step by 0.125 here, so a prompt prefilled in two
parts (a loaded prefix, then the rest) can pick another token at a near tie than one
prefilled whole, and "same text" would say more about rounding than about the load."""
CONNECTOR_CHOICE = "connector's choice"

Step = Callable[[str], None]
"""Tells the user what the demo does now."""


def run(
    children: Children,
    step: Step,
    prefill_sidecar: SidecarNode,
    decode_sidecar: SidecarNode,
    tokens: int,
    tracks: tuple[str, ...],
) -> dict[str, Any]:
    from sidecar.demo.vllm_engines import close_engines
    from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE
    from sidecar.kvcache.naming import chunk_count
    from sidecar.models.corpus import pydoc_token_ids

    step("starting two vLLM engines with the kvmoq connector (about a minute)")
    p, d = _start_engines(children, prefill_sidecar, decode_sidecar, tracks)
    ids = pydoc_token_ids(tokens + EXTENSION_TOKENS)
    prompt, longer = ids[:tokens], ids

    step(f"engine P prefills the {tokens}-token prompt; its sidecar publishes the KV")
    published = prefill_sidecar.counter("kvmoq_published_chunks").get(tracks[0], 0)
    served = p.run(_request(prompt))
    prefill_sidecar.wait_counter(
        "kvmoq_published_chunks",
        tracks[0],
        published + chunk_count(tokens, DEFAULT_CHUNK_SIZE),
        PUBLISH_WAIT_S,
    )
    (reference,) = served.outputs

    rows = {}
    for label in (*tracks, CONNECTOR_CHOICE):
        step(f"engine D loads the prompt through its sidecar and the relay: {label}")
        chosen = () if label == CONNECTOR_CHOICE else (label,)
        rows[label] = _load(d, decode_sidecar, prompt, chosen, reference, served.seconds)

    step(f"engine D gets a longer prompt ({len(longer)} tokens) that starts with the published one")
    before = decode_sidecar.counter("kvmoq_loaded_chunks")
    extended = d.run(_request(longer))
    # P answers it only now: it would publish the longer prompt too.
    (longer_reference,) = p.run(_request(longer)).outputs
    reuse = _row(extended, decode_sidecar, before, longer_reference, served.seconds)
    close_engines(p, d)
    return {
        "engine": "vllm",
        "tokens": tokens,
        "recompute_s": served.seconds,
        "tracks": rows,
        "prefix_reuse": reuse | {"prompt_tokens": len(longer)},
    }


def _start_engines(
    children: Children, prefill: SidecarNode, decode: SidecarNode, tracks: tuple[str, ...]
) -> tuple[Engine, Engine]:
    """P and D side by side: each spends most of its start importing and warming up."""
    from sidecar.demo.vllm_engines import start_engine

    settings = {"tracks": ",".join(tracks), "default_track": tracks[0]}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        p = pool.submit(
            start_engine, children, "engine p", role="kv_producer",
            extra=settings | {"sidecar": prefill.grpc}, dtype=DTYPE,
        )  # fmt: skip
        d = pool.submit(
            start_engine, children, "engine d", role="kv_consumer",
            extra=settings | {"sidecar": decode.grpc}, prefix_caching=False, dtype=DTYPE,
        )  # fmt: skip
        return p.result(), d.result()


def _request(token_ids: list[int], tracks: tuple[str, ...] = ()) -> dict[str, Any]:
    """A request for D; one that names a track takes it whatever it costs (the row shows
    that track), else the connector's choice within the sidecar's quality floor."""
    bound = {"max_kl": math.inf} if tracks else {}
    return {"token_ids": token_ids, "max_tokens": NEW_TOKENS, "tracks": list(tracks), **bound}


def _load(
    d: Engine,
    sidecar: SidecarNode,
    token_ids: list[int],
    tracks: tuple[str, ...],
    reference: Output,
    recompute_s: float,
) -> dict[str, Any]:
    before = sidecar.counter("kvmoq_loaded_chunks")
    mark = d.child.log_size()
    answer = d.run(_request(token_ids, tracks))
    # The connector's warnings (a failed lookup or load says why a row computed its prompt)
    # go to the engine's stderr, each starting "kvmoq".
    warnings = [line for line in d.child.log_since(mark) if line.startswith("kvmoq")]
    return _row(answer, sidecar, before, reference, recompute_s) | {"warnings": warnings}


def _row(
    answer: Answer,
    sidecar: SidecarNode,
    before: dict[str, float],
    reference: Output,
    recompute_s: float,
) -> dict[str, Any]:
    """D's `answer`: its time (the prompt and `NEW_TOKENS` tokens), the chunks its sidecar
    loaded per track since `before`, and whether its text is P's."""
    (output,) = answer.outputs
    return {
        "seconds": answer.seconds,
        "speedup": recompute_s / answer.seconds,
        "cached_tokens": output.cached_tokens,
        "chunks": sidecar.growth("kvmoq_loaded_chunks", before),
        "same_text": output.token_ids == reference.token_ids,
        "text": output.text,
    }
