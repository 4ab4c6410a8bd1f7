"""A real relay process, and KV publishers and subscribers on real QUIC sessions to it.

Shared by the transfer tests (no tests here). The relay is `python -m sidecar.cli relay`,
started as an operator would (tests/support/relay.py), from the `cert` and `relay`
fixtures of tests/conftest.py; publishers and subscribers
are `KVPublisher`/`KVSubscriber` on `moqt.aio.api` sessions over 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import safetensors.torch
import torch

from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE, KVLayout
from sidecar.kvcache.tracks import DEFAULT_TRACK
from sidecar.moqt.aio import api
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.aio.transport import MoqtUrl
from sidecar.transfer.publisher import KVPublisher, PayloadHook, PublishedPrompt
from sidecar.transfer.subscriber import Availability, KVSubscriber
from tests.support.relay import REPO, settings_for
from tests.support.sidecar import MODEL


class Network:
    """Sessions to one relay, all closed when the test's `async with` ends."""

    def __init__(
        self, url: str, cert: CertificatePaths, stack: AsyncExitStack, settings: QuicSettings
    ) -> None:
        self.url, self.cert, self._stack, self.settings = url, cert, stack, settings

    async def session(self, publisher: api.Publisher | None = None) -> api.Session:
        return await self._stack.enter_async_context(
            api.connect(self.url, self.settings, publisher=publisher)
        )

    async def publisher(self) -> tuple[KVPublisher, api.Session]:
        kv = KVPublisher()
        return kv, await self.session(kv)

    async def subscriber(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> KVSubscriber:
        return KVSubscriber(await self.session(), chunk_size=chunk_size)

    async def published(
        self,
        layout: KVLayout,
        token_ids: Sequence[int],
        kv: torch.Tensor,
        *,
        tracks: Sequence[str],
        chunk_size: int,
        payload_hook: PayloadHook | None = None,
        default_track: str = DEFAULT_TRACK,
    ) -> PublishedPrompt:
        """A prompt declared, announced and published whole on a publisher session of its
        own: where most transfer tests start."""
        publisher, session = await self.publisher()
        prompt = publisher.prompt(
            MODEL,
            layout,
            token_ids,
            tracks=tracks,
            default_track=default_track,
            chunk_size=chunk_size,
            payload_hook=payload_hook,
        )
        await session.publish_namespace(prompt.namespace)
        await prompt.publish(kv)
        return prompt


@asynccontextmanager
async def network(
    url: str, cert: CertificatePaths, settings: QuicSettings | None = None
) -> AsyncIterator[Network]:
    """Sessions on `settings` (default: loopback packets, 16 KiB)."""
    async with AsyncExitStack() as stack:
        yield Network(url, cert, stack, settings or settings_for(cert))


def layout_of(kv: torch.Tensor) -> KVLayout:
    """The layout of a `[L, 2, T, H, D]` tensor, in its own dtype."""
    layers, _, _, heads, dim = kv.shape
    return KVLayout(layers, heads, dim, str(kv.dtype).removeprefix("torch."))


def synthetic_kv(tokens: int, layout: KVLayout, seed: int = 0) -> torch.Tensor:
    """Random KV with the spread of real keys and values (per-channel scales), seeded."""
    generator = torch.Generator().manual_seed(seed)
    shape = layout.shape(tokens)
    scales = torch.rand((1, 1, 1, *shape[3:]), generator=generator) * 4 + 0.1
    return torch.randn(shape, generator=generator) * scales


@contextmanager
def publisher_process(
    url: str,
    cert: CertificatePaths,
    kv: torch.Tensor,
    token_ids: Sequence[int],
    scratch: Path,
    tracks: Sequence[str] = ("int8",),
    *,
    model: str = MODEL,
    corrupt_chunk: int | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """`kv_publisher_peer` publishing `kv` through the relay at `url` (`corrupt_chunk`: one
    that fails verification); yields once it has published every chunk, kills it (if the
    test has not) at the end."""
    kv_file = scratch / "prompt.safetensors"
    safetensors.torch.save_file(
        {"kv": kv.contiguous(), "token_ids": torch.tensor(list(token_ids))}, str(kv_file)
    )
    argv = [
        sys.executable, "-m", "tests.transfer.kv_publisher_peer", "--url", url,
        "--ca", str(cert.cert), "--kv", str(kv_file), "--model", model,
        "--tracks", ",".join(tracks),
        *([] if corrupt_chunk is None else ["--corrupt-chunk", str(corrupt_chunk)]),
    ]  # fmt: skip
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert json.loads(line)["event"] == "ready", f"publisher said {line!r}"
        yield process
    finally:
        process.kill()
        process.wait(10)


@contextmanager
def lossy_link(
    target: str, loss: float = 0.0, delay_ms: str = "0", rate: str | None = None
) -> Iterator[tuple[str, dict[str, int]]]:
    """bench/lossy_link.py in front of `target` (a moqt URL): the URL to dial instead, and
    (after the block) what it forwarded and dropped."""
    url = MoqtUrl.parse(target)
    argv = [
        sys.executable, "-m", "bench.lossy_link", "--target", f"{url.host}:{url.port}",
        "--loss", str(loss), "--delay-ms", delay_ms, "--seed", "7",
        *(["--rate", rate] if rate else []),
    ]  # fmt: skip
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    counts: dict[str, int] = {}
    try:
        assert process.stdout is not None
        listening = json.loads(process.stdout.readline())
        yield f"moqt://127.0.0.1:{listening['port']}", counts
        process.terminate()
        counts.update(json.loads(process.stdout.readline()))
    finally:
        process.kill()
        process.wait(10)


PROMPT_LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32")
"""The layout of the small prompts `publish` announces and publishes."""
PROMPT_CHUNK = 16
ANNOUNCE_WAIT_S = 10.0
"""Bounds the wait for announcements and catalog reads on a busy machine."""


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait until `check` holds: announcements and catalog reads run in the background."""
    loop = asyncio.get_running_loop()
    end = loop.time() + ANNOUNCE_WAIT_S
    while not await check():
        assert loop.time() < end, "never held"
        await asyncio.sleep(0.02)


def answers(
    subscriber: KVSubscriber, token_ids: list[int], want: Availability
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await subscriber.lookup(MODEL, token_ids) == want

    return check


async def publish(
    publisher: KVPublisher, session: api.Session, token_ids: list[int], seed: int
) -> tuple[PublishedPrompt, torch.Tensor]:
    """`token_ids` announced on `session` and every chunk of it published."""
    kv = synthetic_kv(len(token_ids), PROMPT_LAYOUT, seed)
    prompt = publisher.prompt(
        MODEL, PROMPT_LAYOUT, token_ids, tracks=("int8",), chunk_size=PROMPT_CHUNK
    )
    await session.publish_namespace(prompt.namespace)
    await prompt.publish(kv)
    return prompt, kv
