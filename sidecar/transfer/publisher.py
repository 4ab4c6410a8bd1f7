"""Publish prompts' KV caches over MoQT: chunk -> group, token -> object, one track per codec.

`KVPublisher` is the process's `moqt.aio.api.Publisher`: serve it on every session
(`api.connect(url, settings, publisher=kv)` to a relay, or `api.serve(..., publisher=kv)`
for direct subscribers) and add prompts with `kv.prompt(...)`. Each prompt's namespace is
`("kvcache.moq.arpa/v1", model, prompt id)`; announce it with
`session.publish_namespace(prompt.namespace)`.

Why every offered track is encoded once per chunk although only some are sent: the catalog
lists each chunk's size and digest on every track it offers, and a subscriber verifies a
chunk against those digests before it writes a byte of it, so there is no honest catalog
without encoding the chunk on every track. What costs nothing until asked for is the rest:
only the default track's payloads are kept (and written to MoQT) as chunks are produced.
Another track's payloads are dropped once digested; the first SUBSCRIBE, FETCH or
TRACK_STATUS naming it re-encodes the chunks produced so far (the codecs are deterministic,
so the bytes match the catalog) and from then on it is kept and written like the default.
That encoding runs in a worker thread while the request waits (`resolve`), about 0.2 s per
1000 tokens: the sessions go on serving meanwhile, and requests that come for the same
track during it wait for the same encoding.

Chunks can be added while prefill still runs (`add_chunk`): each is written to the kept
tracks at once, so live subscribers get it immediately, and then a catalog revision that
describes it is published (group id = chunks described; at most one per REVISION_INTERVAL,
and always the complete one), so a subscriber never sees a catalog that promises a chunk
the tracks do not hold yet.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.layout import DEFAULT_CHUNK_SIZE, KVLayout
from sidecar.kvcache.naming import CATALOG_TRACK, PromptName, chunk_count, prompt_id
from sidecar.kvcache.signing import CatalogSigner
from sidecar.kvcache.tracks import DEFAULT_TRACK, DEFAULT_TRACKS
from sidecar.moqt.aio.api import PublishedTrack, Publisher
from sidecar.moqt.protocol.model import FullTrackName

REVISION_INTERVAL = 0.1
"""Seconds between catalog revisions while chunks come faster (the complete one is always
published): each revision repeats every digest so far, so one per chunk would cost
O(chunks^2) bytes for a long prompt."""

CATALOG_CACHE_BYTES = 64 << 20
"""Old revisions may be evicted (the newest is what subscribers want); room for several of
the largest catalogs (16 MiB)."""

PayloadHook = Callable[[str, int, int, bytes], bytes]
"""(track, group, object, payload) -> the payload actually published; for fault tests. Called
in a worker thread for a track encoded on first request."""


class PublishError(ValueError):
    """A prompt or chunk that does not fit what was declared (layout, token count, tracks)."""


class KVPublisher(Publisher):
    """The MoQT tracks of every prompt this process publishes, encoded on demand."""

    def __init__(
        self, *, prompt_key: bytes | None = None, signer: CatalogSigner | None = None
    ) -> None:
        """`prompt_key`: the deployment's, to key prompt ids and links (`naming`); `signer`:
        its catalog key, to sign every catalog revision (`kvcache.signing`)."""
        super().__init__()
        self.prompt_key = prompt_key
        self.signer = signer
        self._prompts: dict[tuple[bytes, ...], PublishedPrompt] = {}

    def prompt_name(
        self, model: str, token_ids: Sequence[int], chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> PromptName:
        """The name this publisher gives a prompt (its id keyed if the deployment is)."""
        return PromptName(model, prompt_id(token_ids, chunk_size, self.prompt_key))

    def prompt(
        self,
        model: str,
        layout: KVLayout,
        token_ids: Sequence[int],
        *,
        tracks: Sequence[str] = DEFAULT_TRACKS,
        default_track: str = DEFAULT_TRACK,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        payload_hook: PayloadHook | None = None,
    ) -> PublishedPrompt:
        """Declare a prompt; its KV follows with `add_chunk` or `publish`."""
        name = self.prompt_name(model, token_ids, chunk_size)
        if name.namespace() in self._prompts:
            raise PublishError(f"prompt {name.prompt_id} is already published")
        prompt = PublishedPrompt(
            self, name, layout, token_ids, tracks, default_track, chunk_size, payload_hook
        )
        self._prompts[prompt.namespace] = prompt
        return prompt

    def catalog_object(self, revision: Catalog) -> bytes:
        """A revision as its catalog object carries it: signed if this publisher has a key."""
        data = revision.encode()
        return data if self.signer is None else self.signer.seal(data)

    def declared(self, namespace: tuple[bytes, ...]) -> PublishedPrompt | None:
        """The prompt published (or being published) under `namespace`, if any."""
        return self._prompts.get(namespace)

    def holds(self, prompt: PublishedPrompt) -> bool:
        """Whether `prompt` is still published here (not removed since)."""
        return self._prompts.get(prompt.namespace) is prompt

    def remove(self, namespace: tuple[bytes, ...]) -> None:
        """Forget a prompt and withdraw its tracks (catalog included)."""
        self._prompts.pop(namespace, None)
        super().remove(namespace)

    def get(self, name: FullTrackName) -> PublishedTrack | None:
        """What every SUBSCRIBE, FETCH and TRACK_STATUS looks up first (and is counted by): a
        track held now. A track offered but not kept yet is None here; `resolve` encodes it."""
        prompt = self._prompts.get(name.namespace)
        if prompt is None:
            return super().get(name)
        return prompt.requested(name.name.decode(errors="replace"))

    async def resolve(self, name: FullTrackName) -> PublishedTrack | None:
        """An offered track not kept yet, encoded in a worker thread (once, however many
        requests wait for it); None for a track the prompt does not offer."""
        prompt = self._prompts.get(name.namespace)
        if prompt is None:
            return await super().resolve(name)
        return await prompt.kept_track(name.name.decode(errors="replace"))


class PublishedPrompt:
    """One prompt's KV: its catalog, its offered tracks, and what subscribers asked for."""

    def __init__(
        self,
        publisher: KVPublisher,
        name: PromptName,
        layout: KVLayout,
        token_ids: Sequence[int],
        tracks: Sequence[str],
        default_track: str,
        chunk_size: int,
        payload_hook: PayloadHook | None,
    ) -> None:
        offered = sorted(set(tracks))
        for track in offered:
            get_codec(track)  # UnknownCodecError for a name that is not a codec
        if default_track not in offered:
            raise PublishError(f"default track {default_track!r} is not among {offered}")
        self.name = name
        self.namespace: tuple[bytes, ...] = self.name.namespace()
        self.layout = layout
        self.token_ids = tuple(token_ids)
        self.chunk_size = chunk_size
        self.offered: tuple[str, ...] = tuple(offered)
        self.default_track = default_track
        self.requests: Counter[str] = Counter()
        """SUBSCRIBE/FETCH/TRACK_STATUS received per track name: what the relays asked for."""
        self.catalog: Catalog | None = None
        """The newest revision; None until the first chunk fixes the codec tables."""
        self._publisher = publisher
        self._hook = payload_hook
        self._chunks: list[torch.Tensor] = []
        self._kept: dict[str, PublishedTrack] = {}
        self._keeping: dict[str, asyncio.Task[PublishedTrack | None]] = {}
        """Tracks being encoded for their first request: later requests await the same task."""
        self._revised_at = -math.inf
        self._adding = asyncio.Lock()
        # The largest track is fp16/bf16 (2 bytes a value, plus a version byte a token);
        # `ac` stays below it in practice. Twice that: the cache never evicts a chunk.
        self._track_cache_bytes = 2 * len(self.token_ids) * (layout.fp16_bytes_per_token + 64)
        self._catalog_track = publisher.track(
            self.namespace, CATALOG_TRACK.encode(), cache_bytes=CATALOG_CACHE_BYTES
        )
        self._kept[default_track] = self._track(default_track)

    @property
    def chunk_count(self) -> int:
        return chunk_count(len(self.token_ids), self.chunk_size)

    @property
    def ready_chunks(self) -> int:
        return len(self._chunks)

    @property
    def held_kv(self) -> tuple[torch.Tensor, ...]:
        """Each added chunk's KV, `[L, 2, T, H, D]` on the host, for tracks asked for later
        and for loads from this process."""
        return tuple(self._chunks)

    @property
    def kept_tracks(self) -> tuple[str, ...]:
        """Tracks whose payloads are held and written (the default, plus those asked for)."""
        return tuple(sorted(self._kept))

    async def publish(self, kv: torch.Tensor) -> None:
        """Publish the KV of every chunk not yet added (`kv` spans the whole prompt)."""
        total = self.layout.check(kv)
        if total != len(self.token_ids):
            raise PublishError(f"KV holds {total} tokens, the prompt has {len(self.token_ids)}")
        while self.ready_chunks < self.chunk_count:
            start = self.ready_chunks * self.chunk_size
            await self.add_chunk(kv[:, :, start : start + self.chunk_size])

    async def add_chunk(self, kv: torch.Tensor) -> None:
        """Publish the next chunk (`[L, 2, T, H, D]`, T = its token count) as prefill makes it.

        Encoding runs in a worker thread, so the sessions keep serving earlier chunks
        meanwhile, on the tensor's device. A CPU tensor is kept by reference (a track asked for
        later is encoded from it), so the caller must not overwrite it while the prompt is
        published; a GPU tensor is copied to the host.
        """
        async with self._adding:
            index = self.ready_chunks
            if index == self.chunk_count:
                raise PublishError("every chunk of the prompt is already published")
            start = index * self.chunk_size
            tokens = min(self.chunk_size, len(self.token_ids) - start)
            if self.layout.check(kv) != tokens:
                raise PublishError(f"chunk {index} must hold {tokens} tokens, got {kv.shape[2]}")
            if self.catalog is None:
                self.catalog = await asyncio.to_thread(self._first_revision, kv)
            encoded = await asyncio.to_thread(
                lambda: {name: self._encode(name, kv) for name in self.offered}
            )
            # Held on the host: a track asked for later encodes to the same bytes there
            # (codecs/rotation.py), and a GPU copy would keep the model's memory.
            self._chunks.append(kv.cpu())
            self.catalog = self.catalog.with_chunk(encoded)
            revision = self.catalog
            # Snapshot, taken with the append and no await between: a track being kept
            # encodes every chunk appended before it joins `_kept` (see `_keep`), this one
            # included, and must not be written twice.
            for name, track in list(self._kept.items()):
                await self._write_chunk(track, name, index, encoded[name])
            now = asyncio.get_running_loop().time()
            if revision.complete or now - self._revised_at >= REVISION_INTERVAL:
                self._revised_at = now
                await self._catalog_track.write(
                    revision.ready_chunks,
                    0,
                    self._publisher.catalog_object(revision),
                    end_of_group=True,
                )
            if revision.complete:
                for track in (*self._kept.values(), self._catalog_track):
                    track.end()

    def _first_revision(self, kv: torch.Tensor) -> Catalog:
        """The catalog before any chunk: links, and codec tables fitted on the first chunk."""
        tables = {name: get_codec(name).fit_tables(self.layout, kv) for name in self.offered}
        return Catalog.for_prompt(
            self.name.model,
            self.layout,
            self.token_ids,
            tables,
            self.chunk_size,
            prompt_key=self._publisher.prompt_key,
        )

    def _encode(self, name: str, kv: torch.Tensor) -> list[bytes]:
        assert self.catalog is not None
        return get_codec(name).encode(kv, self.layout, self.catalog.track(name).tables)

    def _encode_from(self, name: str, first: int) -> list[list[bytes]]:
        """The published payloads of chunks `first`.. on track `name` (in a worker thread)."""
        chunks = self._chunks[first:]
        return [
            self._hooked(name, first + i, self._encode(name, kv)) for i, kv in enumerate(chunks)
        ]

    def _hooked(self, name: str, group: int, payloads: list[bytes]) -> list[bytes]:
        if self._hook is None:
            return payloads
        return [self._hook(name, group, obj, payload) for obj, payload in enumerate(payloads)]

    async def _write_chunk(
        self, track: PublishedTrack, name: str, index: int, payloads: list[bytes]
    ) -> None:
        sent = self._hooked(name, index, payloads)
        for obj, payload in enumerate(sent):
            await track.write(index, obj, payload, end_of_group=obj == len(sent) - 1)

    def _track(self, name: str) -> PublishedTrack:
        return self._publisher.track(
            self.namespace, name.encode(), cache_bytes=self._track_cache_bytes
        )

    async def _keep(self, name: str) -> PublishedTrack | None:
        """Start holding a track: encode the chunks produced so far (in a worker thread) into
        its cache. None if the prompt was withdrawn meanwhile."""
        encoded: list[list[bytes]] = []
        while len(encoded) < self.ready_chunks:  # chunks may be added while we encode
            encoded += await asyncio.to_thread(self._encode_from, name, len(encoded))
        # From here to `_kept` without an await: `add_chunk` writes every later chunk.
        if not self._publisher.holds(self):
            return None
        track = self._track(name)
        for index, payloads in enumerate(encoded):
            for obj, payload in enumerate(payloads):
                track.put(index, obj, payload, end_of_group=obj == len(payloads) - 1)
        if self.catalog is not None and self.catalog.complete:
            track.end()
        self._kept[name] = track
        return track

    async def kept_track(self, name: str) -> PublishedTrack | None:
        """Track `name` once held (encoded now if it was not); None if not offered."""
        if name not in self.offered:
            return None
        track = self._kept.get(name)
        if track is not None:
            return track
        task = self._keeping.get(name)
        if task is None:
            task = self._keeping[name] = asyncio.ensure_future(self._keep(name))
            task.add_done_callback(lambda _: self._keeping.pop(name, None))
        # Shielded: one waiter cancelled (UNSUBSCRIBE, session closed) leaves the others.
        return await asyncio.shield(task)

    def requested(self, name: str) -> PublishedTrack | None:
        """Track `name` if held now, counting the request (`requests`)."""
        if name == CATALOG_TRACK:
            self.requests[name] += 1
            return self._catalog_track
        if name not in self.offered:
            return None
        self.requests[name] += 1
        return self._kept.get(name)
