"""One publisher process of `kvmoq bench load`: a prefill node's KV publisher, on its own
session to the relay, so that its memory is measured alone.

It publishes each prompt it is given (synthetic KV in SmolLM2-135M's layout, the one track
the benchmark loads), prints {"event": "ready", "baseline_rss": ..., "kv_bytes": ...} and
serves the relay until its stdin closes. `baseline_rss` is its resident memory once its
imports are done and its session is up, less the KV: what it holds above that is the KV and
what publishing it costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from bench.fanout_loader import token_ids
from bench.parallel_load import HEAD_DIM, KV_HEADS, LAYERS, MODEL, synthetic_kv
from bench.procstat import memory, reset_peak
from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.transfer.publisher import KVPublisher


async def _serve(args: argparse.Namespace) -> None:
    settings = QuicSettings(ca_file=Path(args.ca), max_datagram_size=args.max_datagram_size)
    layout = KVLayout(LAYERS, KV_HEADS, HEAD_DIM, "float16")
    publisher = KVPublisher()
    async with api.connect(args.url, settings, publisher=publisher) as session:
        kv = synthetic_kv(layout, args.tokens)
        # Making the synthetic KV takes float32 temporaries, which a model server's KV does
        # not: the peak starts again from here, and the KV counts as held.
        reset_peak()
        baseline = memory(None).rss - kv.nbytes
        for prompt in (int(p) for p in args.prompts.split(",")):
            published = publisher.prompt(
                MODEL, layout, token_ids(args.tokens, prompt), tracks=(args.track,),
                default_track=args.track,
            )  # fmt: skip
            await session.publish_namespace(published.namespace)
            await published.publish(kv)
        ready = {"event": "ready", "baseline_rss": baseline, "kv_bytes": kv.nbytes}
        print(json.dumps(ready), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--prompts", required=True, help="prompt numbers, see token_ids")
    parser.add_argument("--track", required=True)
    parser.add_argument("--max-datagram-size", type=int, required=True)
    transport.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
