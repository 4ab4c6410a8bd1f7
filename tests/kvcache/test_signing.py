"""Catalog signatures: what a subscriber with trusted keys takes, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sidecar.cli import main
from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.signing import (
    HEADER_BYTES,
    TRUST_THE_RELAY,
    CatalogSignatureError,
    CatalogSigner,
    CatalogTrust,
    Refusal,
)
from tests.support.vectors import VECTOR_BYTES

# Test vector, also in docs/wire-format.md: the catalog vector signed with the Ed25519 key
# whose 32-byte seed is 00 01 .. 1f (Ed25519 signatures are deterministic).
VECTOR_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
VECTOR_HEADER = bytes.fromhex(
    "0001"  # signed, Ed25519
    "56475aa75463474c"  # key id: SHA-256 of the public key, first 8 bytes
    "ff8a2c70ff5bdd6ed273b3571127c310c4aceb7ce230c39ea3c9a8900106776d"
    "e321008fd6ea16fe31f443dbce8c48e6dcaa6c82e511dd4fb1ee5c51b7e8bf07"
)

SIGNER = CatalogSigner(VECTOR_KEY)
TRUST = CatalogTrust.of([VECTOR_KEY.public_key()])


def refusal(trust: CatalogTrust, data: bytes) -> Refusal:
    with pytest.raises(CatalogSignatureError) as caught:
        trust.open(data)
    return caught.value.refusal


def test_signed_catalog_vector() -> None:
    signed = SIGNER.seal(VECTOR_BYTES)
    assert signed == VECTOR_HEADER + VECTOR_BYTES
    assert len(VECTOR_HEADER) == HEADER_BYTES
    assert Catalog.decode(TRUST.open(signed)).encode() == VECTOR_BYTES


def test_every_altered_byte_is_refused() -> None:
    signed = SIGNER.seal(VECTOR_BYTES)
    for position in range(2, len(signed)):  # key id, signature, and every catalog byte
        altered = bytearray(signed)
        altered[position] ^= 0x01
        expected = Refusal.UNKNOWN_KEY if position < 10 else Refusal.BAD_SIGNATURE
        assert refusal(TRUST, bytes(altered)) is expected, position


def test_trusted_keys_refuse_unsigned_foreign_and_malformed_catalogs() -> None:
    stranger = CatalogSigner(Ed25519PrivateKey.generate())
    assert refusal(TRUST, VECTOR_BYTES) is Refusal.UNSIGNED
    assert refusal(TRUST, stranger.seal(VECTOR_BYTES)) is Refusal.UNKNOWN_KEY
    assert refusal(TRUST, VECTOR_HEADER[:20]) is Refusal.BAD_SIGNATURE  # truncated header
    assert refusal(TRUST, b"\x00\x02" + VECTOR_HEADER[2:] + VECTOR_BYTES) is Refusal.BAD_SIGNATURE
    # A signature made with the right key over other bytes (another catalog) does not move.
    other = SIGNER.seal(VECTOR_BYTES.replace(b'"sizes":[8]', b'"sizes":[9]'))
    assert refusal(TRUST, VECTOR_HEADER + other[HEADER_BYTES:]) is Refusal.BAD_SIGNATURE
    # Several trusted keys: each signer is checked against its own.
    both = CatalogTrust.of([VECTOR_KEY.public_key(), stranger.key.public_key()])
    assert both.open(stranger.seal(VECTOR_BYTES)) == VECTOR_BYTES


def test_without_keys_any_catalog_passes() -> None:
    """A subscriber that has no keys cannot check, and must not refuse signing publishers."""
    assert TRUST_THE_RELAY.open(VECTOR_BYTES) == VECTOR_BYTES
    assert TRUST_THE_RELAY.open(SIGNER.seal(VECTOR_BYTES)) == VECTOR_BYTES
    assert refusal(TRUST_THE_RELAY, b"\x00\x01short") is Refusal.BAD_SIGNATURE


def test_keys_made_by_the_cli_sign_and_verify(tmp_path: Path) -> None:
    private, public, secret = tmp_path / "c.jwk", tmp_path / "c.pub.jwk", tmp_path / "hs.jwk"
    assert main(["token", "generate", "--key", str(private), "--algorithm", "EdDSA",
                 "--public", str(public)]) == 0  # fmt: skip
    assert main(["token", "generate", "--key", str(secret)]) == 0
    signer = CatalogSigner.load(private)
    assert CatalogTrust.load(public).open(signer.seal(VECTOR_BYTES)) == VECTOR_BYTES
    # A JWK Set: the keys of a rotation, old and new.
    key_set = tmp_path / "trusted.json"
    key_set.write_text(json.dumps({"keys": [json.loads(public.read_text())]}))
    assert CatalogTrust.load(key_set).open(signer.seal(VECTOR_BYTES)) == VECTOR_BYTES
    with pytest.raises(ValueError, match="not an Ed25519 private key"):
        CatalogSigner.load(public)
    with pytest.raises(ValueError, match="not an Ed25519 private key"):
        CatalogSigner.load(secret)
    with pytest.raises(ValueError, match="Ed25519"):
        CatalogTrust.load(secret)
    (tmp_path / "empty.json").write_text('{"keys": []}')
    with pytest.raises(ValueError, match="no keys"):
        CatalogTrust.load(tmp_path / "empty.json")
