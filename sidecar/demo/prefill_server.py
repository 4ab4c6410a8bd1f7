"""The demo's prefill model server: SmolLM2 prefills a prompt and publishes its KV cache
through its sidecar, as an inference server would with `kvmoq_client`.

    python -m sidecar.demo.prefill_server --sidecar unix:///tmp/a.sock --tokens 1024 \
        --tracks fp16,int8,ac

Reports its steps as JSON lines (`sidecar.demo.steps`), then `{"event": "published", ...}`
(prompt id, prefill seconds, tracks), and stays up, its buffers registered, until SIGTERM.
SIGTERM ends it at any step, a gRPC call in flight included: it unwinds (unregistering its
buffers if its sidecar is still there) rather than finish the step first.
"""

from __future__ import annotations

import argparse
import signal
import time

import torch
from kvmoq_client import KVCacheClient
from kvmoq_client.transformers_cache import TransformersKV

from sidecar.demo.children import exit_on_sigterm
from sidecar.demo.steps import Steps, emit
from sidecar.models.corpus import pydoc_token_ids
from sidecar.models.smollm2 import MODEL_NAME, load_model

RPC_TIMEOUT_S = 300.0
"""Publish answers once every chunk of the default track is encoded: seconds per 1k tokens."""


def serve(args: argparse.Namespace) -> None:
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    emit("started")
    steps = Steps()
    done = steps.start("prefill server: load SmolLM2")
    model = load_model()
    done(1)
    token_ids = pydoc_token_ids(args.tokens)
    tracks = args.tracks.split(",")
    with (
        KVCacheClient(args.sidecar, timeout=RPC_TIMEOUT_S, wait_for_ready=True) as client,
        TransformersKV(client, model, MODEL_NAME, args.tokens) as kv,
    ):
        done = steps.start(f"prefill server: compute the KV of {args.tokens} tokens")
        started = time.perf_counter()
        with torch.inference_mode():
            cache = model(torch.tensor([token_ids]), use_cache=True, logits_to_keep=1).cache
        prefill_s = time.perf_counter() - started
        done(1)
        done = steps.start(f"prefill server: publish through its sidecar ({tracks[0]} first)")
        published = kv.publish(token_ids, cache, tracks=tracks, default_track=tracks[0])
        done(1)
        emit(
            "published",
            prompt=published.prompt_id,
            tokens=len(token_ids),
            chunks=published.chunks,
            tracks=list(published.tracks),
            prefill_s=prefill_s,
        )
        while True:
            signal.pause()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sidecar", required=True, help="the sidecar's API, unix://PATH")
    parser.add_argument("--tokens", type=int, required=True, help="prompt length in tokens")
    parser.add_argument("--tracks", required=True, help="compressions to offer, first eager")
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
