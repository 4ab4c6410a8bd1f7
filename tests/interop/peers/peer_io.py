"""Command line and output conventions shared by every interop peer program.

A peer talks to the test harness only through its command line and stdout: one JSON object
per line, each with an "event" key ("ready", "session", "object", "done", "error"). Stdlib
only, so both virtual environments can import it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any

_STDOUT_LOCK = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    """Write one event line and flush at once: the harness waits on these lines.

    One write under a lock: moq-rs peers also emit from a log-reading thread, and two bare
    print() calls interleave their text and newlines.
    """
    line = json.dumps({"event": event, **fields}, sort_keys=True) + "\n"
    with _STDOUT_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",")]
    if not sizes or min(sizes) < 0:
        raise argparse.ArgumentTypeError(f"bad size list {text!r}")
    return sizes


def client_parser(description: str) -> argparse.ArgumentParser:
    """Arguments common to publishers and subscribers of both implementations."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", required=True, help="moqt://127.0.0.1:PORT[/path]")
    parser.add_argument("--ca", required=True, help="PEM file of the CA that signed the relay")
    parser.add_argument(
        "--namespace", required=True, help="'/'-separated namespace, e.g. kvtest/ns"
    )
    parser.add_argument("--track", required=True)
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--objects", type=int, default=4, help="objects per group")
    parser.add_argument(
        "--sizes", type=_sizes, default=[1000], help="object sizes, cycled per object id"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="give up (exit 1) after this many seconds"
    )
    return parser


def extensions_arg(text: str) -> dict[int, int | bytes]:
    """'32=7,33=6b76' -> {32: 7, 33: b"kv"}: even types carry an int, odd types hex bytes."""
    extensions: dict[int, int | bytes] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        kind = int(key, 0)
        extensions[kind] = bytes.fromhex(value) if kind % 2 else int(value, 0)
    return extensions


def extensions_json(extensions: dict[int, int | bytes] | None) -> dict[str, int | str]:
    """Extension headers as JSON: type as a decimal string, bytes as hex."""
    return {
        str(kind): value.hex() if isinstance(value, bytes) else value
        for kind, value in sorted((extensions or {}).items())
    }


def publisher_parser(description: str) -> argparse.ArgumentParser:
    """Client arguments plus the pause between groups.

    moq-rs, serving a draft-14 subscriber (as relay or as publisher), starts at the newest
    group and skips every group superseded before it got to it; groups written in a burst
    are lost. A pause per group lets it keep up. It is a pacing choice, not a timing
    assertion: nothing measures it.
    """
    parser = client_parser(description)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between groups")
    parser.add_argument(
        "--extensions",
        type=extensions_arg,
        default={},
        help="object extension headers to attach, e.g. 32=7,33=6b76 (odd types: hex bytes)",
    )
    return parser


def relay_parser(description: str) -> argparse.ArgumentParser:
    """Arguments of a relay peer: where to listen and with which certificate."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True, help="UDP port on 127.0.0.1")
    parser.add_argument("--cert", required=True, help="PEM certificate chain")
    parser.add_argument("--key", required=True, help="PEM private key")
    return parser


def fail(message: str) -> None:
    """Report a failure as an event and on stderr, then exit 1."""
    emit("error", message=message)
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(1)
