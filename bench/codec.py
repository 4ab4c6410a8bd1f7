"""KV compressions on real KV: size, model quality and single-thread speed, against CacheGen.

Size and speed: the first `--tokens` (4096) pydoc tokens through SmolLM2-135M; the KV is
cast to fp16 (what an inference server's cache holds) and cut into 128-token chunks, as the
publisher does, with the shared tables fitted on the first chunk only (a publisher cannot
wait for the whole prefill). Per compression:

* size: every payload plus the shared tables, in bits per KV element and against fp16;
* quality: on every text of `corpus.TEXTS` (reference prose, source code, legal prose) and
  at both places of `quality.PLACES` (the 64 tokens right after a 4096-token prompt, and
  1024 tokens after a 3072-token context), the model loads the context's KV after the round
  trip (tables fitted on that text's first chunk) and scores the tokens after it:
  perplexity, KL and top-1 agreement against the uncompressed fp32 KV. The worst text and
  place is what a compression is judged by, alone (every chunk on it) and as served (every
  chunk but the context's most recent on it, that one on int8, as a load under a quality
  floor takes them: `sidecar.transfer.track_quality`);
* speed: fp16 megabytes (10^6 bytes) of KV per second through fitting the tables plus
  encoding (both are a publisher's work per prompt) and through decoding chunk by chunk
  into one buffer, as a sidecar writes a load (and with its allocator settings,
  `sidecar.codec_process`), on ONE CPU thread, so figures compare across machines and do
  not depend on what else runs; the fastest of `--repeats` passes counts.

The baselines measured in the same run: CacheGen as LMCache ships it
(bench/cachegen_baseline.py), in its own default chunks of 256 tokens, each shipping its
CDF tables; and TurboQuant as its PyPI package ships it (bench/turboquant_baseline.py) at 2,
3 and 4 bits per coordinate, each track compared, as served, with the width that spends as
many bits or more (`versus_turboquant`). Each compression's goals (`GOALS`) are checked in
code and written to the JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from rich.table import Table

from bench import cachegen_baseline, turboquant_baseline
from bench.compression import Compression
from bench.harness import one_thread
from sidecar import codec_process, terminal
from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.codecs.ac import AC
from sidecar.kvcache.codecs.ac_tables import fit_tables
from sidecar.kvcache.codecs.binning import MAX_BINS, MIN_BINS, level_bins
from sidecar.kvcache.codecs.rotation import rotate
from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE, KVLayout, iter_chunks
from sidecar.models.corpus import TEXTS
from sidecar.models.kv_store import pydoc_kv
from sidecar.models.quality import PLACES, Place, Quality, evaluate_at, reference_quality
from sidecar.transfer import track_quality

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
        "--context",
        type=int,
        help="score quality at one place instead of both: after this many tokens of KV "
        "(with --score; default: the 64 after 4096 tokens and the 1024 after 3072)",
    )
    parser.add_argument("--score", type=int, help="tokens scored after --context")
    parser.add_argument(
        "--texts",
        type=lambda text: text.split(","),
        default=list(TEXTS),
        help=f"comma-separated texts to score quality on (default: {','.join(TEXTS)})",
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
    parser.add_argument(
        "--rd",
        metavar="SCALES",
        type=lambda text: [float(scale) for scale in text.split(",")],
        help="also sweep `ac` with its bins times each factor (e.g. 0.75,1,1.5,2,2.67), with "
        "and without the Hadamard rotation, for a rate-distortion curve (size and quality only)",
    )
    parser.add_argument(
        "--rd-plot", metavar="FILE", help="draw the --rd curves: bits per element against KL (PNG)"
    )


def kvmoq_compression(name: str, layout: KVLayout) -> Compression:
    codec = get_codec(name)
    return Compression(
        name=name,
        fit=lambda sample: codec.fit_tables(layout, sample),
        encode=lambda chunk, tables: codec.encode(chunk, layout, tables),
        decode=lambda payloads, tables: codec.decode(payloads, layout, tables),
    )


def scaled_bins(layout: KVLayout, scale: float) -> torch.Tensor:
    """`ac`'s default allocation times `scale`, rounded to even counts within the coder's range."""
    bins = (level_bins(layout.num_layers).float() * scale / 2).round() * 2
    return bins.clamp(MIN_BINS, MAX_BINS).to(torch.uint8)


def ac_variant(layout: KVLayout, scale: float, rotated: bool) -> Compression:
    """`ac` with scaled bins, optionally on Hadamard-rotated KV (rotated back after decoding):
    the points of the rate-distortion sweep. The payloads are ordinary `ac` payloads."""
    bins = scaled_bins(layout, scale)

    def turn(kv: torch.Tensor) -> torch.Tensor:
        return rotate(kv.float(), layout.head_dim).to(kv.dtype) if rotated else kv

    return Compression(
        name=f"ac x{scale:g}{' rotated' if rotated else ''}",
        fit=lambda sample: fit_tables(layout, turn(sample), bins=bins).to_bytes(),
        encode=lambda chunk, tables: AC.encode(turn(chunk), layout, tables),
        decode=lambda payloads, tables: turn(AC.decode(payloads, layout, tables)),
    )


@dataclass(frozen=True)
class Figures:
    """One compression's figures; `kl` and `top1` are the worst over every text and place."""

    bits_per_element: float
    ratio_vs_fp16: float
    kl: float
    top1: float
    encode_mbps: float
    decode_mbps: float
    total_bytes: int
    tables_bytes: int
    served_kl: float | None = None
    served_top1: float | None = None
    """The worst as served: the context's most recent chunk on int8 (None: not measured)."""
    quality: dict[str, dict[str, Quality]] = field(default_factory=dict)
    """Text -> place -> figures."""
    served_quality: dict[str, dict[str, Quality]] = field(default_factory=dict)


