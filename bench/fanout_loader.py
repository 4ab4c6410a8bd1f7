"""One loader process of `kvmoq bench fanout`: the sessions of several decoders, each loading
the whole prompt when the benchmark says "go" on stdin.

Decoders run on machines of their own; on one machine they run in a few processes, so the
relays' figures are not those of one loader's Python thread. Each session is a
`KVSubscriber` connected before the clock starts, as a sidecar keeps its session. Chunks go
to a sink that keeps a digest of what was written (a destination tensor per decoder would
cost gigabytes at 32 decoders); the benchmark compares the digests with a reference load's.

Protocol (one JSON object per line on stdout): {"event": "ready"} once every session is up;
then per "go" line on stdin {"event": "loaded", "loads": [...]} with each load's seconds,
payload bytes, whether it brought every token, and its digest; "quit" or end of input ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import torch

from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.transfer.subscriber import KVSubscriber

LOAD_DEADLINE_S = 300.0
"""Bounds one load; with one track to choose from, the deadline rule never falls back."""


def token_ids(tokens: int, prompt: int) -> list[int]:
    """The benchmark's prompt number ``prompt``: the same ids in the publisher and every
    loader, and other ids (another prompt id, other tracks) for every number."""
    return list(range(prompt * tokens + 1, (prompt + 1) * tokens + 1))


async def load_digest(
    subscriber: KVSubscriber, model: str, tokens: int, prompt: int, track: str
) -> dict[str, Any]:
    """Load the prompt once; seconds, payload bytes, completeness and a digest of the KV."""
    chunks: dict[int, bytes] = {}

    def sink(span: range, kv: torch.Tensor) -> None:
        chunks[span.start] = hashlib.blake2b(kv.contiguous().view(torch.uint8).numpy()).digest()

    started = time.perf_counter()
    result = await subscriber.load(
        model, token_ids(tokens, prompt), sink, LOAD_DEADLINE_S, quality_order=(track,)
    )
    seconds = time.perf_counter() - started
    digest = hashlib.blake2b(b"".join(chunks[start] for start in sorted(chunks))).hexdigest()
    return {
        "seconds": seconds,
        "bytes": sum(chunk.nbytes for chunk in result.loaded),
        "complete": result.loaded_tokens == (range(0, tokens),) and not result.rejected,
        "digest": digest,
    }


async def _serve(args: argparse.Namespace) -> None:
    settings = QuicSettings(ca_file=Path(args.ca), max_datagram_size=args.max_datagram_size)
    loop = asyncio.get_running_loop()
    async with AsyncExitStack() as stack:
        subscribers = [
            KVSubscriber(await stack.enter_async_context(api.connect(url, settings)))
            for url in args.urls.split(",")
        ]
        print(json.dumps({"event": "ready"}), flush=True)
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go":
            loads = await asyncio.gather(
                *(
                    load_digest(s, args.model, args.tokens, args.prompt, args.track)
                    for s in subscribers
                )
            )
            print(json.dumps({"event": "loaded", "loads": loads}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--urls", required=True, help="one relay URL per session")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--prompt", type=int, required=True, help="see token_ids")
    parser.add_argument("--track", required=True)
    parser.add_argument("--max-datagram-size", type=int, required=True)
    transport.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
