"""Load: many decoders on one relay at once, fed by one publisher and by eight.

Rounds through one `kvmoq relay` process (`--cache-bytes`, on loopback): the baseline, one
decoder alone loading one publisher's prompt; one prompt to `--fanout` decoders (32); and
`--publishers` publishers (8) with `--per-publisher` decoders each (8); MB/s delivered is
shown against the baseline's (`vs alone`). Every publisher is a prefill node: a `kvmoq
sidecar` process fed over gRPC, from shared memory, by a model server of its own
(bench.load_publisher: synthetic KV in SmolLM2-135M's layout, `--tokens`, one `--track`); the
decoders are `KVSubscriber` sessions in `--loaders` processes (bench.fanout_loader),
connected before the clock starts. Nothing is cached before a round: the first loads of a
prompt pull it from its publisher through the relay while the others wait on the relay.

Reported per round: objects/s (one object per token) and MB/s delivered to the decoders,
p50/p99 of the loads' seconds, and each process's peak resident memory (VmHWM, from
/proc). Every load must bring every token, the bytes a local encode and decode of the same
KV give, or the benchmark fails, as it does when a round passes `ROUND_TIMEOUT_S`. Goals
(issue "Security and reliability"), checked in code and written to the JSON: a publishing
sidecar's peak above its memory before it saw any KV, less the model server's buffers it maps
(shared memory, counted in both processes' RSS), stays within 2x the KV it holds; the relay's
peak stays within its cache budget plus `RELAY_MARGIN_BYTES`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.fanout import measured_relay, percentile
from bench.fanout_loader import Loaders, chunk_digest, prompt_digest, reply
from bench.harness import LoadMismatch, conclude, measured
from bench.parallel_load import HEAD_DIM, KV_HEADS, LAYERS, MODEL, synthetic_kv
from bench.procstat import memory, reset_peak

if TYPE_CHECKING:
    from sidecar.demo.children import Children
    from sidecar.moqt.aio.tls import CertificatePaths

GOAL_PUBLISHER_KV_MULTIPLE = 2.0
RELAY_MARGIN_BYTES = 256 << 20
"""What the relay may hold beyond its cache: the interpreter, sessions, queues."""
DEFAULT_CACHE_BYTES = 1 << 30
MODEL_SERVER_STOP_S = 10.0
PUBLISH_TIMEOUT_S = 300.0
"""From a model server's start to its prompts published: imports, then encoding on a busy
machine."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sidecar.moqt.aio.quic_backend import LOOPBACK_DATAGRAM_SIZE

    parser.add_argument("--tokens", type=int, default=2048, help="tokens per prompt (2048)")
    parser.add_argument("--track", default="int8", help="the one track loaded (int8)")
    parser.add_argument("--fanout", type=int, default=32, help="decoders of one prompt (32)")
    parser.add_argument("--publishers", type=int, default=8, help="publisher processes (8)")
    parser.add_argument(
        "--per-publisher", type=int, default=8, help="decoders of each publisher's prompt (8)"
    )
    parser.add_argument("--loaders", type=int, default=2, help="decoder processes (2)")
    parser.add_argument(
        "--cache-bytes", type=int, default=DEFAULT_CACHE_BYTES, help="the relay's (1 GiB)"
    )
    parser.add_argument(
        "--max-datagram-size", type=int, default=LOOPBACK_DATAGRAM_SIZE, metavar="BYTES"
    )


@dataclass(frozen=True, slots=True)
class Job:
    tokens: int
    track: str
    fanout: int
    publishers: int
    per_publisher: int
    loaders: int
    cache_bytes: int
    datagram_size: int