@dataclass(frozen=True)
class Goal:
    """What a compression must reach (issue "Lossy tracks that keep the model's answer")."""

    max_kl: float
    min_top1: float = 0.0
    min_ratio: float = 0.0
    max_bits: float | None = None
    min_encode_mbps: float = 500.0
    min_decode_mbps: float = 500.0

    def check(self, figures: Figures) -> dict[str, bool]:
        checks = {
            "kl": figures.kl <= self.max_kl,
            "top1": figures.top1 >= self.min_top1,
            "ratio": figures.ratio_vs_fp16 >= self.min_ratio,
            "bits": self.max_bits is None or figures.bits_per_element <= self.max_bits,
            "encode": figures.encode_mbps >= self.min_encode_mbps,
            "decode": figures.decode_mbps >= self.min_decode_mbps,
        }
        return {**checks, "all": all(checks.values())}


GOALS: dict[str, Goal] = {
    "fp16": Goal(max_kl=1e-5),
    "bf16": Goal(max_kl=5e-4),
    "int8": Goal(max_kl=2e-4),
    "fp8": Goal(max_kl=1e-3),
    "int4": Goal(max_kl=0.01, max_bits=4.25),
    "fp4": Goal(max_kl=0.01, max_bits=4.25),
    "ac": Goal(max_kl=0.01, min_top1=0.97, min_ratio=6.5, min_encode_mbps=150, min_decode_mbps=100),
}
"""Per compression, judged on the worst text and place; speeds on one core."""


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


def encode_chunks(
    compression: Compression,
    source: torch.Tensor,
    layout: KVLayout,
    chunk: int,
    tables: bytes | None,
) -> list[list[bytes]]:
    """`source` cut into `chunk`-token chunks, as the publisher does, each encoded."""
    return [compression.encode(part, tables) for part in iter_chunks(source, layout, chunk)]


def decode_chunks(
    compression: Compression, encoded: list[list[bytes]], tables: bytes | None, out: torch.Tensor
) -> None:
    """Chunk by chunk into `out`, each chunk freed once written, as a sidecar writes chunks
    into a model server's buffers (joining them all at the end kept every decoded chunk
    alive and timed a copy of the whole prompt besides)."""
    start = 0
    for part in encoded:
        decoded = compression.decode(part, tables)
        out[:, :, start : start + decoded.shape[2]] = decoded
        start += decoded.shape[2]
    if start != out.shape[2]:
        raise RuntimeError(f"{compression.name} decoded {start} tokens, not {out.shape[2]}")


