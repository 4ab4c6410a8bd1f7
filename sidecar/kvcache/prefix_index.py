"""Which published prompt holds the longest prefix of a new prompt, from hash-chain links alone.

A subscriber learns prompts from their catalogs (every link of the chain): those it read, and
those of prompts announced to it (`transfer.catalog_feed.PublishedPrompts` reads them). A
namespace alone is no use here: its prompt id is only the last link, which probing the query's
own links finds as well. Since link i commits to chunks
0..i, a query whose link i equals a known link shares its first i + 1 chunks with that prompt,
so the index is a plain map from link to the prompts that hold it; no KV, token id or prompt
text is needed or stored.

Only whole chunks can match: a published prompt whose last chunk is partial matches a query
only if the query ends with exactly that partial chunk, and a query that stops inside a
published chunk loses the tokens of that chunk (at most chunk_size - 1 tokens to recompute).

Sans-I/O, like the rest of `kvcache`: the transfer layer feeds it what arrives and asks it
questions. Catalogs come from the network, so the number of links held is capped and the
oldest prompts are forgotten first.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from .catalog import Catalog
from .errors import KVCodecError
from .naming import MAX_CHUNKS, PromptName, chunk_links

DEFAULT_MAX_LINKS = 1 << 20
MAX_CHUNK_SIZES_PER_MODEL = 4
"""A lookup hashes the query once per chunk size in use for the model: one is the norm (it is
configured per model), a few cover a change of configuration, more is an attack on our CPU."""


class ChunkSizeLimitError(KVCodecError):
    """A prompt would bring one chunk size too many for its model; it is not indexed."""


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The best prompt to load a query's KV from, and how much of the query it covers."""

    prompt: PromptName
    chunk_size: int
    chunks: int
    """Leading chunks (MoQT groups 0 .. chunks - 1) to load from `prompt`."""
    tokens: int
    """Leading tokens of the query whose KV those chunks hold."""


@dataclass(frozen=True, slots=True)
class _Entry:
    chunk_size: int
    links: tuple[bytes, ...]


class PrefixIndex:
    """Known prompts by hash-chain link, per model and chunk size."""

    def __init__(
        self, max_links: int = DEFAULT_MAX_LINKS, *, prompt_key: bytes | None = None
    ) -> None:
        """`prompt_key`: the deployment's, if its chains are keyed (`naming`): queries are
        hashed with it, or they would match nothing the publishers named."""
        if max_links < MAX_CHUNKS:
            raise ValueError(f"max_links must hold one catalog of {MAX_CHUNKS} chunks")
        self.prompt_key = prompt_key
        self._max_links = max_links
        self._entries: OrderedDict[PromptName, _Entry] = OrderedDict()
        self._holders: dict[tuple[str, bytes], dict[PromptName, None]] = {}
        self._chunk_sizes: dict[str, Counter[int]] = {}
        self._link_count = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add_catalog(self, catalog: Catalog) -> None:
        """Learn every link of a catalog (any revision: the links are all there from the first)."""
        self._add(catalog.name, _Entry(catalog.chunk_size, catalog.chunk_hashes))

    def remove(self, name: PromptName) -> None:
        """Forget a prompt (its namespace was withdrawn); unknown names are ignored."""
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        for link in entry.links:
            key = (name.model, link)
            holders = self._holders[key]
            del holders[name]
            if not holders:
                del self._holders[key]
        sizes = self._chunk_sizes[name.model]
        sizes[entry.chunk_size] -= 1
        if not sizes[entry.chunk_size]:
            del sizes[entry.chunk_size]
        if not sizes:
            del self._chunk_sizes[name.model]
        self._link_count -= len(entry.links)

    def links(self, token_ids: Sequence[int], chunk_size: int) -> list[bytes]:
        """A query's links, as the deployment's publishers compute them."""
        return chunk_links(token_ids, chunk_size, self.prompt_key)

    def lookup(self, model: str, token_ids: Sequence[int]) -> PrefixMatch | None:
        """The known prompt sharing the most leading whole chunks with `token_ids`, if any.

        Among prompts that share equally many, the one learned most recently wins: it is
        the likeliest to be still in the relays' caches.
        """
        best: PrefixMatch | None = None
        if not token_ids:
            return best
        for chunk_size in self._chunk_sizes.get(model, ()):
            links = self.links(token_ids, chunk_size)
            for index in reversed(range(len(links))):
                holders = self._holders.get((model, links[index]))
                if holders:
                    chunks = index + 1
                    tokens = min(chunks * chunk_size, len(token_ids))
                    if best is None or tokens > best.tokens:
                        prompt = next(reversed(holders))
                        best = PrefixMatch(prompt, chunk_size, chunks, tokens)
                    break
        return best

    def _add(self, name: PromptName, entry: _Entry) -> None:
        sizes = self._chunk_sizes.get(name.model, Counter())
        if entry.chunk_size not in sizes and len(sizes) >= MAX_CHUNK_SIZES_PER_MODEL:
            raise ChunkSizeLimitError(
                f"model {name.model!r} already has {len(sizes)} chunk sizes in use"
            )
        self.remove(name)
        self._entries[name] = entry
        for link in entry.links:
            self._holders.setdefault((name.model, link), {})[name] = None
        self._chunk_sizes.setdefault(name.model, Counter())[entry.chunk_size] += 1
        self._link_count += len(entry.links)
        while self._link_count > self._max_links:
            self.remove(next(iter(self._entries)))
