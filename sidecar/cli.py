"""The `kvmoq` command: one subcommand per process kvmoq can run.

Each subcommand lives in the module that owns it and registers itself here
through `add_parser`, so this file stays a table of contents.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Iterable, Sequence

from sidecar import __version__, log

Handler = Callable[[argparse.Namespace], int]

# Each module has `register(sub)`, which adds its parser and sets `handler`.
# Heavy imports (torch, aioquic) stay inside the handlers so `--help` is fast.
COMMANDS: dict[str, str] = {
    "bench": "sidecar.commands.bench",
    "cert": "sidecar.commands.cert",
    "demo": "sidecar.commands.demo",
    "injector": "sidecar.commands.injector",
    "relay": "sidecar.commands.relay",
    "sidecar": "sidecar.commands.sidecar",
    "token": "sidecar.commands.token",
}


def _add_global_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"kvmoq {__version__}")
    parser.add_argument("--log-level", default=None, help="debug, info, warning, error")


SIDECAR_EXTRA = "kvmoq[sidecar]"
"""What a relay-only install (`pip install kvmoq`: no torch, any Python >= 3.11) lacks for
the sidecar, the demo, the benchmarks and the injector."""


def _not_installed(command: str, module: str) -> str:
    return (
        f"kvmoq {command}: needs {module}, which is not installed. This install has the "
        f"relay's dependencies only; the {command} command needs the sidecar's: "
        f"pip install '{SIDECAR_EXTRA}'"
    )


def _missing_dependency(exc: ModuleNotFoundError) -> str | None:
    """The third-party module `exc` says is missing; None when it is one of kvmoq's own
    (a bug, not an install without the sidecar's dependencies)."""
    if exc.name is None or exc.name.split(".")[0] in ("sidecar", "bench"):
        return None
    return exc.name


def _unavailable(command: str, module: str) -> Handler:
    def handler(args: argparse.Namespace) -> int:
        print(_not_installed(command, module), file=sys.stderr)
        return 2

    return handler


def build_parser(commands: Iterable[str] = COMMANDS) -> argparse.ArgumentParser:
    """The `kvmoq` parser with the subcommands `commands` (default: all of them).

    A subcommand whose module needs what this install lacks (torch, in a relay-only
    install) is still listed, and says what to install when run."""
    parser = argparse.ArgumentParser(
        prog="kvmoq",
        description=(
            "Move LLM KV caches between machines over MoQT: a relay, the sidecar "
            "beside each inference server, benchmarks and a demo."
        ),
    )
    _add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in commands:
        try:
            importlib.import_module(COMMANDS[name]).register(sub)
        except ModuleNotFoundError as exc:
            if (module := _missing_dependency(exc)) is None:
                raise
            # Registering may have added the subparser before failing.
            parser_of = sub.choices.get(name) or sub.add_parser(
                name, help=f"(not available: {module} is not installed)"
            )
            parser_of.set_defaults(handler=_unavailable(name, module))
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names, if it names a known one.

    Registering a subcommand can import a lot (the sidecar's options validate track names
    with the codecs, which import torch), so a command line that names its subcommand gets
    a parser with that one only; `kvmoq --help` and usage errors get every subcommand.
    """
    first = argparse.ArgumentParser(prog="kvmoq", add_help=False)
    _add_global_options(first)
    first.add_argument("command", nargs="?")
    known, _ = first.parse_known_args(argv)
    return known.command if known.command in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = _named_command(argv)
    parser = build_parser(COMMANDS if command is None else (command,))
    args = parser.parse_args(argv)
    log.configure(level=args.log_level)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:  # a handler's own import of the sidecar's dependencies
        if (module := _missing_dependency(exc)) is None:
            raise
        print(_not_installed(args.command, module), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
