"""The demo's decode model server: SmolLM2 loads a published prompt's KV cache through its
own sidecar (which fetches it from the relay) instead of recomputing it.

    python -m sidecar.demo.decode_server --sidecar unix:///tmp/b.sock --tokens 1024 \
        --tracks fp16,int8,ac

It recomputes the prompt once as the reference, looks the prompt up, loads it in each
compression and judges each load (KL, top-1, same generated text), loads it once more with
every track allowed under a deadline (the sidecar adapts), then serves a longer request
that extends the prompt: the published prefix is loaded, only the rest computed. Reports
its steps as JSON lines (`sidecar.demo.steps`), then `{"event": "report", ...}`, and exits;
with `--keep` it stays up instead (`kvmoq demo --keep`) and answers requests that extend the
prompt (`POST /generate` on a loopback port it reports as `{"event": "serving", ...}`) until
SIGTERM. SIGTERM ends it at any step, a gRPC call in flight included.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import torch
from kvmoq_client import KVCacheClient, token_slots
from kvmoq_client.buffers import KVBuffers, allocate_shared_kv
from kvmoq_client.dynamic_cache import kv_dimensions
from kvmoq_client.v1 import kv_cache_pb2 as pb

from sidecar.demo.children import exit_on_sigterm
from sidecar.demo.decode import (
    SCORED_TOKENS,
    PrefixRun,
    Reference,
    TrackRun,
    continue_prompt,
    finish_prefix,
    quality_after,
    recompute,
)
from sidecar.demo.steps import Progress, Steps, emit
from sidecar.models.corpus import pydoc_token_ids
from sidecar.models.smollm2 import MODEL_NAME, load_model, load_tokenizer

EXTENSION_TOKENS = 200
"""Tokens the second request adds after the published prompt; also the most a kept server's
request may add (the buffers hold the prompt and this many more)."""
LOAD_TIMEOUT_S = 120.0
"""A per-track load's deadline: generous, so that a busy machine slows it but never cuts it."""
ADAPTIVE = "adaptive"
ADAPTIVE_KL: tuple[float | None, ...] = (None, 0.01, 0.1)
"""The adaptive rows' quality floors: the sidecar's default (near-lossless tracks), then
looser ones that admit 4-bit tracks and `ac`."""


def adaptive_label(max_kl: float | None) -> str:
    """An adaptive row's name: `adaptive`, or `adaptive <=0.01` for a floor of its own."""
    return ADAPTIVE if max_kl is None else f"{ADAPTIVE} <={max_kl:g}"


RECOMPUTE_REPEAT = 2
"""The reference time is the faster of two prefills: other work on a shared machine only
ever slows one down, and a slowed recompute would flatter every load."""
HTTP_HOST = "127.0.0.1"
DEFAULT_NEW_TOKENS = 32
MAX_NEW_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Loaded:
    finished: pb.LoadFinished
    kv: torch.Tensor
    """The verified prefix `[layers, 2, prefix_tokens, kv_heads, head_dim]`, copied out."""
    seconds: float


class DecodeNode:
    """One registered buffer set and the sidecar client that loads into it."""

    def __init__(self, client: KVCacheClient, buffers: KVBuffers, set_id: str) -> None:
        self.client = client
        self.buffers = buffers
        self.set_id = set_id

    def load(
        self,
        token_ids: Sequence[int],
        tracks: Sequence[str],
        deadline: float,
        progress: Progress,
        max_kl: float | None = None,
    ) -> Loaded:
        """Load into the buffers' first slots by `deadline` (seconds from now); `max_kl`: the
        load's quality floor (None: the sidecar's)."""
        started = time.perf_counter()
        slots = token_slots(0, len(token_ids))
        call = self.client.load(
            self.set_id, token_ids, slots, tracks=tracks, deadline=deadline, max_kl=max_kl
        )
        written = 0
        for chunk in call:
            written += chunk.tokens.end - chunk.tokens.start
            progress(written)
        seconds = time.perf_counter() - started
        assert call.finished is not None  # the iteration raised otherwise
        tokens = call.finished.prefix_tokens
        # stack copies: the next load overwrites the same slots.
        kv = torch.stack([buffer[:, :tokens] for buffer in self.buffers.tensors])
        return Loaded(call.finished, kv, seconds)


