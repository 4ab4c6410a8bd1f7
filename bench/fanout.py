"""Fan-out: one prompt's KV to many decoders, through one relay and through a relay cluster.

One prefill serves many decoders; the question is what the relay tier pays for it. One
prompt (synthetic KV with SmolLM2-135M's layout, `--tokens`, one `--track`) is published by
this process, then N decoders (`--subscribers`) load it at once: through one relay (the
baseline), and through a root relay with `--edges` edges (`kvmoq relay --upstream`), the
decoders spread over the edges. Every relay is a `kvmoq relay` process on loopback; the
decoders are `KVSubscriber` sessions in `--loaders` worker processes (bench.fanout_loader),
connected before the clock starts.

Each number of decoders gets a prompt of its own (other token ids, the same KV), loaded once
through the single relay and once through the root before the clock starts: both hold it in
their caches, as after the first decoder of a popular prompt, and the publisher is off the
path. The edges do not: what the root sends them during the round is the cluster's cost of
fanning out. That first load's digest is the reference every timed load must match, whole,
or the benchmark fails. A round's seconds run from "go" to the last decoder's last chunk. For each relay the
round's CPU seconds (from /proc) and object bytes sent (its /metrics) are reported: CPU per
MB delivered is what a relay machine pays per decoder, and the root's bytes show the fan-out
moving to the edges. On a machine with few cores every process shares them (relays, loaders,
this one), so wall time understates what separate machines would see; CPU per MB and bytes
per tier do not depend on that.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.fanout_loader import Loaders, load_digest, token_ids
from bench.harness import LoadMismatch, add_datagram_size, check_datagram_size, conclude, measured
from bench.parallel_load import HEAD_DIM, KV_HEADS, LAYERS, MODEL, synthetic_kv
from bench.procstat import cpu_seconds

if TYPE_CHECKING:
    from sidecar.demo.children import Children
    from sidecar.moqt.aio.tls import CertificatePaths

DEFAULT_TOKENS = 4096
DEFAULT_SUBSCRIBERS = "1,8,32"
DEFAULT_EDGES = 3
DEFAULT_LOADERS = 2
TOKEN_RANGE = range(128, 16384 + 1)
GOAL_ROOT_COPIES = 1.0
"""The root sends each edge one copy of the prompt, however many decoders are below it."""
GOAL_ROOT_CPU_SHARE = 0.5
"""At 8 decoders and more, the root's CPU per MB delivered is at most half the single relay's."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokens",
        type=int,
        default=DEFAULT_TOKENS,
        help=f"prompt length in tokens (default {DEFAULT_TOKENS}; "
        f"{TOKEN_RANGE.start}..{TOKEN_RANGE.stop - 1})",
    )
    parser.add_argument("--track", default="int8", help="the track every decoder loads")
    parser.add_argument(
        "--subscribers",
        default=DEFAULT_SUBSCRIBERS,
        help=f"comma-separated numbers of decoders loading at once (default {DEFAULT_SUBSCRIBERS})",
    )
    parser.add_argument(
        "--edges",
        type=int,
        choices=range(1, 17),
        default=DEFAULT_EDGES,
        metavar="E",
        help=f"edges under the root (1..16, default {DEFAULT_EDGES})",
    )
    parser.add_argument(
        "--loaders",
        type=int,
        choices=range(1, 17),
        default=DEFAULT_LOADERS,
        metavar="P",
        help=f"worker processes the decoders' sessions are spread over (default {DEFAULT_LOADERS})",
    )
    add_datagram_size(parser)
    parser.add_argument("--plot", metavar="FILE", help="also draw the figures as a PNG")


@dataclass(frozen=True, slots=True)
class Job:
    tokens: int
    track: str
    subscribers: tuple[int, ...]
    edges: int
    loaders: int
    datagram_size: int


def _job(args: argparse.Namespace) -> Job:
    from sidecar.kvcache.errors import UnknownCodecError
    from sidecar.kvcache.tracks import parse_codec_names

    def fail(message: str) -> SystemExit:
        return SystemExit(f"kvmoq bench fanout: {message}")

    if args.tokens not in TOKEN_RANGE:
        raise fail(f"--tokens must be in {TOKEN_RANGE.start}..{TOKEN_RANGE.stop - 1}")
    try:
        (track,) = parse_codec_names(args.track)
        subscribers = tuple(sorted({int(n) for n in args.subscribers.split(",")}))
    except (UnknownCodecError, ValueError) as exc:
        raise fail(f"{exc} (one --track, --subscribers numbers)") from None
    if not subscribers or not all(1 <= n <= 64 for n in subscribers):
        raise fail("--subscribers must be numbers in 1..64")
    size = check_datagram_size(args.max_datagram_size, "kvmoq bench fanout")
    return Job(args.tokens, track, subscribers, args.edges, args.loaders, size)


