"""`kvmoq relay`: run a MoQT draft-14 relay that fans out and caches KV-cache tracks."""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.address import Address, parse_address

if TYPE_CHECKING:
    from sidecar.moqt.quic_backend import QuicSettings

_EPILOG = """\
Publishers send PUBLISH_NAMESPACE (or PUBLISH); SUBSCRIBE, FETCH and TRACK_STATUS go to the
publisher of the longest matching namespace prefix, one upstream subscription per track
fans out to every subscriber, and objects are cached (whole groups, least recently used
first) so late subscribers and FETCHes are served without the publisher.

Prints "listening on moqt://HOST:PORT" once it accepts sessions. SIGTERM or SIGINT: GOAWAY
to every session, up to --grace seconds for them to leave, then close.

  kvmoq cert --out certs
  kvmoq relay --listen 127.0.0.1:4443 --cert certs/cert.pem --key certs/key.pem
  kvmoq relay --listen [::]:4443 --self-signed --max-datagram-size 16384
"""

MiB = 1 << 20


def _address(text: str) -> Address:
    """`parse_address` with argparse's error type (its message is shown as is); port 0 stays
    refused for --listen, as it was before the parsing was shared."""
    try:
        host, port = parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if port == 0:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, port


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "relay",
        help="run a MoQT relay (routing, fan-out, object cache)",
        description="Run a MoQT draft-14 relay over raw QUIC (ALPN moq-00).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--listen", required=True, type=_address, metavar="HOST:PORT", help="UDP address"
    )
    tls = parser.add_mutually_exclusive_group(required=True)
    tls.add_argument("--cert", type=Path, metavar="FILE", help="PEM certificate chain")
    tls.add_argument(
        "--self-signed",
        action="store_true",
        help="make a throwaway certificate (clients must skip verification)",
    )
    parser.add_argument("--key", type=Path, metavar="FILE", help="PEM private key (with --cert)")
    parser.add_argument(
        "--cache-bytes",
        type=_positive,
        default=1024 * MiB,
        metavar="N",
        help="object cache budget in bytes (default 1 GiB)",
    )
    parser.add_argument(
        "--max-queued-bytes",
        type=_positive,
        default=64 * MiB,
        metavar="N",
        help="live bytes queued for one peer before its subscriptions read the cache instead "
        "(default 64 MiB)",
    )
    parser.add_argument("--backend", choices=["aioquic", "qh3"], default="aioquic")
    parser.add_argument(
        "--max-datagram-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="QUIC packet size (default 1350; 16384 on loopback or jumbo frames)",
    )
    parser.add_argument(
        "--grace", type=float, default=5.0, help="seconds sessions get to leave on shutdown"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.moqt.quic_backend import QuicSettings, QuicSettingsError
    from sidecar.moqt.transport import run as run_loop

    if args.cert is not None and args.key is None:
        print("kvmoq relay: --cert needs --key")
        return 2
    overrides = (
        {} if args.max_datagram_size is None else {"max_datagram_size": args.max_datagram_size}
    )
    try:
        settings = QuicSettings(backend=args.backend, **overrides)
    except QuicSettingsError as exc:
        print(f"kvmoq relay: {exc}")
        return 2
    with tempfile.TemporaryDirectory(prefix="kvmoq-relay-") as scratch:
        cert, key = args.cert, args.key
        if args.self_signed:
            from sidecar.moqt.tls import write_certificate

            paths = write_certificate(Path(scratch))
            cert, key = paths.cert, paths.key
        run_loop(_serve(args, settings, cert, key))
    return 0


async def _serve(args: argparse.Namespace, settings: QuicSettings, cert: Path, key: Path) -> None:
    from sidecar import log
    from sidecar.moqt.relay import start_relay
    from sidecar.moqt.relay_core import RelayLimits

    host, port = args.listen
    limits = RelayLimits(cache_bytes=args.cache_bytes, max_queued_bytes=args.max_queued_bytes)
    server = await start_relay(host, port, settings, cert=cert, key=key, limits=limits)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"listening on {server.url}", flush=True)
    log.get_logger("kvmoq.relay").info(
        "relay started", url=server.url, cache_bytes=args.cache_bytes
    )
    await stop.wait()
    await server.shutdown(grace=args.grace)
