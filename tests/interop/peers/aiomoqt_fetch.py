"""aiomoqt fetcher: one standalone FETCH of groups 0..N-1 (whole groups), printing every object.

Run once a subscriber has pulled the track through the relay, so the relay can answer from
its cache. Exits 0 after groups x objects objects, 2 if the FETCH is refused (with a
"fetch_error" event carrying the code and reason), 1 on timeout or a short answer.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from aiomoqt.types import MOQTRequestError
from aiomoqt_session import draft14_client
from pattern import object_record
from peer_io import client_parser, emit, fail

_REFUSED = 2


async def fetch(args: argparse.Namespace) -> int:
    expected = args.groups * args.objects
    received = 0

    def on_object(msg: Any, _size: int, _when: int, _request_id: int) -> None:
        nonlocal received
        if msg.payload == b"" and msg.status:
            emit("status", group=msg.group_id, object=msg.object_id, status=int(msg.status))
            return
        emit("object", **object_record(msg.group_id, msg.object_id, bytes(msg.payload)))
        received += 1

    async with draft14_client(args.url, args.ca).connect() as session:
        await session.client_session_init()
        emit("session", version=f"moq-transport-{session.negotiated_draft}")
        try:
            reply = await session.fetch(
                namespace=args.namespace,
                track_name=args.track,
                start_group=0,
                start_object=0,
                end_group=args.groups - 1,
                end_object=0,
                wait_response=True,
                on_object=on_object,
            )
        except MOQTRequestError as error:
            emit("fetch_error", code=error.error_code, reason=error.reason)
            return _REFUSED
        emit("ready", reply=type(reply).__name__)
        clean = await session.await_fetch_done(reply.request_id, timeout=args.timeout)
        emit("done", objects=received, clean=clean)
    if received != expected:
        fail(f"FETCH answered {received} of {expected} objects")
    return 0


def main() -> None:
    args = client_parser(__doc__ or "").parse_args()
    try:
        code = asyncio.run(asyncio.wait_for(fetch(args), args.timeout))
    except TimeoutError:
        fail(f"timed out after {args.timeout} s")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
