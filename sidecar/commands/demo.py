"""`kvmoq demo`: what kvmoq does, shown end to end on this machine in a few minutes.

Heavy imports (torch, transformers, rich, matplotlib) happen inside `run`, so `kvmoq --help`
stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from sidecar.demo.decode import PrefixRun, Reference, TrackRun

DEFAULT_TOKENS = 2048
DEFAULT_COMPRESSIONS = "fp16,int8,ac"
EXTENSION_TOKENS = 200
"""Tokens the second decode request adds after the published prompt."""
LINK_GBPS = (0.1, 0.3, 1, 3, 10, 30, 100)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo",
        help="prefill on one node, decode on another: KV caches over a relay, end to end",
        description=(
            "Start a relay and a prefill model server (SmolLM2-135M) that publishes the KV "
            "cache of a long pydoc prompt; then, as the decode server, load that cache through "
            "the relay in each compression, check generation against recomputing, and reuse "
            "it as the prefix of a longer prompt. Prints a table and writes a plot."
        ),
        epilog="Example: kvmoq demo --tokens 1024 --compression fp16,int8,ac --out /tmp/demo",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=DEFAULT_TOKENS,
        help=f"prompt length in tokens (default {DEFAULT_TOKENS}; 128..8192)",
    )
    parser.add_argument(
        "--compression",
        default=DEFAULT_COMPRESSIONS,
        help=f"comma-separated tracks to load (default {DEFAULT_COMPRESSIONS}; "
        "any of fp16 bf16 fp8 int8 fp4 int4 ac)",
    )
    parser.add_argument(
        "--relay", metavar="URL", help="use this relay (moqt://HOST:PORT) instead of starting one"
    )
    parser.add_argument("--ca", metavar="FILE", help="CA certificate of --relay's certificate")
    parser.add_argument(
        "--out", metavar="DIR", default=".", help="where the plot goes (default: current directory)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the relay and the prefill server running (until Ctrl-C) and say how to use them",
    )
    parser.set_defaults(handler=run)


def _check_args(args: argparse.Namespace) -> list[str]:
    from sidecar.kvcache.codecs import CODEC_NAMES

    if not 128 <= args.tokens <= 8192:
        raise SystemExit(f"kvmoq demo: --tokens must be in 128..8192, got {args.tokens}")
    tracks = [t.strip() for t in args.compression.split(",") if t.strip()]
    unknown = [t for t in tracks if t not in CODEC_NAMES]
    if not tracks or unknown:
        raise SystemExit(
            f"kvmoq demo: unknown compression {', '.join(unknown) or '(none)'}; "
            f"choose from {' '.join(CODEC_NAMES)}"
        )
    if bool(args.relay) != bool(args.ca):
        raise SystemExit("kvmoq demo: --relay and --ca go together (the relay's CA to trust)")
    return tracks


def run(args: argparse.Namespace) -> int:
    tracks = _check_args(args)
    from rich.console import Console

    from sidecar.demo.children import ChildFailed

    console = Console(stderr=False)
    try:
        return _run(args, tracks, console)
    except ChildFailed as failure:
        console.print(f"[red]kvmoq demo failed:[/red] {failure}")
        return 1
    except (ConnectionError, OSError, TimeoutError) as failure:
        console.print(f"[red]kvmoq demo failed:[/red] {type(failure).__name__}: {failure}")
        return 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; every process the demo started is stopped[/yellow]")
        return 130


def _run(args: argparse.Namespace, tracks: list[str], console: Console) -> int:
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from sidecar.demo.children import Children
    from sidecar.demo.services import start_prefill, start_relay
    from sidecar.moqt import transport
    from sidecar.moqt.tls import write_certificate

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:>6.0f}/{task.total:.0f}"),
        TimeElapsedColumn(),
        console=console,
    )
    with Children() as children, tempfile.TemporaryDirectory() as tmp, progress:
        if args.relay:
            url, ca = args.relay, Path(args.ca)
        else:
            cert_dir = out / "kvmoq-demo-cert" if args.keep else Path(tmp)
            cert = write_certificate(cert_dir, overwrite=True)
            step = progress.add_task("starting the relay", total=1)
            url, ca = start_relay(children, cert), cert.cert
            progress.update(step, completed=1)

        step = progress.add_task("prefill node: load SmolLM2, compute and publish the KV", total=1)
        prefill, published = start_prefill(children, url, ca, args.tokens)
        progress.update(step, completed=1)

        report = transport.run(_decode(args.tokens, tracks, url, ca, progress))
        report["prefill_node_s"] = published["prefill_s"]
        report["prompt_id"] = published["prompt"]
        progress.stop()
        _show(console, report, out)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        if args.keep:
            console.print(
                f"\nServices are running. Relay: {url} (trust {ca}).\n"
                f"Prompt published: model SmolLM2-135M, id {published['prompt']}.\n"
                "Load it from Python with sidecar.transfer.subscriber.KVSubscriber over "
                "sidecar.moqt.api.connect(url, QuicSettings.loopback(ca_file=CA)).\n"
                "Press Ctrl-C to stop them."
            )
            prefill.process.wait()
    return 0


async def _decode(
    tokens: int, tracks: list[str], url: str, ca: Path, progress: Any
) -> dict[str, Any]:
    from sidecar.demo.decode import SCORED_TOKENS, judge, load, recompute, reuse_prefix
    from sidecar.demo.prefill import MODEL_NAME
    from sidecar.models.corpus import pydoc_token_ids
    from sidecar.models.kv import kv_layout
    from sidecar.models.smollm2 import load_model
    from sidecar.moqt import api
    from sidecar.moqt.quic_backend import QuicSettings
    from sidecar.transfer.subscriber import KVSubscriber

    step = progress.add_task("decode node: load SmolLM2 and recompute the prompt", total=1)
    model = load_model()
    layout = kv_layout(model)
    ids = pydoc_token_ids(tokens + EXTENSION_TOKENS)
    prompt, continuation = ids[:tokens], ids[tokens : tokens + SCORED_TOKENS]
    reference = recompute(model, prompt, continuation)
    progress.update(step, completed=1)

    runs: list[TrackRun] = []
    async with api.connect(url, QuicSettings.loopback(ca_file=ca)) as session:
        subscriber = KVSubscriber(session)
        plans = [(track, (track,), 60.0) for track in tracks]
        plans.append(("adaptive", None, reference.seconds / 2))
        for label, order, deadline in plans:
            if order is not None:
                # The publisher encodes a track on its first request; warm it so the timed
                # load below is what every later decoder sees (served by the relay's cache).
                warm = progress.add_task(f"publisher encodes {label}", total=tokens)
                await load(
                    subscriber,
                    MODEL_NAME,
                    prompt,
                    layout,
                    deadline=120.0,
                    quality_order=order,
                    progress=lambda n, t=warm: progress.update(t, completed=n),
                )
            task = progress.add_task(f"load {label} through the relay", total=tokens)
            result, kv, seconds = await load(
                subscriber,
                MODEL_NAME,
                prompt,
                layout,
                deadline=deadline,
                quality_order=order,
                progress=lambda n, t=task: progress.update(t, completed=n),
            )
            runs.append(
                await asyncio.to_thread(
                    judge, model, label, result, kv, seconds, prompt, continuation, reference
                )
            )
        task = progress.add_task("longer prompt: reuse the published prefix", total=tokens)
        prefix = await reuse_prefix(
            subscriber,
            model,
            MODEL_NAME,
            layout,
            ids[: tokens + EXTENSION_TOKENS],
            "int8" if "int8" in tracks else tracks[0],
            lambda n: progress.update(task, completed=n),
        )
    return _report(tokens, reference, runs, prefix)


def _report(
    tokens: int, reference: Reference, runs: list[TrackRun], prefix: PrefixRun
) -> dict[str, Any]:
    fp16_bytes = reference.kv[:, :, :tokens].numel() * 2
    return {
        "tokens": tokens,
        "recompute_s": reference.seconds,
        "tracks": {
            run.label: {
                "load_s": run.load_s,
                "wire_bytes": run.wire_bytes,
                "ratio_vs_fp16": fp16_bytes / run.wire_bytes if run.wire_bytes else None,
                "loaded_tokens": run.loaded_tokens,
                "speedup_vs_recompute": reference.seconds / run.load_s,
                "kl": None if math.isnan(run.kl) else run.kl,
                "top1": None if math.isnan(run.top1) else run.top1,
                "same_text": run.same_text(reference),
                "tracks_used": run.tracks_used,
                "stopped": run.stopped,
            }
            for run in runs
        },
        "prefix_reuse": {
            "prompt_tokens": prefix.prompt_tokens,
            "reused_tokens": prefix.reused_tokens,
            "computed_tokens": prefix.prompt_tokens - prefix.reused_tokens,
            "load_s": prefix.load_s,
            "compute_s": prefix.compute_s,
            "recompute_s": prefix.recompute_s,
            "same_text": prefix.same_text,
        },
    }


def _show(console: Console, report: dict[str, Any], out: Path) -> None:
    from rich.table import Table

    table = Table(
        title=f"{report['tokens']}-token prompt: recompute {report['recompute_s']:.2f} s "
        "on this machine vs load through the relay (loopback)"
    )
    for column in ("track", "wire MB", "vs fp16", "load s", "speedup", "KL", "top-1", "same text"):
        table.add_column(column, justify="right")
    for label, row in report["tracks"].items():
        quality = (
            (f"{row['kl']:.2e}", f"{row['top1']:.1%}")
            if row["kl"] is not None
            else (f"loaded {row['loaded_tokens']}", "-")
        )
        used = (
            ""
            if len(row["tracks_used"]) <= 1
            else " (" + ", ".join(f"{k}×{v}" for k, v in sorted(row["tracks_used"].items())) + ")"
        )
        table.add_row(
            label + used,
            f"{row['wire_bytes'] / 1e6:.1f}",
            f"{row['ratio_vs_fp16']:.1f}x" if row["ratio_vs_fp16"] else "-",
            f"{row['load_s']:.2f}",
            f"{row['speedup_vs_recompute']:.1f}x",
            *quality,
            "yes" if row["same_text"] else "no",
        )
    console.print(table)
    reuse = report["prefix_reuse"]
    console.print(
        f"Longer prompt ({reuse['prompt_tokens']} tokens): reused {reuse['reused_tokens']} "
        f"from the relay in {reuse['load_s']:.2f} s, computed {reuse['computed_tokens']} in "
        f"{reuse['compute_s']:.2f} s, vs {reuse['recompute_s']:.2f} s to recompute all; "
        f"same text: {'yes' if reuse['same_text'] else 'no'}"
    )
    plot = _plot(report, out)
    console.print(f"Plot of load time against link speed: {plot}")


def _plot(report: dict[str, Any], out: Path) -> Path:
    """Load time per compression against link speed: max(wire time, measured loopback time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, row in report["tracks"].items():
        if label == "adaptive":
            continue
        times = [max(row["load_s"], row["wire_bytes"] * 8 / (gbps * 1e9)) for gbps in LINK_GBPS]
        axes.plot(LINK_GBPS, times, marker="o", label=label)
    axes.axhline(report["recompute_s"], color="black", linestyle="--", label="recompute")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("link speed (Gbit/s)")
    axes.set_ylabel("time to have the KV cache (s)")
    axes.set_title(f"{report['tokens']}-token prompt, SmolLM2-135M")
    axes.legend()
    figure.tight_layout()
    path = (out / "kvmoq-demo.png").resolve()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
