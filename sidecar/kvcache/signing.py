"""Catalog signatures: relays carry catalogs, but only the deployment's publishers may write them.

A catalog's digests decide what a subscriber writes into model memory, and relays are not
trusted with content: one that rewrote a catalog (digests and chunks together) would get its
own KV loaded. So a publisher with a deployment key signs every revision it publishes
(Ed25519), and a subscriber given the trusted public keys takes no revision that is unsigned,
signed by a key it does not know, or altered after signing. Chunk digests stay as they are:
the signature covers the catalog, the catalog covers every chunk.

Wire form of a signed catalog object (an unsigned one is the canonical JSON alone, which
always starts with ``{``)::

    0x00 | scheme (0x01: Ed25519) | key id (8 bytes) | signature (64 bytes) | catalog JSON

The key id is the first 8 bytes of SHA-256 over the raw 32-byte public key, so a subscriber
trusting several keys (a rotation) checks against one. The signature is over
``SIGNATURE_CONTEXT + catalog JSON``: a signature made for anything else never verifies here.
A catalog's name (model, last chunk link) is in the signed bytes and is checked against the
namespace it arrived on, so a signed catalog cannot be replayed for another prompt.

Keys are JWK files (`sidecar.jwk`: ``kvmoq token generate --algorithm EdDSA``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from sidecar.jwk import load_key, load_keys

from .errors import KVCodecError

SIGNED_MARKER = 0x00
SCHEME_ED25519 = 0x01
KEY_ID_BYTES = 8
SIGNATURE_BYTES = 64
HEADER_BYTES = 2 + KEY_ID_BYTES + SIGNATURE_BYTES
SIGNATURE_CONTEXT = b"kvcache.moq.arpa/v1 catalog signature\x00"


class Refusal(StrEnum):
    """Why a catalog revision was not taken: the `reason` label of the refusal metric."""

    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown_key"
    BAD_SIGNATURE = "bad_signature"
    MALFORMED = "malformed"
    WRONG_PROMPT = "wrong_prompt"
    CONTRADICTION = "contradiction"


class CatalogSignatureError(KVCodecError):
    """A catalog object whose signature does not let it through; `refusal` says why.

    Not a `CatalogError`, so that this module stays free of torch (the sidecar's config
    loads keys before anything imports it)."""

    def __init__(self, refusal: Refusal, detail: str) -> None:
        super().__init__(detail)
        self.refusal = refusal


def key_id(key: Ed25519PublicKey) -> bytes:
    return hashlib.sha256(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).digest()[:KEY_ID_BYTES]


@dataclass(frozen=True, slots=True)
class CatalogSigner:
    """A publisher's deployment key: every catalog revision it publishes goes out signed."""

    key: Ed25519PrivateKey

    @classmethod
    def load(cls, path: Path) -> CatalogSigner:
        """An EdDSA private JWK; ValueError for anything else (an HS256 secret, a public key)."""
        key = load_key(path).key
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(
                f"{path}: not an Ed25519 private key (kvmoq token generate "
                "--algorithm EdDSA writes one)"
            )
        return cls(key)

    @property
    def key_id(self) -> bytes:
        return key_id(self.key.public_key())

    def seal(self, catalog: bytes) -> bytes:
        """The catalog object to publish: header, signature, then the catalog unchanged."""
        signature = self.key.sign(SIGNATURE_CONTEXT + catalog)
        return bytes((SIGNED_MARKER, SCHEME_ED25519)) + self.key_id + signature + catalog


def _ignore(refusal: Refusal) -> None:
    pass


@dataclass(frozen=True, slots=True)
class CatalogTrust:
    """The public keys a subscriber takes catalogs from; none: it trusts the relay.

    Without keys, an unsigned catalog is taken and a signed one has its header dropped
    unchecked (a subscriber without keys cannot check and must not refuse what a signing
    publisher sends). With keys, only a catalog signed by one of them is taken.
    """

    keys: Mapping[bytes, Ed25519PublicKey] = field(default_factory=dict)
    """By key id."""
    on_refusal: Callable[[Refusal], None] = _ignore
    """Told of every revision refused, whatever the reason (the sidecar counts them)."""

    @classmethod
    def of(cls, keys: list[Ed25519PublicKey]) -> CatalogTrust:
        return cls({key_id(key): key for key in keys})

    @classmethod
    def load(cls, path: Path) -> CatalogTrust:
        """A JWK or JWK Set file of Ed25519 public keys (private ones give their public half)."""
        keys = []
        for jwk in load_keys(path):
            key = jwk.key
            if isinstance(key, Ed25519PrivateKey):
                key = key.public_key()
            if not isinstance(key, Ed25519PublicKey):
                raise ValueError(f"{path}: every key must be an Ed25519 (EdDSA) key")
            keys.append(key)
        return cls.of(keys)

    @property
    def checks(self) -> bool:
        return bool(self.keys)

    def open(self, data: bytes) -> bytes:
        """The catalog JSON in a catalog object; `CatalogSignatureError` if it may not pass."""
        signed = data[:1] == bytes((SIGNED_MARKER,))
        if not signed:
            if self.checks:
                raise CatalogSignatureError(Refusal.UNSIGNED, "catalog is not signed")
            return data
        if len(data) < HEADER_BYTES or data[1] != SCHEME_ED25519:
            raise CatalogSignatureError(
                Refusal.BAD_SIGNATURE, "catalog signature header is malformed"
            )
        catalog = data[HEADER_BYTES:]
        if not self.checks:
            return catalog
        key = self.keys.get(data[2 : 2 + KEY_ID_BYTES])
        if key is None:
            raise CatalogSignatureError(
                Refusal.UNKNOWN_KEY,
                f"catalog signed by key {data[2 : 2 + KEY_ID_BYTES].hex()}, which is not trusted",
            )
        try:
            key.verify(data[2 + KEY_ID_BYTES : HEADER_BYTES], SIGNATURE_CONTEXT + catalog)
        except InvalidSignature:
            raise CatalogSignatureError(
                Refusal.BAD_SIGNATURE, "catalog signature does not verify"
            ) from None
        return catalog


TRUST_THE_RELAY = CatalogTrust()
"""No keys: what a subscriber does unless the deployment gives it trusted keys."""