@dataclass
class RoundTrip:
    """A context's KV through one compression as a decode server would load it: cast to the
    cache's dtype, the tables fitted on its first `fit_tokens`, encoded and decoded chunk by
    chunk; `served`: the most recent chunk through `track_quality.SERVED_RECENT_TRACK`
    instead, as a load under a quality floor takes it. `shipped` counts the bytes of the last
    call."""

    compression: Compression
    layout: KVLayout
    chunk: int
    fit_tokens: int
    served: bool = False
    shipped: int = 0

    def __call__(self, context: torch.Tensor) -> torch.Tensor:
        context = context.to(self.layout.torch_dtype)
        tables = self.compression.fit(context[:, :, : self.fit_tokens])
        encoded = encode_chunks(self.compression, context, self.layout, self.chunk, tables)
        self.shipped = len(tables or b"") + sum(len(data) for part in encoded for data in part)
        decoded = torch.empty_like(context)
        decode_chunks(self.compression, encoded, tables, decoded)
        if self.served:
            recent = kvmoq_compression(track_quality.SERVED_RECENT_TRACK, self.layout)
            start = (context.shape[2] - 1) // self.chunk * self.chunk
            payloads = recent.encode(context[:, :, start:], None)
            decoded[:, :, start:] = recent.decode(payloads, None)
        return decoded


def measure(
    compression: Compression,
    kv: torch.Tensor,
    layout: KVLayout,
    chunk: int,
    args: argparse.Namespace,
    *,
    served: bool = True,
) -> Figures:
    """Size and speed on the prompt `kv` (fp16) in `chunk`-token chunks; quality on every
    text (`RoundTrip`: what a decode server would load), alone and (with `served`) as served."""
    fit_tokens = args.fit_tokens or chunk
    tables, fit_s = fastest(args.repeats, lambda: compression.fit(kv[:, :, :fit_tokens]))

    def encode(source: torch.Tensor, tables: bytes | None) -> list[list[bytes]]:
        return encode_chunks(compression, source, layout, chunk, tables)

    def decode(encoded: list[list[bytes]], tables: bytes | None, out: torch.Tensor) -> None:
        decode_chunks(compression, encoded, tables, out)

    roundtrip = RoundTrip(compression, layout, chunk, fit_tokens)
    as_served = RoundTrip(compression, layout, chunk, fit_tokens, served=True)
    encoded, encode_s = fastest(args.repeats, lambda: encode(kv, tables))
    decoded = torch.empty_like(kv)
    _, decode_s = fastest(args.repeats, lambda: decode(encoded, tables, decoded))
    quality = {
        text: {place.name: evaluate_at(roundtrip, text, place) for place in places(args)}
        for text in args.texts
    }
    served_quality = {
        text: {place.name: evaluate_at(as_served, text, place) for place in places(args)}
        for text in (args.texts if served else ())
    }
    everywhere = [figures for places in quality.values() for figures in places.values()]
    everywhere_served = [q for places in served_quality.values() for q in places.values()]
    tables_bytes = len(tables or b"")
    total_bytes = tables_bytes + sum(len(data) for part in encoded for data in part)
    fp16_bytes = kv.shape[2] * layout.fp16_bytes_per_token
    return Figures(
        bits_per_element=8 * total_bytes / kv.numel(),
        ratio_vs_fp16=fp16_bytes / total_bytes,
        kl=max(figures.kl for figures in everywhere),
        top1=min(figures.top1 for figures in everywhere),
        served_kl=max((q.kl for q in everywhere_served), default=None),
        served_top1=min((q.top1 for q in everywhere_served), default=None),
        encode_mbps=fp16_bytes / (fit_s + encode_s) / 1e6,
        decode_mbps=fp16_bytes / decode_s / 1e6,
        total_bytes=total_bytes,
        tables_bytes=tables_bytes,
        quality=quality,
        served_quality=served_quality,
    )


