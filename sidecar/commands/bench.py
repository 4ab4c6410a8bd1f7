"""`kvmoq bench NAME`: the benchmarks in bench/, one module per benchmark.

Each benchmark module exposes `DESCRIPTION: str`, `add_arguments(parser)` and
`run(args) -> int`; it prints a table with a same-run baseline and writes the
figures as JSON when `--json FILE` is given.
"""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, str] = {
    "codec": "bench.codec",
    "transport": "bench.transport",
    "e2e": "bench.e2e",
}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench",
        help="run a benchmark (figures side by side with a same-run baseline)",
        description="Run one of kvmoq's benchmarks; see docs/benchmarks.md for the latest figures.",
    )
    names = parser.add_subparsers(dest="benchmark", metavar="NAME", required=True)
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        bench_parser = names.add_parser(
            name, help=module.DESCRIPTION, description=module.DESCRIPTION
        )
        bench_parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
        module.add_arguments(bench_parser)
        bench_parser.set_defaults(handler=module.run)