def judge_load(
    model: torch.nn.Module,
    label: str,
    loaded: Loaded,
    prompt: Sequence[int],
    continuation: Sequence[int],
    reference: Reference,
) -> TrackRun:
    """A load as `sidecar.demo.decode.judge` sees one, from the sidecar's LoadFinished."""
    finished = loaded.finished
    kl, top1, generated, compute_s = quality_after(
        model, loaded.kv, finished.prefix_tokens, prompt, continuation, reference
    )
    return TrackRun(
        label,
        loaded.seconds,
        sum(finished.track_bytes.values()),
        finished.prefix_tokens,
        kl,
        top1,
        generated,
        dict(finished.track_bytes),
        pb.StopReason.Name(finished.stop_reason),
        compute_s,
        finished.expected_kl,
    )


def decode(
    args: argparse.Namespace, node: DecodeNode, model: torch.nn.Module, steps: Steps
) -> dict[str, Any]:
    tracks: list[str] = args.tracks.split(",")
    ids = pydoc_token_ids(args.tokens + EXTENSION_TOKENS)
    prompt, continuation = ids[: args.tokens], ids[args.tokens : args.tokens + SCORED_TOKENS]
    done = steps.start(f"decode server: recompute the {args.tokens}-token prompt (reference)")
    reference = recompute(model, prompt, continuation, repeat=RECOMPUTE_REPEAT)
    done(1)

    found = node.client.lookup(node.set_id, prompt)
    if found.available_tokens < len(prompt):
        raise SystemExit(
            f"decode server: the sidecar finds {found.available_tokens} of {len(prompt)} "
            "prompt tokens published"
        )
    runs: list[TrackRun] = []
    # A track's own row takes it whatever it costs; the adaptive rows keep a quality floor:
    # the sidecar's default, then looser ones, to show what each buys.
    plans: list[tuple[str, list[str], float, float | None]] = [
        (track, [track], LOAD_TIMEOUT_S, math.inf) for track in tracks
    ]
    plans += [(adaptive_label(bound), [], reference.seconds / 2, bound) for bound in ADAPTIVE_KL]
    for label, allowed, deadline, max_kl in plans:
        if allowed:
            # The prefill sidecar encodes a track on its first request; warm it so the
            # timed load is what every later decoder sees (served from the relay's cache).
            warm = steps.start(
                f"first {label} request: the prefill sidecar encodes it", len(prompt)
            )
            node.load(prompt, allowed, LOAD_TIMEOUT_S, warm, max_kl)
        progress = steps.start(f"load {label} through the sidecar and the relay", len(prompt))
        loaded = node.load(prompt, allowed, deadline, progress, max_kl)
        runs.append(judge_load(model, label, loaded, prompt, continuation, reference))

    longer = ids[: args.tokens + EXTENSION_TOKENS]
    reuse_track = "int8" if "int8" in tracks else tracks[0]
    available = node.client.lookup(node.set_id, longer).available_tokens
    progress = steps.start(f"longer prompt: load the published prefix ({reuse_track})", available)
    loaded = node.load(longer[:available], [reuse_track], LOAD_TIMEOUT_S, progress, math.inf)
    done = steps.start(f"longer prompt: compute the other {len(longer) - available} tokens")
    prefix = finish_prefix(model, loaded.kv, longer, loaded.seconds)
    done(1)
    return report(args.tokens, found, reference, runs, prefix)


def report(
    tokens: int,
    found: pb.LookupResponse,
    reference: Reference,
    runs: list[TrackRun],
    prefix: PrefixRun,
) -> dict[str, Any]:
    """The figures `kvmoq demo` renders and writes with `--json` (keys are its contract)."""
    fp16_bytes = reference.kv[:, :, :tokens].numel() * 2
    return {
        "tokens": tokens,
        "recompute_s": reference.seconds,
        "lookup": {"available_tokens": found.available_tokens, "prompt_id": found.prompt_id},
        "tracks": {
            run.label: {
                "load_s": run.load_s,
                "wire_bytes": run.wire_bytes,
                "ratio_vs_fp16": fp16_bytes / run.wire_bytes if run.wire_bytes else None,
                "loaded_tokens": run.loaded_tokens,
                "compute_s": run.compute_s,
                "speedup_vs_recompute": reference.seconds / (run.load_s + run.compute_s),
                "kl": run.kl,
                "top1": run.top1,
                "same_text": run.same_text(reference),
                "expected_kl": run.expected_kl,
                "tracks_used": run.tracks_used,
                "stopped": run.stopped,
            }
            for run in runs
        },
        "prefix_reuse": {
            "prompt_tokens": prefix.prompt_tokens,
            "reused_tokens": prefix.reused_tokens,
            "computed_tokens": prefix.prompt_tokens - prefix.reused_tokens,
            "load_s": prefix.load_s,
            "compute_s": prefix.compute_s,
            "recompute_s": prefix.recompute_s,
            "same_text": prefix.same_text,
        },
    }


class BadRequest(ValueError):
    """A request the kept server refuses as the client's mistake (HTTP 400)."""