def render(
    rows: Sequence[tuple[str, Figures]], goals: dict[str, dict[str, bool]], title: str
) -> Table:
    table = Table(title=title, caption="KL and top-1: the worst text and place")
    table.add_column("compression", no_wrap=True)
    columns = ("bits/elem", "vs fp16", "KL", "KL served", "top-1", "enc MB/s", "dec MB/s", "goals")
    for column in columns:
        table.add_column(column, justify="right")
    for name, f in rows:
        met = goals.get(name)
        table.add_row(
            name,
            f"{f.bits_per_element:.3f}",
            f"{f.ratio_vs_fp16:.2f}x",
            f"{f.kl:.3g}",
            "-" if f.served_kl is None else f"{f.served_kl:.3g}",
            f"{100 * f.top1:.1f}%",
            f"{f.encode_mbps:.0f}",
            f"{f.decode_mbps:.0f}",
            "-" if met is None else "met" if met["all"] else _missed(met),
        )
    return table


def _missed(met: dict[str, bool]) -> str:
    return "missed: " + ",".join(name for name, ok in met.items() if not ok and name != "all")


def render_quality(rows: Sequence[tuple[str, Figures]], *, served: bool = False) -> Table:
    """KL (top-1) of every compression on every text and place, alone or as served."""
    title = "KL (top-1) per text and place" + (", as served (most recent chunk on int8)" * served)
    table = Table(title=title)
    table.add_column("compression", no_wrap=True)
    columns = [(text, place) for text, places in rows[0][1].quality.items() for place in places]
    for text, place in columns:
        table.add_column(f"{text} {place}", justify="right")
    for name, f in rows:
        figures = f.served_quality if served else f.quality
        if figures:
            cells = [figures[text][place] for text, place in columns]
            table.add_row(name, *(f"{q.kl:.2g} ({100 * q.top1:.0f}%)" for q in cells))
    return table


def ranking(kl: dict[str, float]) -> dict[str, Any]:
    """The order these figures give, and whether `track_quality.QUALITY_ORDER` agrees on the
    tracks measured (a run over a subset of codecs, texts or places compares only those)."""
    measured = list(track_quality.rank_by_quality(kl))
    configured = [track for track in track_quality.QUALITY_ORDER if track in kl]
    return {
        "measured": measured,
        "track_quality.QUALITY_ORDER": configured,
        "matches": measured == configured,
    }


def floor_figures(rows: Sequence[tuple[str, Figures]]) -> dict[str, Any]:
    """Whether the figures loads plan their quality by (`track_quality.MEASURED`) still hold
    for these: each track's worst KL alone, and as served (or alone, where lower), at or
    under the table's (`KL_NOISE` aside). A run over a subset of texts or places checks only
    those."""
    tracks, slack = {}, track_quality.KL_NOISE
    for name, figures in rows:
        table = track_quality.MEASURED[name]
        served = figures.kl if figures.served_kl is None else min(figures.kl, figures.served_kl)
        tracks[name] = {
            "alone": figures.kl,
            "served": served,
            "table": asdict(table),
            "holds": max(figures.kl - table.alone, served - table.served) <= slack,
        }
    return {"tracks": tracks, "holds": all(entry["holds"] for entry in tracks.values())}


def versus_turboquant(
    rows: Sequence[tuple[str, Figures]], turboquant: dict[int, Figures]
) -> dict[str, Any]:
    """Each kvmoq track against the TurboQuant width that spends as many bits or more (the
    nearest such), as served: the goal is a KL at or below TurboQuant's (issue "Loads that
    keep the answer on slow links"). Tracks wider than every TurboQuant width are not
    compared."""
    widths = sorted(turboquant.items(), key=lambda item: item[1].bits_per_element)
    compared = {}
    for name, figures in rows:
        wider = [(b, f) for b, f in widths if f.bits_per_element >= figures.bits_per_element]
        if not wider or figures.served_kl is None:
            continue
        bits, baseline = wider[0]
        assert baseline.served_kl is not None  # every baseline is measured as served
        compared[name] = {
            "turboquant_bits": bits,
            "bits_per_element": figures.bits_per_element,
            "turboquant_bits_per_element": baseline.bits_per_element,
            "served_kl": figures.served_kl,
            "turboquant_served_kl": baseline.served_kl,
            "met": figures.served_kl <= baseline.served_kl,
        }
    return {"tracks": compared, "met": all(entry["met"] for entry in compared.values())}


