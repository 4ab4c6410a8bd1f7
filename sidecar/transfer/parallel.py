"""Load one prompt's chunks over several MoQT sessions at once: in this process, or in workers.

Why: a load runs on one session, and with aioquic every packet's decryption, QUIC bookkeeping
and MoQT parsing runs in Python on the event loop's thread, so a fast load is bound by one
core (decoding already runs in worker threads). Spreading the groups over N sessions gives N
QUIC connections (N flow-control windows, N send loops at the relay); giving each session
its own process also gives it its own interpreter, so the packet work can use more than one
core. Whether that pays depends on the cores the relay and everything else leave free:
`kvmoq bench parallel` measures it.

* `load_parallel(subscribers, ...)`: one share of the chunks per subscriber, all in this
  process, into one destination (a tensor or a sink).
* `LoadWorkers`: N worker processes (`python -m sidecar.transfer.parallel`), each owning one
  session to the relay, load their shares straight into a shared-memory destination that
  every process maps (`sidecar.tensors.shm`); only requests and results cross the pipes.

Share k of N is the contiguous chunks [k*C//N, (k+1)*C//N) of the C chunks available, loaded
by the subscriber's own per-chunk path (one FETCH per group, the deadline's track choice,
verify before write, retry on the next track), so every guarantee of a single load holds
chunk by chunk; `merge_results` unites the shares' results into one `LoadResult` that names
exactly the tokens written and every chunk rejected.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from sidecar import codec_process
from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE, KVLayout
from sidecar.kvcache.naming import PromptName
from sidecar.moqt.aio import api, transport
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.tensors.handles import SharedMemoryHandle
from sidecar.tensors.shm import DEFAULT_SHM_ROOTS, open_shared_memory
from sidecar.transfer.subscriber import (
    KVSink,
    KVSubscriber,
    LoadedChunk,
    LoadResult,
    RejectedChunk,
    Share,
    StopReason,
)
from sidecar.transfer.track_quality import DEFAULT_CHOICE, TrackChoice

WORKER_START_TIMEOUT = 120.0
"""Starting a worker imports torch and aioquic and opens a session: seconds on a busy box."""
WORKER_STOP_TIMEOUT = 10.0


def merge_results(results: Sequence[LoadResult]) -> LoadResult:
    """One result for a load split into shares (in share order).

    Loaded and rejected chunks are the union, so `loaded_tokens` names exactly what was
    written. COMPLETE only if every share completed; otherwise the reason of the first share
    that did not (it holds the earliest chunks the load lacks). Shares look up the prompt
    independently and may in a race find different prompts of the same token chain: the KV
    of a chunk is the same in each, and the result names the one covering the most tokens.
    """
    if not results:
        raise ValueError("no shares to merge")
    found = [r for r in results if r.prompt is not None]
    widest = max(found, key=lambda r: r.available, default=results[0])
    stopped = next((r.stopped for r in results if r.stopped is not StopReason.COMPLETE), None)
    return LoadResult(
        widest.prompt,
        widest.available,
        tuple(sorted((c for r in results for c in r.loaded), key=lambda c: c.index)),
        tuple(sorted((c for r in results for c in r.rejected), key=lambda c: c.index)),
        stopped or StopReason.COMPLETE,
    )


async def load_parallel(
    subscribers: Sequence[KVSubscriber],
    model: str,
    token_ids: Sequence[int],
    destination: torch.Tensor | KVSink,
    deadline: float,
    *,
    choice: TrackChoice = DEFAULT_CHOICE,
) -> LoadResult:
    """`KVSubscriber.load` with the chunks spread over `subscribers` (one session each, all
    in this process). If a share fails, the others are cancelled and its error is raised."""
    count = len(subscribers)
    tasks = [
        asyncio.ensure_future(
            subscriber.load(
                model,
                token_ids,
                destination,
                deadline,
                choice=choice,
                share=Share(index, count),
            )
        )
        for index, subscriber in enumerate(subscribers)
    ]
    try:
        return merge_results(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# Worker processes -----------------------------------------------------------------------


class WorkerFailed(RuntimeError):
    """A worker process died, or its share raised (the worker's message is carried)."""


class LoadWorkers:
    """N worker processes, each with its own session to the relay at `url`, that load
    shares of one prompt into a shared-memory destination.

    Use as `async with LoadWorkers(url, settings, n) as workers: await workers.load(...)`;
    the workers start (and connect) on entry and stay for every load until exit. A load that
    is interrupted (cancelled, or a worker failed) closes the pool: the workers would still
    be busy with it.
    """

    def __init__(
        self,
        url: str,
        settings: QuicSettings,
        count: int,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        shm_roots: Sequence[Path] = DEFAULT_SHM_ROOTS,
    ) -> None:
        """`chunk_size` is the workers' subscribers' (see `KVSubscriber`)."""
        if count < 1:
            raise ValueError(f"at least one worker, got {count}")
        self.url, self.settings, self.count = url, settings, count
        self.chunk_size = chunk_size
        self.shm_roots = tuple(shm_roots)
        self._workers: list[asyncio.subprocess.Process] = []
        self._open = False

    async def __aenter__(self) -> LoadWorkers:
        argv = [
            *(sys.executable, "-m", __name__, "--url", self.url),
            *("--settings", json.dumps(self.settings.to_json())),
            *("--chunk-size", str(self.chunk_size)),
            *(f"--shm-root={root}" for root in self.shm_roots),
        ]
        for _ in range(self.count):
            worker = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
            )
            self._workers.append(worker)
        try:
            await asyncio.wait_for(
                asyncio.gather(*(self._reply(k) for k in range(self.count))),
                WORKER_START_TIMEOUT,
            )
        except BaseException:
            await self.aclose()
            raise
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End every worker: EOF on its stdin, a kill if it lingers."""
        self._open = False
        for worker in self._workers:
            if worker.stdin is not None and not worker.stdin.is_closing():
                worker.stdin.close()
        for worker in self._workers:
            try:
                await asyncio.wait_for(worker.wait(), WORKER_STOP_TIMEOUT)
            except TimeoutError:
                worker.kill()
                await worker.wait()
        self._workers.clear()

    async def load(
        self,
        model: str,
        token_ids: Sequence[int],
        destination: SharedMemoryHandle,
        deadline: float,
        *,
        choice: TrackChoice = DEFAULT_CHOICE,
    ) -> LoadResult:
        """`KVSubscriber.load` with share k of the chunks loaded by worker k into the
        shared-memory view `destination` (which every worker maps)."""
        if not self._open:
            raise WorkerFailed("the load workers are not running")
        request = {
            "model": model,
            "token_ids": list(token_ids),
            "destination": dataclasses.asdict(destination),
            "deadline": deadline,
            "tracks": list(choice.order),
            "max_kl": choice.max_kl,
        }
        try:
            for index, worker in enumerate(self._workers):
                assert worker.stdin is not None
                line = {**request, "share": [index, self.count]}
                worker.stdin.write(json.dumps(line).encode() + b"\n")
            replies = await asyncio.gather(*(self._reply(k) for k in range(self.count)))
        except BaseException:
            await self.aclose()
            raise
        return merge_results([_result_from_json(reply) for reply in replies])

    async def _reply(self, index: int) -> dict[str, Any]:
        stdout = self._workers[index].stdout
        assert stdout is not None
        line = await stdout.readline()
        if not line:
            raise WorkerFailed(f"load worker {index} exited (see its log on stderr)")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise WorkerFailed(f"load worker {index}: {reply['error']}")
        return reply


@contextmanager
def shared_destination(
    layout: KVLayout, tokens: int, directory: Path = DEFAULT_SHM_ROOTS[0]
) -> Iterator[tuple[SharedMemoryHandle, torch.Tensor]]:
    """A zeroed `[L, 2, tokens, H, D]` buffer of `layout`'s dtype in a new file on a memory
    filesystem: its handle (for `LoadWorkers.load`) and this process's view of it.

    For a caller whose destination lives in private memory (a model server hands the
    sidecar shared buffers already). The file is removed on exit; views stay valid.
    """
    shape = layout.shape(tokens)
    nbytes = math.prod(shape) * layout.torch_dtype.itemsize
    fd, name = tempfile.mkstemp(prefix="kvmoq-load-", suffix=".kv", dir=directory)
    try:
        try:
            os.ftruncate(fd, nbytes)  # a hole: zeros, and pages only where loads write
        finally:
            os.close(fd)
        stride = torch.empty(shape, device="meta").stride()
        handle = SharedMemoryHandle(name, 0, nbytes, layout.dtype, shape, stride)
        yield handle, open_shared_memory(handle, (directory,))
    finally:
        os.unlink(name)


def _result_json(result: LoadResult) -> dict[str, Any]:
    return {
        "prompt": None if result.prompt is None else dataclasses.asdict(result.prompt),
        "available": result.available,
        "loaded": [
            [c.index, c.tokens.start, c.tokens.stop, c.track, c.nbytes, c.seconds, c.kl]
            for c in result.loaded
        ],
        "rejected": [
            [c.index, c.tokens.start, c.tokens.stop, c.track, c.reason] for c in result.rejected
        ],
        "stopped": result.stopped.value,
    }


def _result_from_json(raw: dict[str, Any]) -> LoadResult:
    prompt = raw["prompt"]
    return LoadResult(
        None if prompt is None else PromptName(**prompt),
        raw["available"],
        tuple(
            LoadedChunk(index, range(start, stop), track, nbytes, seconds, kl)
            for index, start, stop, track, nbytes, seconds, kl in raw["loaded"]
        ),
        tuple(
            RejectedChunk(index, range(start, stop), track, reason)
            for index, start, stop, track, reason in raw["rejected"]
        ),
        StopReason(raw["stopped"]),
    )


async def _serve(args: argparse.Namespace) -> None:
    """A worker: one session, then one share per request line on stdin until EOF."""
    settings = QuicSettings.from_json(json.loads(args.settings))
    mapped: dict[SharedMemoryHandle, torch.Tensor] = {}
    """Destinations stay mapped, as a sidecar's registered buffers do: a load writes into
    pages this process has already faulted in."""
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(api.connect(args.url, settings))
        subscriber = KVSubscriber(session, chunk_size=args.chunk_size)
        _say({"event": "ready"})
        while line := await asyncio.to_thread(sys.stdin.readline):
            request = json.loads(line)
            raw = request["destination"]
            handle = SharedMemoryHandle(
                **{**raw, "shape": tuple(raw["shape"]), "stride": tuple(raw["stride"])}
            )
            try:
                if handle not in mapped:
                    mapped[handle] = open_shared_memory(handle, args.shm_root)
                result = await subscriber.load(
                    request["model"],
                    request["token_ids"],
                    mapped[handle],
                    request["deadline"],
                    share=Share(*request["share"]),
                    choice=TrackChoice(tuple(request["tracks"]), request["max_kl"]),
                )
            except Exception as exc:  # reported to the parent, which raises WorkerFailed
                _say({"error": f"{type(exc).__name__}: {exc}"})
            else:
                _say(_result_json(result))


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description="A load worker of sidecar.transfer.parallel.")
    parser.add_argument("--url", required=True)
    parser.add_argument("--settings", required=True, help="QuicSettings fields as JSON")
    parser.add_argument("--chunk-size", type=int, required=True)
    parser.add_argument("--shm-root", type=Path, action="append", required=True)
    args = parser.parse_args()
    codec_process.set_up()  # one thread: N workers already share the cores
    transport.run(_serve(args))


if __name__ == "__main__":
    main()