def _job(args: argparse.Namespace) -> Job:
    from sidecar.kvcache.errors import UnknownCodecError
    from sidecar.kvcache.tracks import parse_codec_names

    def fail(message: str) -> SystemExit:
        return SystemExit(f"kvmoq bench load: {message}")

    try:
        (track,) = parse_codec_names(args.track)
    except (UnknownCodecError, ValueError) as exc:
        raise fail(f"{exc} (one --track)") from None
    if not 128 <= args.tokens <= 16384:
        raise fail("--tokens must be in 128..16384")
    for name in ("fanout", "publishers", "per_publisher", "loaders"):
        if not 1 <= getattr(args, name) <= 64:
            raise fail(f"--{name.replace('_', '-')} must be in 1..64")
    if args.cache_bytes < 1 << 20:
        raise fail("--cache-bytes must be at least 1 MiB")
    return Job(
        args.tokens, track, args.fanout, args.publishers, args.per_publisher, args.loaders,
        args.cache_bytes, args.max_datagram_size,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    job = _job(args)
    report = measured("load", lambda children, cert: _measure(job, children, cert), (LoadMismatch,))
    if report is None:
        return 1
    conclude(report, _goals, _show, args.json)
    return 0


def reference_digest(job: Job) -> str:
    """What every load of a prompt must write: the synthetic KV through a local encode and
    decode on the track, chunk by chunk, digested as bench.fanout_loader digests loads."""
    from sidecar.kvcache.codecs import get_codec
    from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE, KVLayout, chunk_ranges

    layout = KVLayout(LAYERS, KV_HEADS, HEAD_DIM, "float16")
    kv = synthetic_kv(layout, job.tokens)
    codec = get_codec(job.track)
    first = kv[:, :, :DEFAULT_CHUNK_SIZE]
    tables = codec.fit_tables(layout, first)
    digests = []
    for span in chunk_ranges(job.tokens, DEFAULT_CHUNK_SIZE):
        part = kv[:, :, span.start : span.stop]
        decoded = codec.decode(codec.encode(part, layout, tables), layout, tables)
        digests.append(chunk_digest(decoded))
    return prompt_digest(digests)


async def _measure(job: Job, children: Children, cert: CertificatePaths) -> dict[str, Any]:
    cache = ("--cache-bytes", str(job.cache_bytes))
    relay = measured_relay(children, cert, "relay", job.datagram_size, *cache)
    reference = await asyncio.to_thread(reference_digest, job)
    loaders = Loaders(cert.cert, job.tokens, job.track, job.datagram_size, job.loaders)
    alone = job.publishers + 1
    rounds = (
        ("alone", [[alone]], 1),
        ("one prompt", [[0]], job.fanout),
        ("many publishers", [[p] for p in range(1, job.publishers + 1)], job.per_publisher),
    )
    print(
        f"one relay on {relay.backend}; {job.tokens}-token {job.track} prompts; "
        f"{job.datagram_size}-byte packets"
    )
    rows = []
    publisher_memory: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        for name, prompts_by_publisher, decoders in rounds:
            print(f"{name}: {len(prompts_by_publisher)} publisher(s) x {decoders} decoder(s)")
            publishers = [
                await stack.enter_async_context(_publisher(job, children, cert, relay.url, prompts))
                for prompts in prompts_by_publisher
            ]
            sessions = [
                (relay.url, prompt)
                for prompts in prompts_by_publisher
                for prompt in prompts
                for _ in range(decoders)
            ]
            async with loaders.connected(sessions) as loading:
                pids = [p.pid for p in loading.loaders]
                seconds, loads = await loading.go(dict.fromkeys(range(alone + 1), reference))
                loader_peaks = [memory(pid).peak for pid in pids]
            publisher_memory += [publisher.measured() for publisher in publishers]
            rows.append(_row(name, len(prompts_by_publisher), decoders, seconds, loads, job))
            rows[-1]["loader_peak_rss"] = loader_peaks
            rows[-1]["vs_alone"] = rows[-1]["mbps"] / rows[0]["mbps"]
    return {
        "layout": f"{MODEL} ({LAYERS} layers, {KV_HEADS} KV heads, head dim {HEAD_DIM})",
        "tokens": job.tokens,
        "track": job.track,
        "cache_bytes": job.cache_bytes,
        "datagram_size": job.datagram_size,
        "relay_backend": relay.backend,
        "rows": rows,
        "relay_peak_rss": memory(relay.pid).peak,
        "publishers": publisher_memory,
    }


def _row(
    name: str, publishers: int, decoders: int, seconds: float, loads: list[dict[str, Any]],
    job: Job,
) -> dict[str, Any]:  # fmt: skip
    times = sorted(load["seconds"] for load in loads)
    payload = sum(load["bytes"] for load in loads)
    return {
        "round": name,
        "publishers": publishers,
        "decoders": publishers * decoders,
        "seconds": seconds,
        "objects_per_s": len(loads) * job.tokens / seconds,
        "mbps": payload / 1e6 / seconds,
        "load_p50_s": statistics.median(times),
        "load_p99_s": percentile(times, 0.99),
        "verified_loads": len(loads),
    }


@dataclass(frozen=True, slots=True)
class Publisher:
    """A publishing node: a `kvmoq sidecar` and the model server that fed it its KV."""

    sidecar_pid: int
    baseline_rss: int
    """The sidecar's resident memory once its relay session was up, before it saw any KV."""
    kv_bytes: int

    def measured(self) -> dict[str, Any]:
        """The sidecar's peak, and the model server's buffers it maps (in its RSS, not its
        own memory: the goal leaves them out)."""
        now = memory(self.sidecar_pid)
        return {
            "baseline_rss": self.baseline_rss,
            "kv_bytes": self.kv_bytes,
            "peak_rss": now.peak,
            "mapped_shared": now.shared,
        }


@asynccontextmanager
async def _publisher(
    job: Job, children: Children, cert: CertificatePaths, url: str, prompts: list[int]
) -> AsyncIterator[Publisher]:
    """A sidecar, and a bench.load_publisher model server that has published `prompts`
    through it; the model server stops after (the sidecar with the benchmark's children)."""
    from sidecar.demo.nodes import start_sidecar

    name = f"publisher {'-'.join(map(str, prompts))}"
    scratch = cert.cert.parent
    size = ("--max-datagram-size", str(job.datagram_size))
    node = await asyncio.to_thread(start_sidecar, children, name, url, cert.cert, scratch, *size)
    pid = node.child.process.pid
    baseline = memory(pid).rss
    reset_peak(pid)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.load_publisher", "--sidecar", node.grpc,
        "--tokens", str(job.tokens), "--prompts", ",".join(map(str, prompts)),
        "--track", job.track, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        ready = await asyncio.wait_for(reply(process, "ready"), PUBLISH_TIMEOUT_S)
        yield Publisher(pid, baseline, ready["kv_bytes"])
    finally:
        # Its stdin closed, it unregisters and removes its shared-memory file.
        assert process.stdin is not None
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), MODEL_SERVER_STOP_S)
        except TimeoutError:
            process.kill()
            await process.wait()


