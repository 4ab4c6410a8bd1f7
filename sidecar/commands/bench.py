"""`kvmoq bench NAME`: the benchmarks in bench/, one module per benchmark.

Each benchmark module exposes `add_arguments(parser)` and `run(args) -> int`; it prints a
table with a same-run baseline and writes the figures as JSON when `--json FILE` is given.

The modules (or the child processes they start) import torch, the QUIC stacks and the model
code, so a benchmark's module is imported, and its options added, only once the command line
names it: `kvmoq --help` and every other subcommand stay free of them. That is why each
one-line description lives here in the table rather than in its module.
"""

from __future__ import annotations

import argparse
import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Benchmark:
    module: str
    description: str


BENCHMARKS: dict[str, Benchmark] = {
    "codec": Benchmark(
        "bench.codec",
        "KV codecs on SmolLM2 KV: bits, ppl/KL/top-1, 1-thread MB/s, against CacheGen and TurboQuant",
    ),
    "transport": Benchmark(
        "bench.transport",
        "MoQT over QUIC (aioquic, qh3; direct and via relay) against TLS/TCP and bare QUIC",
    ),
    "e2e": Benchmark(
        "bench.e2e",
        "SmolLM2 prompt KV: recompute vs load through the relay per track on loopback, "
        "and adaptive loads under tbf link limits in a network namespace",
    ),
    "vllm": Benchmark(
        "bench.vllm",
        "vLLM engines with the kvmoq connector: TTFT of a long prompt recomputed vs loaded "
        "per track and adaptively, under link limits, against vLLM's prefix cache and "
        "ExampleConnector; throughput with hits and misses",
    ),
    "fanout": Benchmark(
        "bench.fanout",
        "one prompt's KV to N decoders at once through one relay and through a root with "
        "edges: aggregate MB/s, per-load p50/p99, relay CPU per MB, bytes per tier",
    ),
    "load": Benchmark(
        "bench.load",
        "many decoders on one relay: one prompt to 32, and 8 publishers with 8 decoders "
        "each: objects/s, MB/s, p50/p99 load s, every process's peak memory, all verified",
    ),
    "gpu": Benchmark(
        "bench.gpu",
        "the GPU path: a 32k-token Llama-3-8B prompt published and loaded in place over CUDA "
        "IPC through a relay, every byte checked; codecs on the GPU against the CPU",
    ),
    "layout": Benchmark(
        "bench.layout",
        "the vLLM connector's block copies between vLLM's CPU cache and staging, per cache "
        "layout (AMX tiles, AVX-512): fast path against the index gather, blocks/s",
    ),
    "parallel": Benchmark(
        "bench.parallel_load",
        "one large prompt's KV through the relay over 1 QUIC connection vs N "
        "(sessions in one process, worker processes into shared memory)",
    ),
}


class _LazyBenchmarks(argparse._SubParsersAction):
    """The NAME sub-parsers, each an empty parser until argparse picks it.

    argparse checks NAME against the registered parsers before it calls this action, so every
    benchmark is registered up front (cheap: name and description); the chosen one gets its
    module's options and handler here, just before its arguments are parsed.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, list) and values
        name = values[0]
        if name in BENCHMARKS:
            _complete(self._name_parser_map[name], name)
        super().__call__(parser, namespace, values, option_string)


CHILD_NEEDS = ("torch", "rich")
"""What a benchmark's child processes import first: checked before one starts, so an install
without the sidecar's dependencies is told what to install (by `kvmoq`'s handler of
ModuleNotFoundError) instead of printing a child's traceback."""


def _complete(parser: argparse.ArgumentParser, name: str) -> None:
    """Give benchmark `name`'s parser its options and handler (once), importing its module."""
    if parser.get_default("handler") is not None:
        return
    module = importlib.import_module(BENCHMARKS[name].module)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    module.add_arguments(parser)
    parser.set_defaults(handler=functools.partial(_run, module.run))


def _run(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    for name in CHILD_NEEDS:
        importlib.import_module(name)
    return run(args)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench",
        help="run a benchmark (figures side by side with a same-run baseline)",
        description="Run one of kvmoq's benchmarks; see docs/benchmarks.md for the latest figures.",
    )
    names = parser.add_subparsers(
        dest="benchmark", metavar="NAME", required=True, action=_LazyBenchmarks
    )
    for name, benchmark in BENCHMARKS.items():
        names.add_parser(name, help=benchmark.description, description=benchmark.description)