def places(args: argparse.Namespace) -> tuple[Place, ...]:
    """`quality.PLACES`, or the one place that --context and --score name."""
    if args.context is None:
        return PLACES
    return (Place(f"after{args.context}", context=args.context, score=args.score),)


def _check(args: argparse.Namespace) -> None:
    unknown = sorted(set(args.codecs) - set(CODEC_NAMES))
    if unknown:
        raise SystemExit(f"unknown compressions {unknown}; known: {','.join(CODEC_NAMES)}")
    unknown_texts = sorted(set(args.texts) - set(TEXTS))
    if unknown_texts or not args.texts:
        raise SystemExit(f"unknown texts {unknown_texts}; known: {','.join(TEXTS)}")
    for text in args.texts:
        try:
            TEXTS[text]()
        except OSError as exc:
            raise SystemExit(f"text {text!r} is not on this machine: {exc}") from None
    if (args.context is None) != (args.score is None):
        raise SystemExit("--context and --score go together")
    if args.context is not None and not (args.context >= 1 and args.score >= 1):
        raise SystemExit("--context and --score must be positive")
    if args.fit_tokens is not None and not 1 <= args.fit_tokens <= args.tokens:
        raise SystemExit("--fit-tokens must be in 1..--tokens")
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")


def run(args: argparse.Namespace) -> int:
    _check(args)
    codec_process.keep_freed_blocks()  # timed as a sidecar runs them
    prompt = pydoc_kv(args.tokens)
    num_layers, _, _, num_kv_heads, head_dim = prompt.kv.shape
    layout = KVLayout(num_layers, num_kv_heads, head_dim, CACHE_DTYPE)
    kv = prompt.kv.to(layout.torch_dtype)

    console = terminal.console()
    rows: list[tuple[str, Figures]] = []
    for name in args.codecs:
        console.log(f"measuring {name}")
        rows.append((name, measure(kvmoq_compression(name, layout), kv, layout, args.chunk, args)))
    console.log("measuring the CacheGen baseline")
    cachegen = cachegen_baseline.compression(layout)
    baseline = measure(cachegen, kv, layout, cachegen_baseline.CHUNK_TOKENS, args)
    turboquant = {}
    for bits in turboquant_baseline.BITS:
        console.log(f"measuring the TurboQuant baseline at {bits} bits")
        compression = turboquant_baseline.compression(layout, bits)
        turboquant[bits] = measure(compression, kv, layout, args.chunk, args)
    goals = {name: GOALS[name].check(figures) for name, figures in rows}
    curve: dict[str, dict[str, Any]] = {}
    for scale in args.rd or ():
        for rotated in (False, True):
            variant = ac_variant(layout, scale, rotated)
            console.log(f"rate-distortion point {variant.name}")
            figures = measure(
                variant,
                kv,
                layout,
                args.chunk,
                argparse.Namespace(**{**vars(args), "repeats": 1}),
                served=False,
            )
            curve[variant.name] = {"scale": scale, "rotated": rotated, **asdict(figures)}

    title = (
        f"KV compressions, SmolLM2-135M, {args.tokens}-token pydoc prompt, "
        f"{args.chunk}-token chunks, 1 thread"
    )
    baseline_name = f"CacheGen baseline ({cachegen_baseline.CHUNK_TOKENS}-token chunks)"
    turboquant_rows = [(f"TurboQuant {bits}-bit", f) for bits, f in turboquant.items()]
    everything = [*rows, (baseline_name, baseline), *turboquant_rows]
    console.print(render(everything, goals, title))
    console.print(render_quality(everything))
    console.print(render_quality(everything, served=True))
    result = {
        "setup": {
            "model": "SmolLM2-135M",
            "kv_dtype": CACHE_DTYPE,
            "tokens": args.tokens,
            "texts": args.texts,
            "places": [asdict(place) for place in places(args)],
            "reference_ppl": {
                text: {
                    place.name: reference_quality(place.context, place.score, text).ppl
                    for place in places(args)
                }
                for text in args.texts
            },
            "chunk": args.chunk,
            "baseline_chunk": cachegen_baseline.CHUNK_TOKENS,
            "fit_tokens": args.fit_tokens or args.chunk,
            "threads": 1,
        },
        "codecs": {name: asdict(figures) for name, figures in rows},
        "baseline_cachegen": asdict(baseline),
        "baseline_turboquant": {str(bits): asdict(f) for bits, f in turboquant.items()},
        "versus_turboquant": versus_turboquant(rows, turboquant),
        "goals": {name: asdict(GOALS[name]) for name, _ in rows},
        "goals_met": goals,
        "rate_distortion": curve,
        "ranking": ranking({name: figures.kl for name, figures in rows}),
        "floor_figures": floor_figures(rows),
    }
    if curve:
        console.print(render(list(_curve_rows(curve)), {}, "ac rate-distortion sweep"))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        write_plot(result, Path(args.plot))
    if args.rd_plot and curve:
        write_rd_plot(result, Path(args.rd_plot))
    return 0


