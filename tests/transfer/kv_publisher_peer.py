"""A KV publisher in a process of its own, so a test can kill it mid-load.

    python -m tests.transfer.kv_publisher_peer --url moqt://127.0.0.1:4443 --ca cert.pem \
        --kv prompt.safetensors --model SmolLM2-135M --tracks fp16,int8

Reads `token_ids` and `kv` (`[L, 2, T, H, D]`) from a safetensors file, announces the prompt
to the relay, publishes every chunk, prints one JSON line `{"event": "ready", "prompt": id}`
and serves until it is killed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import safetensors.torch

from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE
from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.transfer.publisher import KVPublisher
from tests.transfer.kv_net import layout_of


async def publish(args: argparse.Namespace) -> None:
    tensors = safetensors.torch.load_file(args.kv)
    kv, token_ids = tensors["kv"], tensors["token_ids"].tolist()
    layout = layout_of(kv)
    publisher = KVPublisher()
    tracks = args.tracks.split(",")
    prompt = publisher.prompt(
        args.model,
        layout,
        token_ids,
        tracks=tracks,
        default_track=tracks[0],
        chunk_size=args.chunk_size,
    )
    settings = QuicSettings.loopback(ca_file=Path(args.ca))
    async with api.connect(args.url, settings, publisher=publisher) as session:
        await session.publish_namespace(prompt.namespace)
        await prompt.publish(kv)
        print(json.dumps({"event": "ready", "prompt": prompt.name.prompt_id}), flush=True)
        await session.connection.closed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--kv", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tracks", default="int8")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    transport.run(publish(parser.parse_args()))


if __name__ == "__main__":
    main()
