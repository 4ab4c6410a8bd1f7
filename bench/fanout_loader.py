"""Loader processes of `kvmoq bench fanout` and `kvmoq bench load`: the sessions of several
decoders, each loading the whole of its prompt when the benchmark says "go" on stdin.

Decoders run on machines of their own; on one machine they run in a few processes, so the
relays' figures are not those of one loader's Python thread. Each session is a
`KVSubscriber` connected before the clock starts, as a sidecar keeps its session. Chunks go
to a sink that keeps a digest of what was written (a destination tensor per decoder would
cost gigabytes at 32 decoders); the benchmark compares the digests with a reference load's.

Protocol (one JSON object per line on stdout): {"event": "ready"} once every session is up;
then per "go" line on stdin {"event": "loaded", "loads": [...]} with each load's prompt,
seconds, payload bytes, whether it brought every token, and its digest; "quit" or end of
input ends it. The benchmark's side of it is `Loaders`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.harness import LoadMismatch
from bench.parallel_load import MODEL
from sidecar import codec_process, log
from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.transfer.subscriber import KVSubscriber
from sidecar.transfer.track_quality import TrackChoice

LOAD_DEADLINE_S = 300.0
"""Bounds one load; with one track to choose from, the deadline rule never falls back."""
LOADER_START_S = 120.0
ROUND_TIMEOUT_S = 900.0


def token_ids(tokens: int, prompt: int) -> list[int]:
    """The benchmark's prompt number ``prompt``: the same ids in the publisher and every
    loader, and other ids (another prompt id, other tracks) for every number."""
    return list(range(prompt * tokens + 1, (prompt + 1) * tokens + 1))


def chunk_digest(kv: torch.Tensor) -> bytes:
    """One chunk's KV as written, digested: the loads' digests are made of these."""
    return hashlib.blake2b(kv.contiguous().view(torch.uint8).numpy()).digest()


def prompt_digest(chunks: list[bytes]) -> str:
    """A load's digest: its chunks' digests in token order."""
    return hashlib.blake2b(b"".join(chunks)).hexdigest()


async def load_digest(
    subscriber: KVSubscriber, model: str, tokens: int, prompt: int, track: str
) -> dict[str, Any]:
    """Load the prompt once; seconds, payload bytes, completeness and a digest of the KV."""
    chunks: dict[int, bytes] = {}

    def sink(span: range, kv: torch.Tensor) -> None:
        chunks[span.start] = chunk_digest(kv)

    started = time.perf_counter()
    result = await subscriber.load(
        model, token_ids(tokens, prompt), sink, LOAD_DEADLINE_S, choice=TrackChoice.only(track)
    )
    seconds = time.perf_counter() - started
    digest = prompt_digest([chunks[start] for start in sorted(chunks)])
    return {
        "prompt": prompt,
        "seconds": seconds,
        "bytes": sum(chunk.nbytes for chunk in result.loaded),
        "complete": result.loaded_tokens == (range(0, tokens),) and not result.rejected,
        "digest": digest,
    }


async def _serve(args: argparse.Namespace) -> None:
    settings = QuicSettings.sidecar_like(
        ca_file=Path(args.ca), max_datagram_size=args.max_datagram_size
    )
    loop = asyncio.get_running_loop()
    async with AsyncExitStack() as stack:
        urls, prompts = args.urls.split(","), [int(p) for p in args.prompts.split(",")]
        subscribers = [
            KVSubscriber(await stack.enter_async_context(api.connect(url, settings)))
            for url in urls
        ]
        print(json.dumps({"event": "ready"}), flush=True)
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go":
            loads = await asyncio.gather(
                *(
                    load_digest(s, args.model, args.tokens, prompt, args.track)
                    for s, prompt in zip(subscribers, prompts, strict=True)
                )
            )
            print(json.dumps({"event": "loaded", "loads": loads}), flush=True)


@dataclass(frozen=True, slots=True)
class Loaders:
    """The benchmark's side: how to start loader processes for one round."""

    ca: Path
    tokens: int
    track: str
    datagram_size: int
    processes: int

    @asynccontextmanager
    async def connected(self, sessions: list[tuple[str, int]]) -> AsyncIterator[Round]:
        """Loader processes with one session per (relay URL, prompt), spread over them, each
        connected before the block starts (a sidecar keeps its session); stopped after."""
        count = min(self.processes, len(sessions))
        loaders: list[asyncio.subprocess.Process] = []
        try:
            for i in range(count):
                loaders.append(await self._start(sessions[i::count]))
            yield Round(loaders)
        finally:
            for loader in loaders:
                if loader.returncode is None:
                    loader.kill()
                await loader.wait()

    async def _start(self, sessions: list[tuple[str, int]]) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.fanout_loader",
            "--urls", ",".join(url for url, _ in sessions), "--ca", str(self.ca),
            "--model", MODEL, "--tokens", str(self.tokens),
            "--prompts", ",".join(str(prompt) for _, prompt in sessions),
            "--track", self.track, "--max-datagram-size", str(self.datagram_size),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await asyncio.wait_for(reply(process, "ready"), LOADER_START_S)
        return process


@dataclass(frozen=True, slots=True)
class Round:
    loaders: list[asyncio.subprocess.Process]

    async def go(self, references: dict[int, str]) -> tuple[float, list[dict[str, Any]]]:
        """Every session loads its prompt at once: the seconds until the last is done, and
        every load, each checked whole and equal to its prompt's reference digest
        (`LoadMismatch` if not)."""
        started = time.perf_counter()
        for loader in self.loaders:
            assert loader.stdin is not None
            loader.stdin.write(b"go\n")
        replies = [
            await asyncio.wait_for(reply(loader, "loaded"), ROUND_TIMEOUT_S)
            for loader in self.loaders
        ]
        seconds = time.perf_counter() - started
        loads = [load for answer in replies for load in answer["loads"]]
        for load in loads:
            if not load["complete"] or load["digest"] != references[load["prompt"]]:
                raise LoadMismatch(f"a decoder's load differs from the reference: {load}")
        return seconds, loads


async def reply(process: asyncio.subprocess.Process, event: str) -> dict[str, Any]:
    assert process.stdout is not None
    line = await process.stdout.readline()
    if not line:
        raise ConnectionError(f"a loader exited (status {await process.wait()}) before {event!r}")
    answer: dict[str, Any] = json.loads(line)
    if answer.get("event") != event:
        raise ConnectionError(f"a loader said {answer!r}, not {event!r}")
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--urls", required=True, help="one relay URL per session")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--prompts", required=True, help="per session, see token_ids")
    parser.add_argument("--track", required=True)
    parser.add_argument("--max-datagram-size", type=int, required=True)
    args = parser.parse_args()
    log.configure()  # to stderr: stdout carries the protocol's JSON lines
    codec_process.set_up()  # as a sidecar decodes
    transport.run(_serve(args))


if __name__ == "__main__":
    main()
