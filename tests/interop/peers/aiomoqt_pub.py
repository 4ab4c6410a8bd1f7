"""aiomoqt publisher: announces the namespace (or PUBLISHes the track) and serves patterned groups.

Every SUBSCRIBE that reaches the publisher gets its own run of all groups from group 0, sent
live after its SUBSCRIBE_OK, on one stream per group, --interval seconds apart (see
peer_io.publisher_parser for why). Not one shared run started by the first
SUBSCRIBE: moq-rs, as a relay, probes a track with SUBSCRIBE + UNSUBSCRIBE before it
subscribes for real, and a shared run would spend every object on the probe.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from aiomoqt.delivery import SubgroupDelivery
from aiomoqt.track import PublishedTrack
from aiomoqt_session import draft14_client
from pattern import object_payload, object_size
from peer_io import emit, publisher_parser


class PatternTrack(PublishedTrack):
    """A track whose objects are the shared deterministic pattern."""

    def __init__(self, session: Any, args: argparse.Namespace) -> None:
        super().__init__(session, namespace=args.namespace, trackname=args.track)
        self.args = args

    def _subscribed(self, session: Any, track_alias: int) -> bool:
        """Whether the subscription served under `track_alias` still stands."""
        return any(
            sub.session is session and sub.generating and sub.track_alias == track_alias
            for sub in self.subscriptions
        )

    async def generate(self, session: Any, track_alias: int) -> None:
        args = self.args
        delivery = SubgroupDelivery(session, track_alias, priority=self.priority)
        for group in range(args.groups):
            if group:
                await asyncio.sleep(args.interval)
            for obj in range(args.objects):
                if not self._subscribed(session, track_alias):
                    delivery.abort()
                    emit("abandoned", alias=track_alias, group=group, object=obj)
                    return
                payload = object_payload(args.seed, group, obj, object_size(args.sizes, obj))
                await delivery.write(
                    group, obj, payload, group_start=obj == 0, extensions=args.extensions or None
                )
            delivery.end_group()
        await delivery.close()
        emit("produced", alias=track_alias, groups=args.groups, objects=args.objects)


async def publish(args: argparse.Namespace) -> None:
    async with draft14_client(args.url, args.ca).connect() as session:
        await session.client_session_init()
        emit("session", version=f"moq-transport-{session.negotiated_draft}")
        track = PatternTrack(session, args)
        if args.mode == "announce":
            await track.publish(announce_namespace=True, publish_track=False)
        else:
            await track.publish(announce_namespace=False, publish_track=True, forward=0)
        emit("ready", mode=args.mode)
        await asyncio.sleep(args.timeout)


def main() -> None:
    parser = publisher_parser(__doc__ or "")
    parser.add_argument(
        "--mode",
        choices=["announce", "publish"],
        default="announce",
        help="PUBLISH_NAMESPACE and wait for SUBSCRIBE, or PUBLISH the track (forward=0)",
    )
    asyncio.run(publish(parser.parse_args()))


if __name__ == "__main__":
    main()
