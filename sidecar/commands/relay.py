"""`kvmoq relay`: run a MoQT draft-14 relay that fans out and caches KV-cache tracks."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.address import Address, parse_address
from sidecar.moqt.aio.quic_backend import BACKENDS
from sidecar.moqt.protocol.drafts import DRAFTS_HELP, SPOKEN, Draft, UnknownDraft, parse_drafts

if TYPE_CHECKING:
    from sidecar.moqt.aio.quic_backend import QuicSettings
    from sidecar.moqt.relay.auth import Authorizer

_EPILOG = """\
Publishers send PUBLISH_NAMESPACE (or PUBLISH); SUBSCRIBE, FETCH and TRACK_STATUS go to the
publisher of the longest matching namespace prefix, one upstream subscription per track
fans out to every subscriber, and objects are cached (whole groups, least recently used
first) so late subscribers and FETCHes are served without the publisher. A session that
sends SUBSCRIBE_NAMESPACE hears of every namespace under the prefix (PUBLISH_NAMESPACE) and
is offered every track pushed with PUBLISH there (PUBLISH; it answers PUBLISH_OK).

An edge relay (--upstream) is one of many under a root relay: it tells the root of the
namespaces published through it, follows upstream the prefixes its sessions follow, and asks
the root for any track that no publisher here has, once per track whatever the number of
subscribers here; it caches what passes as any relay does. The root is a plain relay (kvmoq
or any draft-14 relay, such as moq-rs's). A lost upstream is retried with backoff (0.5 s
doubling to 10 s); subscriptions it fed wait for it and go on from the last object they got,
or end after three --upstream-timeouts with PUBLISH_DONE GOING_AWAY "the upstream relay
left"; what was cached here stays served.

With --auth-key, every session must present a token signed with that key (kvmoq token
sign; AUTHORIZATION_TOKEN in CLIENT_SETUP, or ?jwt= in the URL) and may publish and
subscribe only where it allows: other requests get UNAUTHORIZED, a session without a valid
token is closed, and so is one whose token expires. --public PATH lets sessions without a
token publish and subscribe under PATH. An edge presents --upstream-token to its root.

Prints "listening on moqt://HOST:PORT" once it accepts sessions. SIGTERM or SIGINT: GOAWAY
to every session, up to --grace seconds for them to leave, then close.

  kvmoq cert --out certs
  kvmoq relay --listen 127.0.0.1:4443 --cert certs/cert.pem --key certs/key.pem
  kvmoq relay --listen [::]:4443 --self-signed --max-datagram-size 16384
  kvmoq relay --listen 0.0.0.0:4443 --cert edge.pem --key edge-key.pem \\
      --upstream moqt://root.kvmoq:4443 --ca certs/ca.pem
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


