"""moq-rs publisher: one broadcast (the namespace) with one track of patterned groups.

The groups are written once the track has a subscriber, one every --interval seconds (the
first one too), not all at once before: over draft-14 a moq-rs publisher ignores the SUBSCRIBE filter (it logs
"filter not supported before draft-20"), starts serving at the newest group and skips any
group superseded before it got to it. So objects written before the subscription, or in a
burst, never reach a draft-14 subscriber. The groups are kept for the whole run (a long max
age), so a moq-lite subscriber that asks for group 0 onwards still gets every one.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import moq
from moqrs_log import watch_versions
from pattern import object_payload, object_size
from peer_io import emit, publisher_parser

_KEEP_US = 3_600_000_000


async def publish(args: argparse.Namespace) -> None:
    client = moq.Client(
        args.url, tls_roots=[os.path.abspath(args.ca)], websocket_enabled=False, reconnect=False
    )
    async with client:
        broadcast = client.create_broadcast(args.namespace)
        track = broadcast.publish_track(args.track, moq.TrackInfo(max_age_us=_KEEP_US))
        broadcast.announce()
        emit("ready", groups=args.groups, objects=args.objects)
        await track.used()
        for group in range(args.groups):
            # Before the first group too: written the moment the SUBSCRIBE arrives, its head
            # raced the SUBSCRIBE_OK, and a relay could start the subscriber mid-group.
            await asyncio.sleep(args.interval)
            producer = track.create_group(group)
            for obj in range(args.objects):
                size = object_size(args.sizes, obj)
                producer.write_frame(object_payload(args.seed, group, obj, size))
            producer.finish()
        emit("produced", groups=args.groups, objects=args.objects)
        await asyncio.sleep(args.timeout)


INTERVAL_S = 0.5
"""Between groups: the serving task must reach a group before the next one supersedes it, and
on two busy cores 0.1 s (the other publishers' default) was not always enough (the relay
chains lost group 0 about one run in five while the suite ran)."""


def main() -> None:
    parser = publisher_parser(__doc__ or "")
    parser.set_defaults(interval=INTERVAL_S)
    args = parser.parse_args()
    watch_versions(lambda version: emit("session", version=version))
    asyncio.run(publish(args))


if __name__ == "__main__":
    main()
