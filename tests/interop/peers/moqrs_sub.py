"""moq-rs subscriber: waits for the broadcast, subscribes from group 0, prints every object.

moq-rs exposes no object IDs, only frames in order, so the object ID printed is the frame's
position in its group. Exits 0 after groups x objects objects, 1 on timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import moq
from moqrs_log import watch_versions
from pattern import object_record
from peer_io import client_parser, emit, fail

_KEEP_US = 3_600_000_000


async def receive(args: argparse.Namespace) -> None:
    expected = args.groups * args.objects
    client = moq.Client(
        args.url, tls_roots=[os.path.abspath(args.ca)], websocket_enabled=False, reconnect=False
    )
    async with client:
        broadcast = await client.announced_broadcast(args.namespace)
        track = await broadcast.subscribe_track(
            args.track, moq.Subscription(group_start=0, max_age_us=_KEEP_US)
        )
        emit("ready")
        received = 0
        async for group in track.groups_as_arrived():
            obj = 0
            async for frame in group:
                emit("object", **object_record(group.sequence, obj, frame.payload))
                obj += 1
                received += 1
                if received == expected:
                    emit("done", objects=received)
                    return
        fail(f"track ended after {received} of {expected} objects")


def main() -> None:
    args = client_parser(__doc__ or "").parse_args()
    watch_versions(lambda version: emit("session", version=version))
    try:
        asyncio.run(asyncio.wait_for(receive(args), args.timeout))
    except TimeoutError:
        fail(f"timed out after {args.timeout} s")


if __name__ == "__main__":
    main()
