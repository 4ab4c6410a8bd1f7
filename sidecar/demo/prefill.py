"""A bare prefill node: computes a prompt's KV cache with SmolLM2 and publishes it over MoQT
itself (`KVPublisher`), with no sidecar in between.

`kvmoq bench e2e` measures the transfer with it, free of the gRPC hop; `kvmoq demo` uses
`sidecar.demo.prefill_server`, which publishes through a sidecar as a model server would.

    python -m sidecar.demo.prefill --url moqt://127.0.0.1:4443 --ca cert.pem --tokens 2048

Prints one JSON line `{"event": "ready", ...}` (prompt id, prefill seconds) once every chunk
is published, then serves subscribers until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path

from sidecar.kvcache.codecs import CODEC_NAMES
from sidecar.models.corpus import pydoc_token_ids
from sidecar.models.kv import extract_kv, kv_layout
from sidecar.models.smollm2 import load_model
from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import LOOPBACK_DATAGRAM_SIZE, QuicSettings
from sidecar.transfer.publisher import KVPublisher

MODEL_NAME = "SmolLM2-135M"


async def serve(args: argparse.Namespace) -> None:
    model = load_model()
    token_ids = pydoc_token_ids(args.tokens)
    started = time.perf_counter()
    kv, _ = extract_kv(model, token_ids)
    prefill_s = time.perf_counter() - started

    publisher = KVPublisher()
    prompt = publisher.prompt(
        MODEL_NAME,
        kv_layout(model),
        token_ids,
        tracks=CODEC_NAMES,
        default_track=args.default_track,
    )
    settings = QuicSettings.sidecar_like(
        ca_file=Path(args.ca), max_datagram_size=args.max_datagram_size
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with api.connect(args.url, settings, publisher=publisher) as session:
        await session.publish_namespace(prompt.namespace)
        await prompt.publish(kv)
        ready = {
            "event": "ready",
            "prompt": prompt.name.prompt_id,
            "tokens": len(token_ids),
            "prefill_s": prefill_s,
        }
        print(json.dumps(ready), flush=True)
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait(
            {session.connection.closed, stopping}, return_when=asyncio.FIRST_COMPLETED
        )
        stopping.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="relay URL, moqt://HOST:PORT")
    parser.add_argument("--ca", required=True, help="CA certificate that signed the relay's")
    parser.add_argument("--tokens", type=int, required=True, help="prompt length in tokens")
    parser.add_argument("--default-track", default="int8", choices=CODEC_NAMES)
    parser.add_argument(
        "--max-datagram-size",
        type=int,
        default=LOOPBACK_DATAGRAM_SIZE,
        metavar="BYTES",
        help=f"QUIC packet size (default {LOOPBACK_DATAGRAM_SIZE})",
    )
    transport.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
