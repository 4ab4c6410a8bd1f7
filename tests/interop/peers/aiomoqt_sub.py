"""aiomoqt subscriber: SUBSCRIBEs with an AbsoluteStart {0,0} filter and prints every object.

With --discover it knows only the namespace: SUBSCRIBE_NAMESPACE, then it takes the track
the relay offers with PUBLISH (answering PUBLISH_OK, Largest Object filter), and prints a
"following" event once the relay has accepted the SUBSCRIBE_NAMESPACE.

Each object's extension headers follow it as an "extensions" event. A SUBSCRIBE refused
because the relay does not know the track yet (the publisher's announcement may still be in
flight) is retried until the timeout. Exits 0 after groups x objects objects, 1 on timeout.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from aiomoqt.track import SubscribedTrack
from aiomoqt.types import FilterType, MOQTRequestError
from aiomoqt_session import draft14_client
from pattern import object_record
from peer_io import client_parser, emit, extensions_json, fail

_RETRY_S = 0.2
_FILTERS = {"absolute": FilterType.ABSOLUTE_START, "latest": FilterType.LATEST_OBJECT}


async def receive(args: argparse.Namespace) -> None:
    expected = args.groups * args.objects
    complete = asyncio.Event()
    received = 0

    def on_object(msg: Any, _size: int, _when: int, group_id: int, _subgroup: int | None) -> None:
        nonlocal received
        if msg.payload == b"" and msg.status:
            emit("status", group=group_id, object=msg.object_id, status=int(msg.status))
            return
        emit("object", **object_record(group_id, msg.object_id, bytes(msg.payload)))
        emit(
            "extensions",
            group=group_id,
            object=msg.object_id,
            extensions=extensions_json(msg.extensions),
        )
        received += 1
        if received == expected:
            complete.set()

    async with draft14_client(args.url, args.ca).connect() as session:
        await session.client_session_init()
        emit("session", version=f"moq-transport-{session.negotiated_draft}")
        if args.discover:
            await_publish = session.await_publish

            async def following_then_await(*args: Any, **kwargs: Any) -> Any:
                # aiomoqt calls this once SUBSCRIBE_NAMESPACE_OK is in.
                emit("following")
                return await await_publish(*args, **kwargs)

            session.await_publish = following_then_await
        while True:
            track = SubscribedTrack(
                session,
                namespace=args.namespace,
                trackname=None if args.discover else args.track,
                on_object=on_object,
            )
            track._quiet = True  # it would print to stdout, which carries JSON events only
            try:
                await track.subscribe(filter_type=_FILTERS[args.filter])
                break
            except MOQTRequestError as error:
                emit("refused", code=error.error_code, reason=error.reason)
                await asyncio.sleep(_RETRY_S)
        emit("ready", filter=args.filter, track=track.trackname)
        await complete.wait()
        emit("done", objects=received)


def main() -> None:
    parser = client_parser(__doc__ or "")
    parser.add_argument("--filter", choices=sorted(_FILTERS), default="absolute")
    parser.add_argument(
        "--discover", action="store_true", help="learn the track from the relay's PUBLISH"
    )
    args = parser.parse_args()
    try:
        asyncio.run(asyncio.wait_for(receive(args), args.timeout))
    except TimeoutError:
        fail(f"timed out after {args.timeout} s")


if __name__ == "__main__":
    main()
