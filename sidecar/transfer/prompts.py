"""The prompts a sidecar publishes, owned in one place.

A published prompt is several things at once: its MoQT tracks (a `PublishedPrompt` of the
`KVPublisher`, encoded on request), the KV it holds for loads from this same sidecar, its
chunk links in the local prefix index, and its announcement on the relay link. Eviction must
undo all of them together, or a load would find a prompt whose KV is gone, or a relay would
route requests for tracks nobody serves. `PromptStore` is the only code that adds or removes
any of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from sidecar.kvcache.layout import KVLayout
from sidecar.kvcache.prefix_index import PrefixIndex, PrefixMatch
from sidecar.transfer.publisher import KVPublisher, PublishedPrompt

Namespace = tuple[bytes, ...]


class Announcer(Protocol):
    """Where a prompt is announced so that subscribers are routed to it (the relay link)."""

    async def announce(self, namespace: Namespace) -> None: ...
    def withdraw(self, namespace: Namespace) -> None: ...


class PromptStore:
    """See the module docstring. `max_bytes` bounds what the complete prompts hold (their KV
    and their encoded tracks); past it the oldest go, never the one just published."""

    def __init__(self, publisher: KVPublisher, announcer: Announcer, max_bytes: int) -> None:
        self.publisher = publisher
        self.max_bytes = max_bytes
        self._announcer = announcer
        self._complete: dict[Namespace, PublishedPrompt] = {}  # oldest first
        self._index = PrefixIndex(prompt_key=publisher.prompt_key)

    def get(self, model: str, token_ids: Sequence[int], chunk_size: int) -> PublishedPrompt | None:
        """The prompt of these tokens if it was published here (or is being published)."""
        name = self.publisher.prompt_name(model, token_ids, chunk_size)
        return self.publisher.declared(name.namespace())

    def declare(
        self,
        model: str,
        layout: KVLayout,
        token_ids: Sequence[int],
        *,
        tracks: Sequence[str],
        default_track: str,
        chunk_size: int,
    ) -> PublishedPrompt:
        """A new prompt; its KV follows with `publish`. PublishError for a bad one."""
        return self.publisher.prompt(
            model,
            layout,
            token_ids,
            tracks=tracks,
            default_track=default_track,
            chunk_size=chunk_size,
        )

    async def publish(
        self, prompt: PublishedPrompt, kv: torch.Tensor
    ) -> list[tuple[PublishedPrompt, int]]:
        """Announce a declared prompt, publish its KV, keep it for local loads and index it;
        then evict the oldest complete prompts past `max_bytes`. The evicted, with the bytes
        each held."""
        await self._announcer.announce(prompt.namespace)
        await prompt.publish(kv)
        assert prompt.catalog is not None
        self._complete[prompt.namespace] = prompt
        evicted = self._evict(keep=prompt)
        self._index.add_catalog(prompt.catalog)
        return evicted

    def local(self, model: str, token_ids: Sequence[int]) -> PrefixMatch | None:
        """The longest complete prompt published here that `token_ids` start with."""
        return self._index.lookup(model, token_ids)

    def chunks(self, match: PrefixMatch) -> tuple[torch.Tensor, ...]:
        """The KV of a `local` match, chunk by chunk, as its publisher holds it."""
        return self._complete[match.prompt.namespace()].held_kv

    def held_bytes(self, prompt: PublishedPrompt) -> int:
        kv = sum(chunk.numel() * chunk.element_size() for chunk in prompt.held_kv)
        return kv + self.publisher.held_bytes(prompt.namespace)

    def _evict(self, keep: PublishedPrompt) -> list[tuple[PublishedPrompt, int]]:
        """Withdraw the oldest complete prompts until what they hold fits `max_bytes`. A
        prompt still being encoded is no candidate, and the one just published stays even
        alone over the budget: its Publish succeeded. Relays keep serving withdrawn prompts
        from their own caches."""
        held = {prompt: self.held_bytes(prompt) for prompt in self._complete.values()}
        total = sum(held.values())
        evicted = []
        for prompt in list(self._complete.values()):
            if total <= self.max_bytes:
                break
            if prompt is keep:
                continue
            total -= held[prompt]
            del self._complete[prompt.namespace]
            self._index.remove(prompt.name)
            self.publisher.remove(prompt.namespace)
            self._announcer.withdraw(prompt.namespace)
            evicted.append((prompt, held[prompt]))
        return evicted