def run(args: argparse.Namespace) -> int:
    job = _job(args)
    report = measured(
        "fanout", lambda children, cert: _measure(job, children, cert), (LoadMismatch,)
    )
    if report is None:
        return 1
    conclude(report, _goals, _show, args.json)
    if args.plot:
        write_plot(report, Path(args.plot))
    return 0


@dataclass(frozen=True, slots=True)
class Relay:
    """A relay process of the benchmark: its role, URL, pid, /metrics address, QUIC stack."""

    role: str  # "relay" (the baseline), "root" or "edge N"
    url: str
    pid: int
    http: str
    backend: str

    def snapshot(self) -> tuple[float, float]:
        from sidecar.moqt.relay.metrics import scrape

        return cpu_seconds(self.pid), scrape(self.http)["object_bytes_sent"]


def measured_relay(
    children: Children, cert: CertificatePaths, role: str, datagram_size: int, *flags: str
) -> Relay:
    from sidecar.address import free_tcp_port
    from sidecar.demo.services import HOST, start_relay

    http = f"{HOST}:{free_tcp_port()}"
    service = start_relay(children, cert, "--http", http, *flags, datagram_size=datagram_size)
    return Relay(role, service.url, service.pid, http, service.backend)


async def _measure(job: Job, children: Children, cert: CertificatePaths) -> dict[str, Any]:
    from sidecar.kvcache.layout import KVLayout
    from sidecar.moqt.aio import api
    from sidecar.moqt.aio.quic_backend import QuicSettings
    from sidecar.transfer.publisher import KVPublisher
    from sidecar.transfer.subscriber import KVSubscriber

    size = job.datagram_size
    single = measured_relay(children, cert, "relay", size)
    root = measured_relay(children, cert, "root", size)
    upstream = ("--upstream", root.url, "--ca", str(cert.cert))
    edges = [
        measured_relay(children, cert, f"edge {i + 1}", size, *upstream) for i in range(job.edges)
    ]
    settings = QuicSettings.sidecar_like(ca_file=cert.cert, max_datagram_size=job.datagram_size)
    layout = KVLayout(LAYERS, KV_HEADS, HEAD_DIM, "float16")
    print(
        f"one relay, and a root with {job.edges} edge(s), on {single.backend}; publisher and "
        f"decoders on {settings.backend}; a {job.tokens}-token {job.track} prompt; "
        f"{job.datagram_size}-byte packets"
    )
    async with AsyncExitStack() as stack:
        publisher = KVPublisher()
        sessions = [
            await stack.enter_async_context(api.connect(relay.url, settings, publisher=publisher))
            for relay in (single, root)
        ]
        warmers = [
            KVSubscriber(await stack.enter_async_context(api.connect(relay.url, settings)))
            for relay in (single, root)
        ]
        for edge in edges:
            await asyncio.to_thread(_wait_connected, edge)
        kv = synthetic_kv(layout, job.tokens)
        reference: dict[str, Any] | None = None
        rows = []
        for number, n in enumerate(job.subscribers):
            prompt = publisher.prompt(
                MODEL,
                layout,
                token_ids(job.tokens, number),
                tracks=(job.track,),
                default_track=job.track,
            )
            for session in sessions:
                await session.publish_namespace(prompt.namespace)
            await prompt.publish(kv)
            warm = [await load_digest(w, MODEL, job.tokens, number, job.track) for w in warmers]
            reference = reference or warm[0]
            if any(not load["complete"] or load["digest"] != reference["digest"] for load in warm):
                raise LoadMismatch(f"the loads that fill the caches disagree: {warm}")
            for topology, entries, relays in (
                ("one relay", [single], [single]),
                (f"root + {job.edges} edges", edges, [root, *edges]),
            ):
                print(f"{n} decoder(s) through {topology}")
                urls = [entries[i % len(entries)].url for i in range(n)]
                row = await _round(job, cert, number, urls, relays, reference)
                rows.append({"topology": topology, "subscribers": n, **row})
        assert reference is not None
    return {
        "layout": f"{MODEL} ({LAYERS} layers, {KV_HEADS} KV heads, head dim {HEAD_DIM})",
        "tokens": job.tokens,
        "track": job.track,
        "edges": job.edges,
        "loaders": job.loaders,
        "datagram_size": job.datagram_size,
        "relay_backend": single.backend,
        "client_backend": settings.backend,
        "prompt_bytes": reference["bytes"],
        "rows": rows,
    }


def _wait_connected(edge: Relay, timeout: float = 30.0) -> None:
    from sidecar.moqt.relay.metrics import scrape

    deadline = time.monotonic() + timeout
    while scrape(edge.http)["upstream_up"] != 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{edge.role} did not connect to the root")
        time.sleep(0.1)


