"""`kvmoq token`: make relay keys and sign the tokens sessions present to a relay."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

_EPILOG = """\
A relay started with --auth-key FILE refuses sessions without a valid token signed with that
key (unless --public opens a path to anyone), and refuses with UNAUTHORIZED any publish or
subscribe outside the token's scope. Tokens are JWTs in moq-relay's format, so one token
serves a kvmoq relay and a moq-relay alike:

  root  a path: a namespace tuple is the path of its fields joined by "/", e.g.
        kvcache.moq.arpa/v1/SmolLM2-135M/<prompt id>; paths compare by whole segments
  pub   where under root the holder may publish (PUBLISH_NAMESPACE, PUBLISH); "" = all of it
  sub   where under root it may subscribe (SUBSCRIBE, FETCH, TRACK_STATUS,
        SUBSCRIBE_NAMESPACE); "" = all of it
  exp   when the token stops working: a session holding it is closed then

  kvmoq token generate --key relay.jwk                     # HS256: one secret signs and checks
  kvmoq token generate --key signer.jwk --algorithm EdDSA --public relay.jwk
  kvmoq token sign --key relay.jwk --root kvcache.moq.arpa/v1 --publish "" --subscribe "" \\
      --expires 86400 > sidecar.jwt                        # a sidecar: both ways, one day
  kvmoq token sign --key relay.jwk --root "" --publish "" --subscribe "" > edge.jwt
  kvmoq relay --auth-key relay.jwk ...
  kvmoq relay --upstream moqt://root:4443 --upstream-token edge.jwt --auth-key relay.jwk ...

Clients send the token in CLIENT_SETUP's AUTHORIZATION_TOKEN parameter, or as moq-relay's
clients do, in the URL: moqt://relay:4443/?jwt=<token>.
"""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "token",
        help="make relay keys (JWK) and sign session tokens (JWT)",
        description="Make relay keys and sign the tokens that authorize sessions on a relay.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{generate,sign}")
    generate = verbs.add_parser(
        "generate",
        help="write a new key as a JWK file (mode 0600)",
        description="Write a new signing key as a JWK file (mode 0600).",
    )
    generate.add_argument("--key", required=True, type=Path, metavar="FILE", help="key to write")
    generate.add_argument(
        "--algorithm",
        choices=["HS256", "EdDSA"],
        default="HS256",
        help="HS256: a shared secret that signs and checks (default); EdDSA: an Ed25519 "
        "pair, so relays hold only the public half (--public)",
    )
    generate.add_argument(
        "--public",
        type=Path,
        metavar="FILE",
        help="with EdDSA, also write the public key here: what relays need to check tokens",
    )
    generate.set_defaults(handler=run_generate)
    sign = verbs.add_parser(
        "sign",
        help="print a token for a path (publish and/or subscribe)",
        description="Print a JWT that lets its holder publish and/or subscribe under a path.",
    )
    sign.add_argument("--key", required=True, type=Path, metavar="FILE", help="signing key (JWK)")
    sign.add_argument(
        "--root", required=True, metavar="PATH", help='the path the token is for ("" = all)'
    )
    sign.add_argument(
        "--publish",
        metavar="SUFFIX",
        help='where under the root it may publish ("" = the whole root; default: nowhere)',
    )
    sign.add_argument(
        "--subscribe",
        metavar="SUFFIX",
        help='where under the root it may subscribe ("" = the whole root; default: nowhere)',
    )
    sign.add_argument(
        "--expires",
        type=float,
        metavar="SECONDS",
        help="valid for this long from now (default: no expiry)",
    )
    sign.set_defaults(handler=run_sign)


def run_generate(args: argparse.Namespace) -> int:
    from sidecar.jwk import generate, public_half, write_secret

    if args.public is not None and args.algorithm != "EdDSA":
        print("kvmoq token generate: --public needs --algorithm EdDSA (HS256 has no public half)")
        return 2
    private = generate(args.algorithm)
    write_secret(args.key, private)
    print(f"wrote {args.key} ({args.algorithm}, kid {private['kid']})")
    if args.public is not None:
        args.public.write_text(json.dumps(public_half(private), indent=2) + "\n")
        print(
            f"wrote {args.public} (public half: give it to relays as --auth-key, or to "
            "sidecars as --trusted-keys)"
        )
    return 0


def run_sign(args: argparse.Namespace) -> int:
    from sidecar.jwk import load_key
    from sidecar.moqt.relay.auth import sign

    if args.publish is None and args.subscribe is None:
        print("kvmoq token sign: give --publish, --subscribe or both (else it allows nothing)")
        return 2
    if args.expires is not None and args.expires <= 0:
        print("kvmoq token sign: --expires must be positive")
        return 2
    try:
        key = load_key(args.key)
    except ValueError as exc:
        print(f"kvmoq token sign: {exc}")
        return 2
    print(
        sign(
            key,
            args.root,
            publish=args.publish,
            subscribe=args.subscribe,
            expires_in=args.expires,
        )
    )
    return 0
