"""moq-rs relay: one `moq.Server` whose sessions all share a single origin.

Every session may publish and subscribe; a broadcast one session announces is served to the
others. The ALPN decides the protocol per session: moq-00 (aiomoqt, kvmoq) gets draft-14,
a moq-rs client gets moq-lite.
"""

from __future__ import annotations

import asyncio
import os

import moq
from peer_io import emit, relay_parser


async def serve(port: int, cert: str, key: str) -> None:
    # Absolute paths: moq-rs watches the certificate's directory for hot reload.
    server = moq.Server(
        f"127.0.0.1:{port}",
        tls_cert=[os.path.abspath(cert)],
        tls_key=[os.path.abspath(key)],
    )
    sessions: set[asyncio.Task[None]] = set()
    async with server:
        emit("ready", addr=server.local_addr, fingerprints=server.cert_fingerprints())
        async for request in server:
            task = asyncio.create_task(hold(request))
            sessions.add(task)
            task.add_done_callback(sessions.discard)


async def hold(request: moq.Request) -> None:
    """Keep one session alive until it ends, reporting how (moq.Server.serve() would raise)."""
    try:
        session = await request.accept()
        await session.closed()
    except moq.Error as error:
        emit("session_closed", error=repr(error))
    else:
        emit("session_closed", error=None)


def main() -> None:
    args = relay_parser(__doc__ or "").parse_args()
    moq.log_level(os.environ.get("MOQ_LOG_LEVEL", "warn"))
    asyncio.run(serve(args.port, args.cert, args.key))


if __name__ == "__main__":
    main()
