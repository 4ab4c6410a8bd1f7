"""Benchmarks that time prompt loads on loopback and under link limits (`bench e2e`, `bench
vllm`): their shared options, their parameters as a record, and how they get a link.

A link limit shapes the loopback of a network namespace the benchmark makes (bench.netns),
so the benchmark re-runs itself inside it (`python -m MODULE JOB_JSON`) with every process it
starts; where no namespace can be made (not root, no iproute2, a container without
CAP_SYS_ADMIN) it runs on the host's loopback and says the limits were skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import harness, netns
from sidecar.moqt.aio.quic_backend import LOOPBACK_DATAGRAM_SIZE
from sidecar.transfer.track_quality import DEFAULT_MAX_KL, TrackChoice

MIN_TOKENS = 128
MAX_TOKENS = 8192
MAX_DEADLINE_S = 300.0


def add_arguments(
    parser: argparse.ArgumentParser, *, tokens: int, tracks: str, limits: str, tracks_help: str
) -> None:
    parser.add_argument(
        "--tokens",
        type=int,
        default=tokens,
        help=f"prompt length in tokens (default {tokens}; {MIN_TOKENS}..{MAX_TOKENS})",
    )
    parser.add_argument(
        "--tracks", default=tracks, help=f"comma-separated {tracks_help} (default {tracks})"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        choices=range(1, 6),
        default=2,
        metavar="N",
        help="time each measurement N times (1..5) and keep the fastest: other load on the "
        "machine only slows them down (default 2)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="deadline of the adaptive loads (default: half the measured recompute time)",
    )
    parser.add_argument(
        "--max-kl",
        type=float,
        default=DEFAULT_MAX_KL,
        metavar="KL",
        help="quality floor of the adaptive loads (default the sidecar's, "
        f"{DEFAULT_MAX_KL:g}: near-lossless tracks only); a track's own row takes it whatever "
        "it costs",
    )
    parser.add_argument(
        "--limits",
        default=limits,
        help=f"comma-separated link rates, as tc writes them (default {limits}); 'none' "
        "skips them (they need root and iproute2)",
    )
    harness.add_datagram_size(parser)
    parser.add_argument("--plot", metavar="FILE", help="also draw the figures as a bar chart (PNG)")


@dataclass(frozen=True, slots=True)
class Job:
    """The benchmark's parameters; travels as JSON to the process inside the namespace."""

    tokens: int
    tracks: tuple[str, ...]
    limits: tuple[str, ...]
    repeat: int
    deadline: float | None
    json_path: str | None
    plot_path: str | None = None
    namespace: str | None = None
    limits_skipped: str | None = None
    datagram_size: int = LOOPBACK_DATAGRAM_SIZE
    max_kl: float = DEFAULT_MAX_KL
    """The adaptive loads' quality floor."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Job:
        raw = json.loads(text)
        return cls(**{**raw, "tracks": tuple(raw["tracks"]), "limits": tuple(raw["limits"])})

    @classmethod
    def from_args(cls, args: argparse.Namespace, command: str) -> Job:
        """The options checked, or SystemExit naming `command` (`kvmoq bench e2e`)."""
        from sidecar.kvcache.errors import UnknownCodecError
        from sidecar.kvcache.tracks import parse_codec_names

        if not MIN_TOKENS <= args.tokens <= MAX_TOKENS:
            raise SystemExit(
                f"{command}: --tokens must be in {MIN_TOKENS}..{MAX_TOKENS}, got {args.tokens}"
            )
        try:
            tracks = parse_codec_names(args.tracks)
        except UnknownCodecError as exc:
            raise SystemExit(f"{command}: {exc}") from None
        limits: tuple[str, ...] = ()
        if args.limits.strip().lower() != "none":
            try:
                limits = tuple(netns.LinkLimit.parse(t).label for t in args.limits.split(","))
            except ValueError as exc:
                raise SystemExit(f"{command}: --limits: {exc}") from exc
        if args.deadline is not None and not 0 < args.deadline <= MAX_DEADLINE_S:
            raise SystemExit(f"{command}: --deadline must be in (0, {MAX_DEADLINE_S:.0f}]")
        try:
            TrackChoice(max_kl=args.max_kl)
        except ValueError as exc:
            raise SystemExit(f"{command}: --max-kl: {exc}") from None
        json_path, plot_path = (
            str(Path(p).resolve()) if p else None for p in (args.json, args.plot)
        )
        return cls(
            args.tokens,
            tracks,
            limits,
            args.repeat,
            args.deadline,
            json_path,
            plot_path,
            datagram_size=harness.check_datagram_size(args.max_datagram_size, command),
            max_kl=args.max_kl,
        )


def run(job: Job, module: str, bench: Callable[[Job], int], command: str) -> int:
    """`bench(job)`, inside a namespace of its own when `job` has link limits: there
    `python -m module JOB_JSON` runs, and `module` calls `bench(Job.from_json(...))`."""
    if not job.limits:
        return bench(dataclasses.replace(job, limits_skipped="--limits none"))
    reason = netns.unavailable_reason()
    with contextlib.ExitStack() as stack:
        try:
            namespace = None if reason else stack.enter_context(netns.Namespace())
        except netns.NamespaceError as exc:  # e.g. a container without CAP_SYS_ADMIN
            reason, namespace = str(exc), None
        if namespace is not None:
            inside = dataclasses.replace(job, namespace=namespace.name)
            return namespace.run([sys.executable, "-m", module, inside.to_json()])
    print(f"{command}: link limits skipped ({reason}); loopback figures only")
    return bench(dataclasses.replace(job, limits=(), limits_skipped=reason))
