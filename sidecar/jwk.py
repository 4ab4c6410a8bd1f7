"""Key files: JWKs (RFC 7517), the one format for every key a kvmoq deployment holds.

Relay tokens (`moqt.relay.auth`) and catalog signatures (`kvcache.signing`) both use them, so
one command makes either (`kvmoq token generate`) and an operator learns one format. PyJWT
parses them; only the algorithms below are accepted.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm

ALGORITHMS = ("HS256", "EdDSA")
MAX_KEY_FILE_BYTES = 1 << 20
"""A JWK Set of a few hundred keys; bounds what a wrong path makes us read."""


def generate(algorithm: str) -> dict[str, str]:
    """A new key as a JWK object with a random ``kid``: an HS256 secret or an Ed25519 pair."""
    if algorithm == "HS256":
        secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        private = {"kty": "oct", "k": secret}
    elif algorithm == "EdDSA":
        private = json.loads(OKPAlgorithm.to_jwk(Ed25519PrivateKey.generate()))
    else:
        raise ValueError(f"algorithm {algorithm!r}, expected one of {ALGORITHMS}")
    private.update(alg=algorithm, kid=secrets.token_hex(8))
    return private


def public_half(private: dict[str, str]) -> dict[str, str]:
    """The JWK without its private part (Ed25519's ``d``)."""
    return {name: value for name, value in private.items() if name != "d"}


def write_secret(path: Path, jwk: dict[str, str]) -> None:
    """Write a private key readable by its owner only (mode 0600 from the start)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(jwk, indent=2) + "\n")


def load_key(path: Path) -> jwt.PyJWK:
    """One JWK file (what ``kvmoq token generate`` writes); ValueError if it is not one."""
    keys = load_keys(path)
    if len(keys) != 1:
        raise ValueError(f"{path}: {len(keys)} keys, expected one")
    return keys[0]


def load_keys(path: Path) -> list[jwt.PyJWK]:
    """The keys of a JWK file or a JWK Set file (``{"keys": [...]}``: several trusted keys,
    as during a key rotation); ValueError if it holds none or one is not usable."""
    try:
        if path.stat().st_size > MAX_KEY_FILE_BYTES:
            raise ValueError(f"larger than {MAX_KEY_FILE_BYTES} bytes")
        data: Any = json.loads(path.read_text())
        objects = data["keys"] if isinstance(data, dict) and "keys" in data else [data]
        if not isinstance(objects, list) or not objects:
            raise ValueError("no keys")
        keys = [jwt.PyJWK(item) for item in objects]
    except (OSError, ValueError, TypeError, jwt.PyJWTError) as exc:
        raise ValueError(f"{path}: not a usable JWK file ({exc})") from None
    for key in keys:
        if key.algorithm_name not in ALGORITHMS:
            raise ValueError(
                f"{path}: algorithm {key.algorithm_name!r}, expected one of {ALGORITHMS}"
            )
    return keys
