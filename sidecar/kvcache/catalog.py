"""The per-prompt catalog: what a subscriber must know before it fetches a single chunk.

A catalog names the model and KV layout, the token count and chunk size, the hash-chain link
of every chunk (`naming`), the tracks on offer with their shared codec tables, and for every
chunk whose encoding is done, its size and payload digest on each track.

Chunks are published while prefill still runs, so a catalog is *revised*: the first revision
is complete except for the chunk sizes and digests (the links follow from the token ids,
known up front; the tables from the first chunk), and every later one adds the chunks that
have since been encoded. Each revision is a self-contained object, published as its own group
of the `catalog` track with group id = the number of chunks it describes; `merge` keeps the
most complete of two revisions and refuses any that rewrites what an earlier one said, so a
relay cannot swap a digest under a subscriber mid-load.

The wire form is canonical JSON (sorted keys, no spaces, ASCII) with binary parts in base64:
readable in a packet dump, and checkable byte for byte, because decoding re-encodes and
rejects anything that is not exactly the canonical form (duplicate keys, other spacings,
non-canonical numbers or base64).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import KVCodecError
from .layout import DEFAULT_CHUNK_SIZE, KVLayout
from .naming import (
    LINK_BYTES,
    MAX_CHUNKS,
    MAX_MODEL_NAME_BYTES,
    PAYLOAD_TRACKS,
    PromptName,
    check_model_name,
    chunk_count,
    chunk_links,
)

FORMAT_VERSION = 1
MAX_CATALOG_BYTES = 16 << 20
MAX_TABLES_BYTES = 4 << 20
"""Per track; the catalog as a whole stays under MAX_CATALOG_BYTES."""
MAX_CHUNK_BYTES = 1 << 40
"""Bounds a declared chunk size: it feeds the adaptation arithmetic, never an allocation."""
DIGEST_BYTES = 32
PAYLOAD_TAG = b"kvcache.moq.arpa/v1 payload"

_MAX_SEPARATORS = len(PAYLOAD_TRACKS) * MAX_CHUNKS + MAX_MODEL_NAME_BYTES + 64
"""Commas a valid catalog can hold (size lists, model name, fixed keys), checked before the
JSON parser runs: it caps how many Python objects a hostile catalog can make it build."""


class CatalogError(KVCodecError):
    """A catalog is malformed, out of bounds, or contradicts an earlier revision."""


class ChunkIntegrityError(KVCodecError):
    """A received chunk does not match the catalog: it must be discarded, never loaded."""

    def __init__(self, track: str, chunk: int, reason: str) -> None:
        super().__init__(f"chunk {chunk} on track {track!r}: {reason}")
        self.track = track
        self.chunk = chunk


def payload_digest(payloads: Sequence[bytes]) -> bytes:
    """Digest of a chunk's token objects on one track, as the catalog lists it.

    Each payload is length-prefixed (u64le) so that moving bytes across an object boundary
    changes the digest.
    """
    digest = hashlib.sha256(PAYLOAD_TAG)
    for payload in payloads:
        digest.update(struct.pack("<Q", len(payload)))
        digest.update(payload)
    return digest.digest()


@dataclass(frozen=True, slots=True)
class TrackEntry:
    """One track on offer: its codec tables, and per encoded chunk its size and digest."""

    name: str
    tables: bytes | None
    sizes: tuple[int, ...] = ()
    digests: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        if self.name not in PAYLOAD_TRACKS:
            raise CatalogError(f"unknown track {self.name!r}; known: {PAYLOAD_TRACKS}")
        if self.tables is not None and len(self.tables) > MAX_TABLES_BYTES:
            raise CatalogError(f"{self.name} tables exceed {MAX_TABLES_BYTES} bytes")
        if len(self.sizes) != len(self.digests):
            raise CatalogError(f"{self.name}: {len(self.sizes)} sizes, {len(self.digests)} digests")
        # Whole-tuple checks at C speed: a publisher re-validates every revision.
        if self.sizes and (
            not set(map(type, self.sizes)) <= {int}
            or min(self.sizes) < 0
            or max(self.sizes) > MAX_CHUNK_BYTES
        ):
            raise CatalogError(
                f"{self.name}: chunk sizes must be integers in [0, {MAX_CHUNK_BYTES}]"
            )
        if not set(map(len, self.digests)) <= {DIGEST_BYTES}:
            raise CatalogError(f"{self.name}: digests must be {DIGEST_BYTES} bytes")


@dataclass(frozen=True, slots=True)
class Catalog:
    """One revision of a prompt's catalog; tracks are sorted by name, as on the wire."""

    model: str
    layout: KVLayout
    token_count: int
    chunk_size: int
    chunk_hashes: tuple[bytes, ...]
    tracks: tuple[TrackEntry, ...]

    def __post_init__(self) -> None:
        check_model_name(self.model)
        if not isinstance(self.layout, KVLayout):
            raise CatalogError(f"layout must be a KVLayout, got {type(self.layout).__name__}")
        chunks = chunk_count(self.token_count, self.chunk_size)
        if len(self.chunk_hashes) != chunks:
            raise CatalogError(f"{len(self.chunk_hashes)} chunk hashes for {chunks} chunks")
        if not set(map(len, self.chunk_hashes)) <= {LINK_BYTES}:
            raise CatalogError(f"chunk hashes must be {LINK_BYTES} bytes")
        names = [track.name for track in self.tracks]
        if not names or names != sorted(set(names)):
            raise CatalogError(f"tracks must be non-empty, unique and sorted, got {names}")
        ready = {len(track.sizes) for track in self.tracks}
        if len(ready) != 1 or ready.pop() > chunks:
            raise CatalogError("every track must describe the same chunks, at most all of them")

    @classmethod
    def for_prompt(
        cls,
        model: str,
        layout: KVLayout,
        token_ids: Sequence[int],
        tables: Mapping[str, bytes | None],
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        prompt_key: bytes | None = None,
    ) -> Catalog:
        """The first revision, before any chunk is encoded; `tables` maps track -> tables;
        the links are keyed with `prompt_key` if the deployment has one (`naming`)."""
        return cls(
            model=model,
            layout=layout,
            token_count=len(token_ids),
            chunk_size=chunk_size,
            chunk_hashes=tuple(chunk_links(token_ids, chunk_size, prompt_key)),
            tracks=tuple(TrackEntry(name, tables[name]) for name in sorted(tables)),
        )

    @property
    def name(self) -> PromptName:
        """Where this catalog must have come from: compare with the namespace it arrived on."""
        return PromptName(self.model, self.chunk_hashes[-1].hex())

    @property
    def ready_chunks(self) -> int:
        """Leading chunks whose encoding is done and described here."""
        return len(self.tracks[0].sizes)

    @property
    def complete(self) -> bool:
        return self.ready_chunks == len(self.chunk_hashes)

    def track(self, name: str) -> TrackEntry:
        for track in self.tracks:
            if track.name == name:
                return track
        raise CatalogError(f"track {name!r} is not on offer")

    def chunk_span(self, index: int) -> range:
        """Token indices (MoQT object ids + chunk start) of chunk `index`."""
        if not 0 <= index < len(self.chunk_hashes):
            raise CatalogError(f"chunk {index} out of range [0, {len(self.chunk_hashes)})")
        start = index * self.chunk_size
        return range(start, min(start + self.chunk_size, self.token_count))

    def chunk_bytes(self, index: int) -> dict[str, int]:
        """Encoded size of a ready chunk on every track: what `transfer.adapt` chooses from."""
        if not 0 <= index < self.ready_chunks:
            raise CatalogError(f"chunk {index} is not ready in this revision")
        return {track.name: track.sizes[index] for track in self.tracks}

    def with_chunk(self, encoded: Mapping[str, Sequence[bytes]]) -> Catalog:
        """The next revision, once the next chunk is encoded: `encoded` maps track -> payloads."""
        index = self.ready_chunks
        if index == len(self.chunk_hashes):
            raise CatalogError("every chunk is already described")
        if sorted(encoded) != [track.name for track in self.tracks]:
            raise CatalogError(f"chunk {index} must be encoded on exactly the tracks on offer")
        tokens = len(self.chunk_span(index))
        if any(len(payloads) != tokens for payloads in encoded.values()):
            raise CatalogError(f"chunk {index} has {tokens} tokens on every track")
        tracks = tuple(
            dataclasses.replace(
                track,
                sizes=(*track.sizes, sum(len(p) for p in encoded[track.name])),
                digests=(*track.digests, payload_digest(encoded[track.name])),
            )
            for track in self.tracks
        )
        return dataclasses.replace(self, tracks=tracks)

    def verify_chunk(self, track: str, index: int, payloads: Sequence[bytes]) -> None:
        """Check a received chunk before it is written anywhere; `ChunkIntegrityError` if not.

        Only ready chunks can be checked: a subscriber holds objects of a newer chunk until a
        revision describing it arrives.
        """
        if not 0 <= index < self.ready_chunks:
            raise ChunkIntegrityError(track, index, "not described by this catalog revision")
        entry = self.track(track)
        tokens = len(self.chunk_span(index))
        if len(payloads) != tokens:
            raise ChunkIntegrityError(track, index, f"{len(payloads)} objects, expected {tokens}")
        if sum(len(p) for p in payloads) != entry.sizes[index]:
            raise ChunkIntegrityError(track, index, "size differs from the catalog")
        if payload_digest(payloads) != entry.digests[index]:
            raise ChunkIntegrityError(track, index, "digest differs from the catalog")

    def merge(self, other: Catalog) -> Catalog:
        """The more complete of two revisions of one prompt; `CatalogError` if they disagree.

        Catalog groups may arrive in any order, so an older revision is not an error, but two
        revisions must agree on everything both describe.
        """
        older, newer = sorted((self, other), key=lambda c: c.ready_chunks)
        if newer._first_chunks(older.ready_chunks) != older:
            raise CatalogError("catalog revision contradicts an earlier one")
        return newer

    def _first_chunks(self, count: int) -> Catalog:
        """This revision cut back to its first `count` ready chunks."""
        tracks = tuple(
            dataclasses.replace(track, sizes=track.sizes[:count], digests=track.digests[:count])
            for track in self.tracks
        )
        return dataclasses.replace(self, tracks=tracks)

    def encode(self) -> bytes:
        """The canonical wire form; `CatalogError` past MAX_CATALOG_BYTES."""
        data = json.dumps(
            {
                "version": FORMAT_VERSION,
                "model": self.model,
                "layout": self.layout.to_dict(),
                "token_count": self.token_count,
                "chunk_size": self.chunk_size,
                "chunk_hashes": _b64(b"".join(self.chunk_hashes)),
                "tracks": {
                    track.name: {
                        "tables": None if track.tables is None else _b64(track.tables),
                        "sizes": list(track.sizes),
                        "digests": _b64(b"".join(track.digests)),
                    }
                    for track in self.tracks
                },
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        if len(data) > MAX_CATALOG_BYTES:
            raise CatalogError(f"catalog is {len(data)} bytes, at most {MAX_CATALOG_BYTES}")
        return data

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Catalog:
        """Parse a catalog object from the network; `CatalogError` for anything malformed."""
        if len(data) > MAX_CATALOG_BYTES:
            raise CatalogError(f"catalog is {len(data)} bytes, at most {MAX_CATALOG_BYTES}")
        data = bytes(data)
        if data.count(b",") > _MAX_SEPARATORS:
            raise CatalogError("catalog holds more items than any valid catalog")
        try:
            root = json.loads(data, parse_float=_reject_number, parse_constant=_reject_number)
        except (ValueError, RecursionError) as exc:
            raise CatalogError(f"catalog is not valid JSON: {exc}") from None
        try:
            catalog = _from_json(root)
        except KVCodecError as exc:
            raise CatalogError(str(exc)) from exc
        if catalog.encode() != data:
            raise CatalogError("catalog is not in canonical form")
        return catalog


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _reject_number(literal: str) -> Any:
    raise ValueError(f"number {literal} is not an integer")


def _fields(value: Any, keys: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or value.keys() != keys:
        raise CatalogError(f"{what} must be an object with exactly the keys {sorted(keys)}")
    return value


def _int(value: Any, what: str) -> int:
    # bool is an int subclass; a JSON `true` must not pass as 1.
    if type(value) is not int:
        raise CatalogError(f"{what} must be an integer")
    return value


def _binary(value: Any, what: str, item_bytes: int = 0) -> bytes:
    """Base64 field; with `item_bytes`, a concatenation of items of that size."""
    if not isinstance(value, str):
        raise CatalogError(f"{what} must be a base64 string")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CatalogError(f"{what} is not valid base64") from None
    if item_bytes and len(raw) % item_bytes:
        raise CatalogError(f"{what} is not a whole number of {item_bytes}-byte items")
    return raw


def _split(raw: bytes, size: int) -> tuple[bytes, ...]:
    return tuple(raw[i : i + size] for i in range(0, len(raw), size))


_ROOT_KEYS = frozenset(
    {"version", "model", "layout", "token_count", "chunk_size", "chunk_hashes", "tracks"}
)
_TRACK_KEYS = frozenset({"tables", "sizes", "digests"})


def _from_json(root: Any) -> Catalog:
    root = _fields(root, _ROOT_KEYS, "catalog")
    if _int(root["version"], "version") != FORMAT_VERSION:
        raise CatalogError(f"catalog version {root['version']}, this build reads {FORMAT_VERSION}")
    if not isinstance(root["model"], str):
        raise CatalogError("model must be a string")
    tracks = root["tracks"]
    if not isinstance(tracks, dict):
        raise CatalogError("tracks must be an object")
    return Catalog(
        model=root["model"],
        layout=KVLayout.from_dict(root["layout"]),
        token_count=_int(root["token_count"], "token_count"),
        chunk_size=_int(root["chunk_size"], "chunk_size"),
        chunk_hashes=_split(_binary(root["chunk_hashes"], "chunk_hashes", LINK_BYTES), LINK_BYTES),
        tracks=tuple(_track_from_json(name, value) for name, value in tracks.items()),
    )


def _track_from_json(name: str, value: Any) -> TrackEntry:
    entry = _fields(value, _TRACK_KEYS, f"track {name!r}")
    sizes = entry["sizes"]
    if not isinstance(sizes, list):
        raise CatalogError(f"track {name!r} sizes must be a list")
    tables = entry["tables"]
    return TrackEntry(
        name=name,
        tables=None if tables is None else _binary(tables, f"track {name!r} tables"),
        sizes=tuple(_int(size, f"track {name!r} size") for size in sizes),
        digests=_split(
            _binary(entry["digests"], f"track {name!r} digests", DIGEST_BYTES), DIGEST_BYTES
        ),
    )
