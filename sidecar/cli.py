"""The `kvmoq` command: one subcommand per process kvmoq can run.

Each subcommand lives in the module that owns it and registers itself here
through `add_parser`, so this file stays a table of contents.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from sidecar import __version__, log

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvmoq",
        description=(
            "Move LLM KV caches between machines over MoQT: a relay, the sidecar "
            "beside each inference server, benchmarks and a demo."
        ),
    )
    parser.add_argument("--version", action="version", version=f"kvmoq {__version__}")
    parser.add_argument("--log-level", default=None, help="debug, info, warning, error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _subcommands():
        register(sub)
    return parser


# Each module has `register(sub)`, which adds its parser and sets `handler`.
# Heavy imports (torch, aioquic) stay inside the handlers so `--help` is fast.
_SUBCOMMAND_MODULES: tuple[str, ...] = (
    "sidecar.commands.bench",
    "sidecar.commands.cert",
    "sidecar.commands.demo",
    "sidecar.commands.relay",
    "sidecar.commands.sidecar",
)


def _subcommands() -> list[Callable[[argparse._SubParsersAction], None]]:
    return [importlib.import_module(name).register for name in _SUBCOMMAND_MODULES]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log.configure(level=args.log_level)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
