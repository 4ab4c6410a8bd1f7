"""Fuzz targets of the KV data model: catalogs (signed or not), token payloads on every
track, `ac`'s shared tables."""

from __future__ import annotations

from functools import cache

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fuzz.targets import Target
from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.errors import KVCodecError
from sidecar.kvcache.layout import KVLayout
from sidecar.kvcache.signing import CatalogSigner, CatalogTrust

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float16")


@cache
def _trust() -> tuple[CatalogSigner, CatalogTrust]:
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    return CatalogSigner(key), CatalogTrust.of([key.public_key()])


def catalog(data: bytes) -> None:
    """A catalog object as a subscriber without keys takes it."""
    Catalog.decode(CatalogTrust().open(data))


def signed_catalog(data: bytes) -> None:
    """A catalog object checked against a trusted key; the input either signed here (so
    the fuzzer explores the catalog parser past a valid signature) or taken as it is."""
    signer, trust = _trust()
    body = signer.seal(data[1:]) if data[:1] == b"S" else data
    Catalog.decode(trust.open(body))


def payloads(data: bytes) -> None:
    """A chunk's token payloads on any track: the first byte picks the codec, the rest is
    cut into one payload per token."""
    if not data:
        return
    name = CODEC_NAMES[data[0] % len(CODEC_NAMES)]
    codec = get_codec(name)
    body = data[1:]
    size = max(1, len(body) // 3)
    chunk = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    codec.decode(chunk, LAYOUT, _tables(name))


@cache
def _tables(name: str) -> bytes | None:
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(LAYOUT.shape(16), generator=generator).to(torch.float16)
    return get_codec(name).fit_tables(LAYOUT, sample)


def ac_tables(data: bytes) -> None:
    """`ac` tables as a catalog carries them, then a token decoded with them."""
    get_codec("ac").decode([data[:64]], LAYOUT, data[64:])


def _vector_catalog() -> bytes:
    first = Catalog.for_prompt("demo/model", LAYOUT, [1, 2, 3, 4, 5], {"int8": None}, 4)
    return first.with_chunk({"int8": [b"\x01\x02"] * 4}).encode()


def _payload_seeds() -> list[bytes]:
    generator = torch.Generator().manual_seed(1)
    kv = torch.randn(LAYOUT.shape(3), generator=generator).to(torch.float16)
    return [
        bytes([index]) + b"".join(get_codec(name).encode(kv, LAYOUT, _tables(name)))
        for index, name in enumerate(CODEC_NAMES)
    ]


def _ac_seeds() -> list[bytes]:
    payload = _payload_seeds()[CODEC_NAMES.index("ac")][1:]
    tables = _tables("ac")
    assert tables is not None
    return [payload[:64].ljust(64, b"\x00") + tables]


TARGETS: dict[str, Target] = {
    "catalog": Target(catalog, (KVCodecError,), lambda: [_vector_catalog()]),
    "signed_catalog": Target(
        signed_catalog,
        (KVCodecError,),
        lambda: [b"S" + _vector_catalog(), _trust()[0].seal(_vector_catalog())],
    ),
    "payloads": Target(payloads, (KVCodecError,), _payload_seeds),
    "ac_tables": Target(ac_tables, (KVCodecError,), _ac_seeds),
}