def _held(publisher: dict[str, Any]) -> int:
    """A publishing sidecar's peak above its baseline, less the model server's buffers."""
    return int(publisher["peak_rss"] - publisher["baseline_rss"] - publisher["mapped_shared"])


def _goals(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    multiples = [_held(p) / p["kv_bytes"] for p in report["publishers"]]
    relay_over = report["relay_peak_rss"] - report["cache_bytes"]
    return {
        "publisher_memory": {
            "goal": f"publishing sidecar's peak above its baseline <= "
            f"{GOAL_PUBLISHER_KV_MULTIPLE:g}x the KV it holds",
            "worst": max(multiples),
            "met": max(multiples) <= GOAL_PUBLISHER_KV_MULTIPLE,
        },
        "relay_memory": {
            "goal": f"relay peak <= cache budget + {RELAY_MARGIN_BYTES >> 20} MiB",
            "worst": relay_over / (1 << 20),
            "met": relay_over <= RELAY_MARGIN_BYTES,
        },
    }


def _show(report: dict[str, Any]) -> None:
    print(
        f"\n{report['layout']}, {report['tokens']}-token {report['track']} prompts, one relay "
        f"(cache {report['cache_bytes'] >> 20} MiB); {report['cpus']} CPUs, load average "
        f"{report['load_average_at_start']:.1f} at the start"
    )
    print(
        f"{'round':16} {'pubs':>4} {'decoders':>8} {'seconds':>8} {'objects/s':>10} "
        f"{'MB/s':>7} {'vs alone':>8} {'p50 s':>6} {'p99 s':>6} {'loader peak MB':>15}"
    )
    for row in report["rows"]:
        peaks = "/".join(f"{peak / 1e6:.0f}" for peak in row["loader_peak_rss"])
        print(
            f"{row['round']:16} {row['publishers']:>4} {row['decoders']:>8} "
            f"{row['seconds']:>8.2f} {row['objects_per_s']:>10.0f} {row['mbps']:>7.1f} "
            f"{row['vs_alone']:>7.2f}x {row['load_p50_s']:>6.2f} {row['load_p99_s']:>6.2f} {peaks:>15}"
        )
    print(f"relay peak: {report['relay_peak_rss'] / 1e6:.0f} MB")
    for publisher in report["publishers"]:
        print(
            f"publishing sidecar peak: {publisher['peak_rss'] / 1e6:.0f} MB, "
            f"{_held(publisher) / 1e6:.0f} MB above its baseline "
            f"({publisher['baseline_rss'] / 1e6:.0f} MB) and the model server's buffers it maps "
            f"({publisher['mapped_shared'] / 1e6:.0f} MB), for {publisher['kv_bytes'] / 1e6:.0f} "
            "MB of KV"
        )
    for name, goal in report["goals"].items():
        print(f"goal {name}: {goal['goal']}: worst {goal['worst']:.2f}: "
              f"{'met' if goal['met'] else 'NOT met'}")  # fmt: skip
