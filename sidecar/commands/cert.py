"""`kvmoq cert`: write a development certificate for relays and sidecars.

MoQT over raw QUIC is always TLS 1.3 and kvmoq verifies peers by default, so a
test deployment needs a certificate its clients can trust; this makes one
without openssl incantations.
"""

from __future__ import annotations

import argparse
from pathlib import Path

_EPILOG = """\
Writes DIR/cert.pem (the server's certificate followed by the CA that signed it)
and DIR/key.pem (the server's private key, mode 0600). The certificate covers
localhost, 127.0.0.1 and ::1 plus every --host. Give cert.pem to the server as
its certificate and to every client as the CA to trust, e.g.:

  kvmoq cert --out certs --host relay.example.internal
  kvmoq relay --cert certs/cert.pem --key certs/key.pem ...
  kvmoq sidecar --ca certs/cert.pem ...

For development and tests only: the CA's key is discarded, so the chain cannot
sign anything else, but nothing revokes or rotates it.
"""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "cert",
        help="write a self-signed development certificate (cert.pem, key.pem)",
        description="Write a self-signed EC P-256 development certificate for kvmoq's QUIC endpoints.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="directory to write into"
    )
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS name or IP address to cover (repeatable)",
    )
    parser.add_argument(
        "--days", type=int, default=30, help="validity in days (default 30, at most 825)"
    )
    parser.add_argument(
        "--force", action="store_true", help="overwrite cert.pem/key.pem if they exist"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.moqt.aio.tls import CertificateError, write_certificate

    try:
        paths = write_certificate(args.out, args.host, days=args.days, overwrite=args.force)
    except (CertificateError, FileExistsError) as exc:
        print(f"kvmoq cert: {exc}")
        return 2
    print(f"certificate (and CA to trust): {paths.cert}")
    print(f"private key:                   {paths.key}")
    return 0
