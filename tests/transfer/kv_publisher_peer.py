"""A KV publisher in a process of its own, so a test can kill it mid-load.

    python -m tests.transfer.kv_publisher_peer --url moqt://127.0.0.1:4443 --ca cert.pem \
        --kv prompt.safetensors --model SmolLM2-135M --tracks fp16,int8 [--corrupt-chunk N]

Reads `token_ids` and `kv` (`[L, 2, T, H, D]`) from a safetensors file, announces the prompt
to the relay, publishes every chunk, prints one JSON line `{"event": "ready", "prompt": id}`
and serves until it is killed. With `--corrupt-chunk N`, one byte of one object of chunk N
is flipped on every track after the catalog took its digest: that chunk fails verification.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import safetensors.torch

from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE
from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.transfer.publisher import KVPublisher, PayloadHook
from tests.support.kv_net import layout_of


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
        payload_hook=None if args.corrupt_chunk is None else corrupting(args.corrupt_chunk),
    )
    settings = QuicSettings.loopback(ca_file=Path(args.ca))
    async with api.connect(args.url, settings, publisher=publisher) as session:
        await session.publish_namespace(prompt.namespace)
        await prompt.publish(kv)
        print(json.dumps({"event": "ready", "prompt": prompt.name.prompt_id}), flush=True)
        await session.connection.closed


def corrupting(chunk: int) -> PayloadHook:
    def hook(track: str, group: int, obj: int, payload: bytes) -> bytes:
        if (group, obj) != (chunk, 0):
            return payload
        return payload[:-1] + bytes([payload[-1] ^ 0x01])

    return hook


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--kv", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tracks", default="int8")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    parser.add_argument("--corrupt-chunk", type=int)
    transport.run(publish(parser.parse_args()))


if __name__ == "__main__":
    main()
