"""moq-rs fetcher: fetches groups 0..N-1 one by one (moq-rs fetches whole single groups only),
subscribed to the track meanwhile (tests/interop/test_moqrs_fetch_via_relay.py says why).

Run once a subscriber has pulled the track through the relay. As with the moq-rs subscriber,
the object ID printed is the frame's position in its group. Exits 0 after groups x objects
objects, 1 on timeout or a short or refused fetch.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import moq
from moqrs_log import watch_versions
from pattern import object_record
from peer_io import client_parser, emit, fail


async def fetch(args: argparse.Namespace) -> None:
    client = moq.Client(
        args.url, tls_roots=[os.path.abspath(args.ca)], websocket_enabled=False, reconnect=False
    )
    received = 0
    async with client:
        broadcast = await client.announced_broadcast(args.namespace)
        # fetch_group subscribes for the call only and drops the group's FETCH stream with
        # that subscription if it is still arriving; holding one keeps every group whole.
        async with await broadcast.subscribe_track(args.track):
            emit("ready")
            for sequence in range(args.groups):
                try:
                    group = await broadcast.fetch_group(args.track, sequence)
                except moq.Error as error:
                    fail(f"fetch of group {sequence} refused: {error!r}")
                obj = 0
                async for frame in group:
                    emit("object", **object_record(sequence, obj, frame.payload))
                    obj += 1
                received += obj
    emit("done", objects=received)
    if received != args.groups * args.objects:
        fail(f"fetched {received} of {args.groups * args.objects} objects")


def main() -> None:
    args = client_parser(__doc__ or "").parse_args()
    watch_versions(lambda version: emit("session", version=version))
    try:
        asyncio.run(asyncio.wait_for(fetch(args), args.timeout))
    except TimeoutError:
        fail(f"timed out after {args.timeout} s")


if __name__ == "__main__":
    main()
