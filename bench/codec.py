"""KV compressions on real KV: size, model quality and single-thread speed, against CacheGen.

The prompt is the first `--tokens` (4096) pydoc tokens through SmolLM2-135M; its KV is cast to
fp16 (what an inference server's cache holds) and cut into 128-token chunks, as the
publisher does, with the shared tables fitted on the first chunk only (a publisher cannot
wait for the whole prefill). Per compression:

* size: every payload plus the shared tables, in bits per KV element and against fp16;
* quality: the model loads the first `--context` tokens' KV after the round trip and scores
  the next `--score` tokens (sidecar/models/quality.py): perplexity, KL and top-1 agreement
  against the uncompressed fp32 KV;
* speed: fp16 megabytes (10^6 bytes) of KV per second through fitting the tables plus
  encoding (both are a publisher's work per prompt) and through decoding, on ONE CPU
  thread, so figures compare across machines and do not depend on what else runs; the
  fastest of `--repeats` passes counts.

The baseline measured in the same run is CacheGen as LMCache ships it
(bench/cachegen_baseline.py), in its own default chunks of 256 tokens, each shipping its
CDF tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from rich.console import Console
from rich.table import Table

from bench import cachegen_baseline
from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE, KVLayout, iter_chunks
from sidecar.models.kv_store import pydoc_kv
from sidecar.models.quality import Quality, evaluate, reference_quality

CACHE_DTYPE = "float16"

_T = TypeVar("_T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--codecs",
        type=lambda text: text.split(","),
        default=list(CODEC_NAMES),
        help=f"comma-separated compressions to measure (default: {','.join(CODEC_NAMES)})",
    )
    parser.add_argument(
        "--tokens", type=int, default=4096, help="prompt length for size and speed (default 4096)"
    )
    parser.add_argument(
        "--context", type=int, default=3072, help="tokens of KV the model loads (default 3072)"
    )
    parser.add_argument(
        "--score", type=int, default=1024, help="tokens scored after the context (default 1024)"
    )
    parser.add_argument(
        "--chunk", type=int, default=DEFAULT_CHUNK_SIZE, help="tokens per chunk (default 128)"
    )
    parser.add_argument(
        "--fit-tokens",
        type=int,
        default=None,
        help="fit the shared tables on the first N tokens (default: the first chunk)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed passes; the fastest counts (default 3)"
    )
    parser.add_argument(
        "--plot", metavar="FILE", help="also draw size against KL per compression (PNG)"
    )


class Compression(Protocol):
    """What the bench measures: per-prompt tables, then chunk -> byte strings -> chunk.

    `fit` gets a sample of the prompt's KV and returns the tables shipped once per prompt
    (None if the compression has none); `encode` and `decode` work on one chunk.
    """

    @property
    def name(self) -> str: ...
    @property
    def fit(self) -> Callable[[torch.Tensor], bytes | None]: ...
    @property
    def encode(self) -> Callable[[torch.Tensor, bytes | None], list[bytes]]: ...
    @property
    def decode(self) -> Callable[[list[bytes], bytes | None], torch.Tensor]: ...


@dataclass(frozen=True)
class _CodecCompression:
    name: str
    fit: Callable[[torch.Tensor], bytes | None]
    encode: Callable[[torch.Tensor, bytes | None], list[bytes]]
    decode: Callable[[list[bytes], bytes | None], torch.Tensor]


def kvmoq_compression(name: str, layout: KVLayout) -> Compression:
    codec = get_codec(name)
    return _CodecCompression(
        name=name,
        fit=lambda sample: codec.fit_tables(layout, sample),
        encode=lambda chunk, tables: codec.encode(chunk, layout, tables),
        decode=lambda payloads, tables: codec.decode(payloads, layout, tables),
    )


@dataclass(frozen=True)
class Figures:
    bits_per_element: float
    ratio_vs_fp16: float
    ppl: float
    kl: float
    top1: float
    encode_mbps: float
    decode_mbps: float
    total_bytes: int
    tables_bytes: int


@contextmanager
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fastest(passes: int, work: Callable[[], _T]) -> tuple[_T, float]:
    """The result of `work` and its fastest time over `passes` runs, on one thread.

    Time is the CPU time of this thread (`time.thread_time`): the codecs run single-threaded
    here, so that is the time one core spends, and it does not count the time other
    processes on a shared machine hold the core (wall time on a loaded 2-core box swung by
    up to 2x between runs).
    """
    best = float("inf")
    with one_thread():
        for _ in range(passes):
            start = time.thread_time()
            result = work()
            best = min(best, time.thread_time() - start)
    return result, best


def measure(
    compression: Compression,
    kv: torch.Tensor,
    layout: KVLayout,
    chunk: int,
    args: argparse.Namespace,
) -> Figures:
    """Size and speed on the prompt `kv` (fp16) in `chunk`-token chunks; quality on its context.

    The quality round trip encodes the context KV (fp16, like `kv`) with the tables fitted on
    the prompt, so it sees exactly what a decode server would load.
    """
    sample = kv[:, :, : args.fit_tokens or chunk]
    tables, fit_s = fastest(args.repeats, lambda: compression.fit(sample))

    def encode(source: torch.Tensor) -> list[list[bytes]]:
        return [compression.encode(part, tables) for part in iter_chunks(source, layout, chunk)]

    def decode(encoded: list[list[bytes]]) -> torch.Tensor:
        return torch.cat([compression.decode(part, tables) for part in encoded], dim=2)

    encoded, encode_s = fastest(args.repeats, lambda: encode(kv))
    decoded, decode_s = fastest(args.repeats, lambda: decode(encoded))
    if decoded.shape != kv.shape:
        raise RuntimeError(f"{compression.name} decoded {tuple(decoded.shape)}, not {kv.shape}")
    quality = evaluate(
        lambda context: decode(encode(context.to(layout.torch_dtype))),
        context=args.context,
        score=args.score,
    )
    tables_bytes = len(tables or b"")
    total_bytes = tables_bytes + sum(len(data) for part in encoded for data in part)
    fp16_bytes = kv.shape[2] * layout.fp16_bytes_per_token
    return Figures(
        bits_per_element=8 * total_bytes / kv.numel(),
        ratio_vs_fp16=fp16_bytes / total_bytes,
        ppl=quality.ppl,
        kl=quality.kl,
        top1=quality.top1,
        encode_mbps=fp16_bytes / (fit_s + encode_s) / 1e6,
        decode_mbps=fp16_bytes / decode_s / 1e6,
        total_bytes=total_bytes,
        tables_bytes=tables_bytes,
    )


def render(rows: Sequence[tuple[str, Figures]], reference: Quality, title: str) -> Table:
    table = Table(title=title, caption=f"uncompressed fp32 KV: ppl {reference.ppl:.3f}")
    table.add_column("compression", no_wrap=True)
    for column in ("bits/elem", "vs fp16", "ppl", "KL", "top-1", "enc MB/s", "dec MB/s"):
        table.add_column(column, justify="right")
    for name, f in rows:
        table.add_row(
            name,
            f"{f.bits_per_element:.2f}",
            f"{f.ratio_vs_fp16:.2f}x",
            f"{f.ppl:.3f}",
            f"{f.kl:.3g}",
            f"{100 * f.top1:.1f}%",
            f"{f.encode_mbps:.1f}",
            f"{f.decode_mbps:.1f}",
        )
    return table


def _check(args: argparse.Namespace) -> None:
    unknown = sorted(set(args.codecs) - set(CODEC_NAMES))
    if unknown:
        raise SystemExit(f"unknown compressions {unknown}; known: {','.join(CODEC_NAMES)}")
    if args.context + args.score > args.tokens:
        raise SystemExit("--context + --score must not exceed --tokens")
    if args.fit_tokens is not None and not 1 <= args.fit_tokens <= args.tokens:
        raise SystemExit("--fit-tokens must be in 1..--tokens")
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")


def run(args: argparse.Namespace) -> int:
    _check(args)
    prompt = pydoc_kv(args.tokens)
    num_layers, _, _, num_kv_heads, head_dim = prompt.kv.shape
    layout = KVLayout(num_layers, num_kv_heads, head_dim, CACHE_DTYPE)
    kv = prompt.kv.to(layout.torch_dtype)
    reference = reference_quality(context=args.context, score=args.score)

    # A pipe gets a wide table rather than rich's 80-column default.
    console = Console(width=None if sys.stdout.isatty() else 120)
    rows: list[tuple[str, Figures]] = []
    for name in args.codecs:
        console.log(f"measuring {name}")
        rows.append((name, measure(kvmoq_compression(name, layout), kv, layout, args.chunk, args)))
    console.log("measuring the CacheGen baseline")
    cachegen = cachegen_baseline.compression(layout)
    baseline = measure(cachegen, kv, layout, cachegen_baseline.CHUNK_TOKENS, args)

    title = (
        f"KV compressions, SmolLM2-135M, {args.tokens}-token pydoc prompt, "
        f"{args.chunk}-token chunks, 1 thread"
    )
    baseline_name = f"CacheGen baseline ({cachegen_baseline.CHUNK_TOKENS}-token chunks)"
    console.print(render([*rows, (baseline_name, baseline)], reference, title))
    result = {
        "setup": {
            "model": "SmolLM2-135M",
            "kv_dtype": CACHE_DTYPE,
            "tokens": args.tokens,
            "context": args.context,
            "score": args.score,
            "chunk": args.chunk,
            "baseline_chunk": cachegen_baseline.CHUNK_TOKENS,
            "fit_tokens": args.fit_tokens or args.chunk,
            "threads": 1,
            "reference_ppl": reference.ppl,
        },
        "codecs": {name: asdict(figures) for name, figures in rows},
        "baseline_cachegen": asdict(baseline),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        write_plot(result, Path(args.plot))
    return 0


def write_plot(result: dict[str, Any], path: Path) -> None:
    """Bits per element against KL, one point per compression and the baseline: the trade-off
    the table states, at a glance (both axes logarithmic)."""
    from sidecar.demo.plot import png

    points = {**result["codecs"], "CacheGen baseline": result["baseline_cachegen"]}
    with png(path, (6.5, 4.2), dpi=110) as axes:
        for index, (name, figures) in enumerate(points.items()):
            kl = max(figures["kl"], 1e-9)
            color = "black" if "Cache" in name else None
            axes.scatter(figures["bits_per_element"], kl, color=color)
            # Alternate labels above and below: fp4 and int4 land on the same point.
            offset = (5, 4) if index % 2 == 0 else (5, -11)
            axes.annotate(
                name,
                (figures["bits_per_element"], kl),
                textcoords="offset points",
                xytext=offset,
                fontsize=8,
            )
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("bits per element (tables included)")
        axes.set_ylabel("KL(uncompressed || compressed)")
        setup = result["setup"]
        axes.set_title(
            f"{setup['model']}, {setup['tokens']}-token prompt: size against quality", fontsize=10
        )
