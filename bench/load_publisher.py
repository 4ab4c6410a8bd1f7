"""The model server of one publishing node of `kvmoq bench load`: it hands its KV to a
`kvmoq sidecar` beside it, as a prefill server does, so that what is measured is that
sidecar process publishing.

It writes synthetic KV in SmolLM2-135M's layout into a shared-memory buffer
(`kvmoq_client.buffers.allocate_shared_kv`), registers it, publishes each prompt it is given on the
one track the benchmark loads, prints {"event": "ready", "kv_bytes": ...} and keeps its
buffers registered until its stdin closes.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from kvmoq_client import KVCacheClient, token_slots
from kvmoq_client.buffers import allocate_shared_kv
from kvmoq_client.v1 import kv_cache_pb2

from bench.fanout_loader import token_ids
from bench.parallel_load import HEAD_DIM, KV_HEADS, LAYERS, MODEL, synthetic_kv
from sidecar.kvcache.layout import KVLayout

RPC_TIMEOUT_S = 300.0
"""Publish answers once the prompt is encoded and offered: seconds on a busy machine."""


def serve(args: argparse.Namespace) -> None:
    layout = KVLayout(LAYERS, KV_HEADS, HEAD_DIM, "float16")
    kv = synthetic_kv(layout, args.tokens)
    arrangement = kv_cache_pb2.ContiguousLayout(max_tokens=args.tokens)
    with (
        KVCacheClient(args.sidecar, timeout=RPC_TIMEOUT_S, wait_for_ready=True) as client,
        allocate_shared_kv(LAYERS, KV_HEADS, HEAD_DIM, torch.float16, arrangement) as buffers,
    ):
        for layer, tensor in enumerate(buffers.tensors):
            tensor.copy_(kv[layer])
        set_id = client.register_buffers(buffers.register_request(MODEL))
        for prompt in (int(p) for p in args.prompts.split(",")):
            client.publish(
                set_id, token_ids(args.tokens, prompt), token_slots(0, args.tokens),
                tracks=(args.track,), default_track=args.track,
            )  # fmt: skip
        print(json.dumps({"event": "ready", "kv_bytes": kv.nbytes}), flush=True)
        sys.stdin.read()
        client.unregister_buffers(set_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sidecar", required=True, help="the sidecar's API, unix://PATH")
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--prompts", required=True, help="prompt numbers, see token_ids")
    parser.add_argument("--track", required=True)
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