def generate(
    node: DecodeNode,
    model: torch.nn.Module,
    prompt: Sequence[int],
    tracks: Sequence[str],
    request: dict[str, Any],
) -> dict[str, Any]:
    """One request to the kept server: the published `prompt` followed by the request's
    `text`, its published prefix loaded through the sidecar (in `track` if the request names
    one, else as the sidecar chooses), the rest computed, `max_new_tokens` generated."""
    text = request.get("text")
    if not isinstance(text, str) or not text:
        raise BadRequest('"text": the words to add after the published prompt')
    max_new_tokens = request.get("max_new_tokens", DEFAULT_NEW_TOKENS)
    if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise BadRequest(f'"max_new_tokens": an integer in 1..{MAX_NEW_TOKENS}')
    track = request.get("track")
    if track is not None and track not in tracks:
        raise BadRequest(f'"track": one of {", ".join(tracks)} (or leave it to the sidecar)')
    tokenizer = load_tokenizer()
    extension = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(extension) > EXTENSION_TOKENS:
        raise BadRequest(f'"text": {len(extension)} tokens, at most {EXTENSION_TOKENS}')
    longer = [*prompt, *extension]
    available = node.client.lookup(node.set_id, longer).available_tokens
    if available == 0:
        raise RuntimeError("the sidecar finds none of the prompt published")
    # A track named is taken whatever it costs; else the sidecar's choice within its floor.
    chosen, max_kl = ([track], math.inf) if track else ([], None)
    loaded = node.load(longer[:available], chosen, LOAD_TIMEOUT_S, lambda _: None, max_kl)
    generated, compute_s = continue_prompt(model, loaded.kv, longer, max_new_tokens)
    reused = loaded.kv.shape[2]
    return {
        "prompt_tokens": len(longer),
        "reused_tokens": reused,
        "computed_tokens": len(longer) - reused,
        "load_s": loaded.seconds,
        "compute_s": compute_s,
        "track_bytes": dict(loaded.finished.track_bytes),
        "text": tokenizer.decode(generated),
    }


def _handler(answer: Callable[[dict[str, Any]], dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """POST /generate with a JSON object; the answer or {"error": ...} as JSON."""

        def do_POST(self) -> None:
            if self.path != "/generate":
                self._reply(404, {"error": "POST /generate"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(request, dict):
                    raise BadRequest("send a JSON object")
                self._reply(200, answer(request))
            except (BadRequest, json.JSONDecodeError) as exc:
                self._reply(400, {"error": str(exc)})
            except Exception as exc:  # the server stays up for the next request
                self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode() + b"\n"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def keep_serving(
    node: DecodeNode, model: torch.nn.Module, prompt: Sequence[int], tracks: Sequence[str]
) -> None:
    """Answer `POST /generate` (see `generate`) on a free loopback port until SIGTERM.

    One request at a time (a plain HTTPServer): every load writes the same buffer slots.
    """
    answer = functools.partial(generate, node, model, prompt, tracks)
    server = HTTPServer((HTTP_HOST, 0), _handler(answer))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    emit(
        "serving",
        http=f"{HTTP_HOST}:{server.server_port}",
        tracks=list(tracks),
        max_text_tokens=EXTENSION_TOKENS,
        max_new_tokens=MAX_NEW_TOKENS,
    )
    try:
        while True:
            signal.pause()
    finally:
        server.shutdown()
        server.server_close()


def serve(args: argparse.Namespace) -> None:
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    emit("started")
    steps = Steps()
    done = steps.start("decode server: load SmolLM2")
    model = load_model()
    done(1)
    arrangement = pb.ContiguousLayout(max_tokens=args.tokens + EXTENSION_TOKENS)
    with (
        KVCacheClient(args.sidecar, timeout=LOAD_TIMEOUT_S, wait_for_ready=True) as client,
        allocate_shared_kv(*kv_dimensions(model.config), model.dtype, arrangement) as buffers,
    ):
        set_id = client.register_buffers(buffers.register_request(MODEL_NAME))
        node = DecodeNode(client, buffers, set_id)
        try:
            emit("report", **decode(args, node, model, steps))
            if args.keep:
                keep_serving(node, model, pydoc_token_ids(args.tokens), args.tracks.split(","))
        finally:
            client.unregister_buffers(set_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sidecar", required=True, help="the sidecar's API, unix://PATH")
    parser.add_argument("--tokens", type=int, required=True, help="the published prompt's length")
    parser.add_argument("--tracks", required=True, help="compressions to load, one at a time")
    parser.add_argument(
        "--keep", action="store_true", help="after the report, serve POST /generate until SIGTERM"
    )
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