def _moqt_url(text: str) -> str:
    from sidecar.moqt.aio.transport import MoqtUrl

    try:
        MoqtUrl.parse(text)
    except ConnectionError as exc:  # MoqtConnectError: what a bad URL raises when dialled
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _drafts(text: str) -> tuple[Draft, ...]:
    try:
        return parse_drafts(text)
    except UnknownDraft as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "relay",
        help="run a MoQT relay (routing, fan-out, object cache)",
        description="Run a MoQT relay over raw QUIC (drafts 18, 16 and 14; see --drafts).",
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
        "--retention",
        type=_seconds,
        default=3600.0,
        metavar="S",
        help="how long the cache keeps serving a track nobody can send any more (its "
        "publisher withdrew it or died; a prefill pod restarting is routine), if not evicted "
        "first (default 3600; 0: forget it within a second)",
    )
    parser.add_argument(
        "--max-queued-bytes",
        type=_positive,
        default=64 * MiB,
        metavar="N",
        help="live bytes queued for one peer before its subscriptions read the cache instead "
        "(default 64 MiB)",
    )
    parser.add_argument(
        "--upstream",
        type=_moqt_url,
        metavar="URL",
        help="run as an edge of the relay at URL (moqt://HOST:PORT): see below",
    )
    parser.add_argument(
        "--ca",
        type=Path,
        metavar="FILE",
        help="CA file the upstream relay's certificate chains to (default: the system's)",
    )
    parser.add_argument(
        "--upstream-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="upstream silent this long: its session is gone and the edge reconnects (default 10)",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=1.0,
        metavar="S",
        help="a peer the relay waits on (an answer, a stream) that acknowledges no PING this "
        "long is gone: its routes go, what it published is served from the cache, and on an "
        "edge the upstream is redialled (default 1; the idle timeout still ends quiet peers)",
    )
    parser.add_argument(
        "--auth-key",
        type=Path,
        metavar="FILE",
        help="check session tokens with this JWK key (kvmoq token generate; for EdDSA, its "
        "public half): see below (default: no checks, anyone may do anything)",
    )
    parser.add_argument(
        "--public",
        metavar="PATH",
        help="with --auth-key: sessions without a token may publish and subscribe under PATH",
    )
    parser.add_argument(
        "--upstream-token",
        type=Path,
        metavar="FILE",
        help="token (kvmoq token sign) this edge presents to its --upstream relay; re-read at "
        "each reconnection",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="QUIC stack: aioquic (pure Python), qh3 (Rust core; pip install 'kvmoq[fast]'), "
        "aiopquic (picoquic in C on a thread of its own, Python >= 3.12; pip install "
        "'kvmoq[pquic]'; sizes its own packets, at most 1536 bytes: its clients must send "
        "no bigger ones). Default, as measured by kvmoq bench transport and interop: for "
        "internet-size packets aiopquic (2x qh3, on less than half its CPU per GB), then "
        "aioquic (qh3 is 4x faster but fails the handshakes of picoquic clients such as "
        "aiomoqt's); above 1500 bytes aioquic (a little faster than qh3 there)",
    )
    parser.add_argument("--drafts", type=_drafts, default=None, metavar="N,N", help=DRAFTS_HELP)
    parser.add_argument(
        "--max-datagram-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="QUIC packet size (default 1350; 16384 on loopback or jumbo frames, with aioquic "
        "or qh3)",
    )
    parser.add_argument(
        "--grace", type=float, default=5.0, help="seconds sessions get to leave on shutdown"
    )
    parser.add_argument(
        "--http",
        type=_address,
        metavar="HOST:PORT",
        help="serve /healthz, /readyz and Prometheus /metrics (kvmoq_relay_*) here (default: off)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.moqt.aio.quic_backend import (
        ETHERNET_DATAGRAM_SIZE,
        INTERNET_DATAGRAM_SIZE,
        SELF_SIZED,
        QuicSettings,
        QuicSettingsError,
        fastest_relay_backend,
        load_backend,
    )
    from sidecar.moqt.aio.transport import run as run_loop

    if args.cert is not None and args.key is None:
        print("kvmoq relay: --cert needs --key")
        return 2
    for flag, path in (("--ca", args.ca), ("--upstream-token", args.upstream_token)):
        if path is not None and args.upstream is None:
            print(f"kvmoq relay: {flag} is for the upstream relay: it needs --upstream")
            return 2
        if path is not None and not path.is_file():
            print(f"kvmoq relay: {flag} {path}: no such file")
            return 2
    if args.public is not None and args.auth_key is None:
        print(
            "kvmoq relay: --public opens a path on a relay that checks tokens: it needs --auth-key"
        )
        return 2
    authorizer = None
    if args.auth_key is not None:
        from sidecar.jwk import load_key
        from sidecar.moqt.relay.auth import Authorizer

        try:
            key = load_key(args.auth_key)
        except ValueError as exc:
            print(f"kvmoq relay: --auth-key {exc}")
            return 2
        authorizer = Authorizer(key, args.public)
    size = args.max_datagram_size or INTERNET_DATAGRAM_SIZE
    backend = args.backend or fastest_relay_backend(size)
    if backend in SELF_SIZED and size > ETHERNET_DATAGRAM_SIZE:
        print(
            f"kvmoq relay: --backend {backend} sizes its own packets (at most 1536 bytes), and "
            f"clients that send {size}-byte ones would lose them: use aioquic or qh3 for "
            "--max-datagram-size above 1500"
        )
        return 2
    try:
        settings = QuicSettings(
            backend=backend,
            max_datagram_size=size,
            stall_timeout=args.stall_timeout,
            drafts=args.drafts or SPOKEN,
        )
        load_backend(settings.backend)
    except QuicSettingsError as exc:
        print(f"kvmoq relay: {exc}")
        return 2
    with tempfile.TemporaryDirectory(prefix="kvmoq-relay-") as scratch:
        cert, key = args.cert, args.key
        if args.self_signed:
            from sidecar.moqt.aio.tls import write_certificate

            paths = write_certificate(Path(scratch))
            cert, key = paths.cert, paths.key
        run_loop(_serve(args, settings, cert, key, authorizer))
    return 0


async def _serve(
    args: argparse.Namespace,
    settings: QuicSettings,
    cert: Path,
    key: Path,
    authorizer: Authorizer | None,
) -> None:
    from sidecar import log
    from sidecar.moqt.aio.relay_server import start_relay
    from sidecar.moqt.relay.auth import read_token
    from sidecar.moqt.relay.records import RelayLimits

    host, port = args.listen
    limits = RelayLimits(
        cache_bytes=args.cache_bytes,
        max_queued_bytes=args.max_queued_bytes,
        retention=args.retention,
    )
    upstream_settings = dataclasses.replace(
        settings, ca_file=args.ca, idle_timeout=args.upstream_timeout
    )
    server = await start_relay(
        host,
        port,
        settings,
        cert=cert,
        key=key,
        limits=limits,
        upstream=args.upstream,
        upstream_settings=upstream_settings,
        authorizer=authorizer,
        upstream_token=lambda: read_token(args.upstream_token),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    probes: asyncio.Server | None = None
    if args.http is not None:
        from sidecar.moqt.relay.metrics import exposition
        from sidecar.service.probes import ProbeState, serve_probes

        probes = await serve_probes(*args.http, ProbeState(lambda: None, exposition(server.relay)))
    print(f"listening on {server.url}", flush=True)
    log.get_logger("kvmoq.relay").info(
        "relay started",
        url=server.url,
        backend=settings.backend,
        cache_bytes=args.cache_bytes,
        upstream=args.upstream,
    )
    await stop.wait()
    if probes is not None:
        probes.close()
    await server.shutdown(grace=args.grace)