def _curve_rows(curve: dict[str, dict[str, Any]]) -> Iterator[tuple[str, Figures]]:
    for name, point in curve.items():
        fields = {
            key: point[key]
            for key in Figures.__dataclass_fields__
            if key not in ("quality", "served_quality")
        }
        yield name, Figures(**fields)


def write_rd_plot(result: dict[str, Any], path: Path) -> None:
    """The `--rd` sweep: one curve of bits per element against worst KL per variant (plain and
    rotated `ac`), the fixed-width tracks as points, and the goal's corner."""
    from sidecar.demo.plot import png

    with png(path, (6.5, 4.2), dpi=110) as axes:
        for rotated, label in ((False, "ac"), (True, "ac on rotated KV")):
            points = sorted(
                (p["bits_per_element"], p["kl"])
                for p in result["rate_distortion"].values()
                if p["rotated"] == rotated
            )
            axes.plot(*zip(*points, strict=True), marker="o", label=label)
        for name, figures in result["codecs"].items():
            if figures["bits_per_element"] < 10:
                axes.scatter(figures["bits_per_element"], figures["kl"], color="black", s=12)
                axes.annotate(
                    name,
                    (figures["bits_per_element"], figures["kl"]),
                    textcoords="offset points",
                    xytext=(4, 3),
                    fontsize=8,
                )
        axes.axhline(0.01, color="grey", linestyle="--", linewidth=0.8)
        axes.axvline(16 / 6.5, color="grey", linestyle=":", linewidth=0.8)
        axes.set_yscale("log")
        axes.set_xlabel("bits per element (tables included)")
        axes.set_ylabel("worst KL over texts and places")
        axes.set_title(
            "ac: rate against distortion; goal: left of the dotted line, below the dashed",
            fontsize=9,
        )
        axes.legend(fontsize=8)


def write_plot(result: dict[str, Any], path: Path) -> None:
    """Bits per element against KL, one point per compression and the baseline: the trade-off
    the table states, at a glance (both axes logarithmic)."""
    from sidecar.demo.plot import png

    turboquant = result.get("baseline_turboquant", {})
    points = {
        **result["codecs"],
        "CacheGen baseline": result["baseline_cachegen"],
        **{f"TurboQuant {bits}-bit": figures for bits, figures in turboquant.items()},
    }
    with png(path, (6.5, 4.2), dpi=110) as axes:
        for index, (name, figures) in enumerate(points.items()):
            kl = max(figures["kl"], 1e-9)
            color = "black" if name.startswith(("CacheGen", "TurboQuant")) else None
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