async def _round(
    job: Job,
    cert: CertificatePaths,
    prompt: int,
    urls: list[str],
    relays: list[Relay],
    reference: dict[str, Any],
) -> dict[str, Any]:
    """Time one load per decoder at once, with each relay's CPU and bytes sent meanwhile."""
    loaders = Loaders(cert.cert, job.tokens, job.track, job.datagram_size, job.loaders)
    async with loaders.connected([(url, prompt) for url in urls]) as loading:
        before = [await asyncio.to_thread(relay.snapshot) for relay in relays]
        seconds, loads = await loading.go({prompt: reference["digest"]})
        after = [await asyncio.to_thread(relay.snapshot) for relay in relays]
    delivered_mb = sum(load["bytes"] for load in loads) / 1e6
    times = sorted(load["seconds"] for load in loads)
    return {
        "seconds": seconds,
        "aggregate_mbps": delivered_mb / seconds,
        "load_p50_s": statistics.median(times),
        "load_p99_s": percentile(times, 0.99),
        "relays": [
            {
                "role": relay.role,
                "cpu_s": cpu1 - cpu0,
                "cpu_s_per_mb": (cpu1 - cpu0) / delivered_mb,
                "bytes_sent": sent1 - sent0,
            }
            for relay, (cpu0, sent0), (cpu1, sent1) in zip(relays, before, after, strict=True)
        ],
    }


def percentile(ordered: list[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted figures."""
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _goals(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The relay tier's two promises, checked on every round of the run."""
    prompt = report["prompt_bytes"]
    copies, shares = [], []
    rows = report["rows"]
    for single, cluster in zip(rows[::2], rows[1::2], strict=True):
        root = cluster["relays"][0]
        copies.append(root["bytes_sent"] / (report["edges"] * prompt))
        if cluster["subscribers"] >= 8:
            shares.append(root["cpu_s_per_mb"] / single["relays"][0]["cpu_s_per_mb"])
    return {
        "root_sends_one_copy_per_edge": {
            "goal": f"root bytes sent <= {GOAL_ROOT_COPIES:g} x edges x prompt bytes",
            "worst": max(copies),
            "met": max(copies) <= GOAL_ROOT_COPIES + 0.01,  # catalogs ride along
        },
        "root_cpu_per_mb_at_8_plus": {
            "goal": f"root CPU s/MB <= {GOAL_ROOT_CPU_SHARE:g} x one relay's, at >= 8 decoders",
            "worst": max(shares, default=None),
            "met": bool(shares) and max(shares) <= GOAL_ROOT_CPU_SHARE,
        },
    }


def _show(report: dict[str, Any]) -> None:
    print(
        f"\n{report['layout']}, {report['tokens']} tokens of {report['track']} "
        f"({report['prompt_bytes'] / 1e6:.1f} MB a load), {report['datagram_size']}-byte "
        f"packets; {report['loaders']} loader process(es); {report['cpus']} CPUs, load "
        f"average {report['load_average_at_start']:.1f} at the start"
    )
    print(
        f"{'decoders':>8} {'topology':18} {'seconds':>8} {'MB/s':>7} {'vs 1 relay':>10}"
        f" {'p50 s':>6} {'p99 s':>6}  relay CPU s/MB and MB sent, per relay"
    )
    rows = report["rows"]
    for single, cluster in zip(rows[::2], rows[1::2], strict=True):
        for row in (single, cluster):
            ratio = row["aggregate_mbps"] / single["aggregate_mbps"]
            relays = "  ".join(
                f"{r['role']}: {r['cpu_s_per_mb'] * 1000:.1f} ms/MB {r['bytes_sent'] / 1e6:.0f} MB"
                for r in row["relays"]
            )
            print(
                f"{row['subscribers']:>8} {row['topology']:18} {row['seconds']:>8.2f}"
                f" {row['aggregate_mbps']:>7.1f} {ratio:>9.2f}x {row['load_p50_s']:>6.2f}"
                f" {row['load_p99_s']:>6.2f}  {relays}"
            )
    for name, goal in report["goals"].items():
        worst = "n/a" if goal["worst"] is None else f"{goal['worst']:.3f}"
        print(f"goal {name}: {goal['goal']}: worst {worst}: {'met' if goal['met'] else 'NOT met'}")


def write_plot(report: dict[str, Any], path: Path) -> None:
    """Aggregate MB/s per number of decoders, one bar per topology; above each cluster bar,
    the MB the root sent."""
    from sidecar.demo.plot import bars, png

    rows = report["rows"]
    topologies = list(dict.fromkeys(row["topology"] for row in rows))
    groups = [str(n) for n in dict.fromkeys(row["subscribers"] for row in rows)]
    series = {
        t: [row["aggregate_mbps"] for row in rows if row["topology"] == t] for t in topologies
    }
    notes = {
        t: [
            f"{row['relays'][0]['bytes_sent'] / 1e6:.0f} MB" for row in rows if row["topology"] == t
        ]
        for t in topologies
    }
    with png(path, (7, 4), 120) as axes:
        bars(axes, groups, series, notes)
        axes.set_xlabel("decoders loading at once")
        axes.set_ylabel("aggregate MB/s")
        axes.set_title(
            f"{report['tokens']}-token {report['track']} prompt to N decoders "
            f"(labels: MB sent by the relay / root)"
        )
        axes.legend()
