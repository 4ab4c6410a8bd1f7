"""`kvmoq demo`: what kvmoq does, shown end to end on this machine in a few minutes.

Heavy imports (torch, transformers, rich, matplotlib) happen inside `run`, so `kvmoq --help`
stays fast.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from sidecar.demo.nodes import SidecarNode

DEFAULT_TOKENS = 1024
DEFAULT_COMPRESSIONS = "fp16,int8,ac"
SILENCE_S = 300.0
"""Longest a model server may go without reporting a step (model load, a long prefill)."""
LINK_GBPS = (0.1, 0.3, 1, 3, 10, 30, 100)
ENGINES = ("transformers", "vllm")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo",
        help="prefill on one node, decode on another: KV caches over a relay, end to end",
        description=(
            "Start a relay, two sidecars and two model servers (SmolLM2-135M through the "
            "kvmoq_client library), each beside its sidecar. The prefill server publishes the "
            "KV cache of a long pydoc prompt; the decode server loads it through its sidecar "
            "and the relay in each compression, checks generation against recomputing, and "
            "reuses it as the prefix of a longer prompt. Prints a table and writes a plot."
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
        "--engine",
        choices=ENGINES,
        default=ENGINES[0],
        help="the inference servers beside the sidecars: transformers (default; the "
        "built-in SmolLM2 model servers, about 2 minutes) or vllm (two vLLM engines with "
        "the kvmoq connector, from .venv-vllm; about 4 minutes)",
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
        help="leave the relay, both sidecars and both model servers running (until Ctrl-C), "
        "the decode server answering requests that extend the prompt, and say how to call them",
    )
    parser.set_defaults(handler=run)


def _check_args(args: argparse.Namespace) -> tuple[str, ...]:
    from sidecar.kvcache.errors import UnknownCodecError
    from sidecar.kvcache.tracks import parse_codec_names

    if not 128 <= args.tokens <= 8192:
        raise SystemExit(f"kvmoq demo: --tokens must be in 128..8192, got {args.tokens}")
    try:
        tracks = parse_codec_names(args.compression)
    except UnknownCodecError as exc:
        raise SystemExit(f"kvmoq demo: {exc}") from None
    if bool(args.relay) != bool(args.ca):
        raise SystemExit("kvmoq demo: --relay and --ca go together (the relay's CA to trust)")
    if args.engine == "vllm":
        from sidecar.demo.vllm_engines import set_up_vllm

        if args.keep:
            raise SystemExit("kvmoq demo: --keep serves over HTTP with --engine transformers only")
        if reason := set_up_vllm():
            raise SystemExit(f"kvmoq demo --engine vllm: {reason}")
    return tracks


def run(args: argparse.Namespace) -> int:
    tracks = _check_args(args)
    from sidecar.demo.children import ChildFailed
    from sidecar.terminal import console as wide_console

    console = wide_console()
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


def _run(args: argparse.Namespace, tracks: tuple[str, ...], console: Console) -> int:
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    from sidecar.demo.children import ChildFailed, Children
    from sidecar.demo.nodes import start_model_server, start_sidecar
    from sidecar.demo.services import start_relay
    from sidecar.demo.steps import Events, StepView
    from sidecar.moqt.aio.tls import write_certificate

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

    def add_bar(description: str, total: int) -> TaskID:
        # Off a terminal the bars show only at the end: a line per step says, as it
        # happens, where a slow or stuck run is (a log, a test's captured output).
        if not console.is_terminal:
            console.log(description)
        return progress.add_task(description, total=total)

    view = StepView(add_bar, lambda bar, completed: progress.update(bar, completed=completed))
    # Children inside the scratch directory: they stop before their sockets are removed.
    with tempfile.TemporaryDirectory() as tmp, Children() as children, progress:
        scratch = Path(tmp)
        if args.relay:
            url, ca = args.relay, Path(args.ca)
        else:
            cert_dir = out / "kvmoq-demo-cert" if args.keep else scratch
            cert = write_certificate(cert_dir, overwrite=True)
            step = progress.add_task("starting the relay", total=1)
            relay = start_relay(children, cert)
            url, ca = relay.url, cert.cert
            progress.update(step, completed=1, description=f"relay on {relay.backend}")

        step = progress.add_task("starting two sidecars, each connected to the relay", total=2)
        prefill_sidecar = start_sidecar(children, "prefill sidecar", url, ca, scratch)
        progress.update(step, completed=1)
        decode_sidecar = start_sidecar(children, "decode sidecar", url, ca, scratch)
        progress.update(step, completed=2)

        if args.engine == "vllm":
            from sidecar.demo import vllm_demo

            def step(description: str) -> None:
                progress.console.log(description)

            report = vllm_demo.run(
                children, step, prefill_sidecar, decode_sidecar, args.tokens, tracks
            )
            progress.stop()
            _show_vllm(console, report)
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
            return 0

        common = ("--tokens", str(args.tokens), "--tracks", ",".join(tracks))
        prefill = start_model_server(
            children,
            "prefill server",
            "sidecar.demo.prefill_server",
            "--sidecar",
            prefill_sidecar.grpc,
            *common,
        )
        published = Events(prefill, view, SILENCE_S).wait("published")
        decode = start_model_server(
            children,
            "decode server",
            "sidecar.demo.decode_server",
            "--sidecar",
            decode_sidecar.grpc,
            *common,
            *(["--keep"] if args.keep else []),
        )
        decode_events = Events(decode, view, SILENCE_S)
        report = decode_events.wait("report")
        del report["event"]
        report["prefill_node_s"] = published["prefill_s"]
        report["prompt_id"] = published["prompt"]
        report["sidecars"] = {
            "prefill": {"published_bytes": prefill_sidecar.counter("kvmoq_published_bytes")},
            "decode": {"loaded_bytes": decode_sidecar.counter("kvmoq_loaded_bytes")},
        }
        progress.stop()
        _show(console, report, out)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        if args.keep:
            serving = decode_events.wait("serving")
            console.print(
                _services(url, ca, prefill_sidecar, decode_sidecar, published, serving),
                markup=False,
                highlight=False,
                soft_wrap=True,  # the curl line stays one line, ready to copy
            )
            gone = children.wait_any()
            raise ChildFailed(
                f"{gone.name} exited with {gone.process.returncode}:\n{gone.log_tail()}"
            )
    return 0


def _services(
    url: str,
    ca: Path,
    prefill: SidecarNode,
    decode: SidecarNode,
    published: dict[str, Any],
    serving: dict[str, Any],
) -> str:
    """What `--keep` leaves running and how to call it (`serving`: the decode server's
    event saying where it listens and what a request may ask for)."""
    request = json.dumps({"text": " In short,", "max_new_tokens": 32})
    return (
        "\nServices are running; Ctrl-C (or SIGTERM) stops them all.\n"
        f"Relay: {url} (trust {ca}).\n"
        f"Prefill sidecar: {prefill.grpc} (metrics http://{prefill.http}/metrics); its "
        f"model server published SmolLM2-135M prompt {published['prompt']}, the first "
        f"{published['tokens']} tokens of sidecar.models.corpus.pydoc_token_ids.\n"
        f"Decode sidecar: {decode.grpc} (metrics http://{decode.http}/metrics).\n"
        f"Decode model server: adds your text (up to {serving['max_text_tokens']} tokens) to "
        'that prompt, loads the published part through its sidecar (optional "track": one '
        f"of {', '.join(serving['tracks'])}; else the sidecar chooses), computes the rest and "
        f"generates up to {serving['max_new_tokens']} tokens:\n"
        f"  curl -s http://{serving['http']}/generate -d '{request}'\n"
        "A model server of your own can use either sidecar the same way (README.md, "
        '"How an inference server calls it").'
    )


def _show(console: Console, report: dict[str, Any], out: Path) -> None:
    from rich import box
    from rich.table import Table

    # No vertical rules and the labels' width kept: piped or logged (80 columns) the table
    # still shows every track's name, its mix and what was computed (wrapped, not cut).
    table = Table(
        title=f"{report['tokens']}-token prompt: recompute {report['recompute_s']:.2f} s "
        "on this machine vs load through the decode sidecar and the relay (loopback)",
        box=box.SIMPLE_HEAD,
    )
    labels = {}
    for label, row in report["tracks"].items():
        used = "" if len(row["tracks_used"]) <= 1 else f" ({', '.join(sorted(row['tracks_used']))})"
        missing = report["tokens"] - row["loaded_tokens"]
        computed = f" +{missing} computed" if missing > 0 else ""
        labels[label] = label + used + computed
    widest = max(map(len, report["tracks"]))  # a mix longer than that folds
    table.add_column("track", justify="right", min_width=widest, overflow="fold")
    for column in ("wire MB", "vs fp16", "load s", "speedup", "KL", "top-1", "same text"):
        table.add_column(column, justify="right")
    for label, row in report["tracks"].items():
        table.add_row(
            labels[label],
            f"{row['wire_bytes'] / 1e6:.1f}",
            f"{row['ratio_vs_fp16']:.1f}x" if row["ratio_vs_fp16"] else "-",
            f"{row['load_s']:.2f}",
            f"{row['speedup_vs_recompute']:.1f}x",
            f"{row['kl']:.2e}",
            f"{row['top1']:.1%}",
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
    published = report["sidecars"]["prefill"]["published_bytes"]
    loaded = report["sidecars"]["decode"]["loaded_bytes"]
    console.print(
        f"Sidecars: the prefill one encoded {sum(published.values()) / 1e6:.1f} MB "
        f"({', '.join(sorted(published))}), the decode one loaded "
        f"{sum(loaded.values()) / 1e6:.1f} MB ({', '.join(sorted(loaded))})."
    )
    plot = _plot(report, out)
    console.print(f"Plot of load time against link speed: {plot}")


def _show_vllm(console: Console, report: dict[str, Any]) -> None:
    from rich.table import Table

    from sidecar.demo.vllm_demo import NEW_TOKENS

    table = Table(
        title=f"vLLM: {report['tokens']}-token prompt, {NEW_TOKENS} tokens generated. Engine P "
        f"computed it in {report['recompute_s']:.2f} s; engine D loads it through its sidecar "
        "and the relay (loopback)"
    )
    for column in ("track", "seconds", "vs P", "tokens not computed", "chunks loaded", "P's text"):
        table.add_column(column, justify="right")
    for label, row in report["tracks"].items():
        table.add_row(label, *_vllm_cells(row))
    reuse = report["prefix_reuse"]
    table.add_row(f"longer prompt, {reuse['prompt_tokens']} tokens", *_vllm_cells(reuse))
    console.print(table)
    console.print(
        "vLLM counts the tokens a load was scheduled for as not computed; a chunk that did "
        "not arrive in time is computed after all (the chunks column says what arrived)."
    )
    for label, row in report["tracks"].items():
        for warning in row.get("warnings", ()):
            console.print(f"{label}: the connector said: {warning}", markup=False)


def _vllm_cells(row: dict[str, Any]) -> list[str]:
    chunks = " ".join(f"{t}×{n}" for t, n in sorted(row["chunks"].items())) or "none"
    return [
        f"{row['seconds']:.2f}",
        f"{row['speedup']:.1f}x",
        str(row["cached_tokens"]),
        chunks,
        "same" if row["same_text"] else "differs",
    ]


def _plot(report: dict[str, Any], out: Path) -> Path:
    """Load time per compression against link speed: max(wire time, measured loopback time)."""
    from sidecar.demo.plot import png

    path = (out / "kvmoq-demo.png").resolve()
    with png(path, (7, 4.5), dpi=120) as axes:
        for label, row in report["tracks"].items():
            if label.startswith("adaptive"):  # a mix of tracks: no one line
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
    return path
