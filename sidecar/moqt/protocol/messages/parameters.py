"""Parameters as typed fields: setup parameters and the version-specific ones of requests.

Known keys become fields so callers never juggle raw pairs; unknown keys are kept, in wire
order, because the draft says to ignore them, not to drop them on the way through a relay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from ..errors import DecodeError, MoqtError, SessionErrorCode
from ..wire import (
    KeyValuePair,
    Reader,
    encode_parameters,
    encode_varint,
)

TOKEN_USE_VALUE = 0x3
"""AUTHORIZATION_TOKEN's Alias Type for a token sent whole. The others register, use or delete
aliases, which need a token cache: kvmoq offers none (MAX_AUTH_TOKEN_CACHE_SIZE stays 0)."""
MAX_TOKEN_BYTES = 8192


def authorization_token(value: bytes, token_type: int = 0) -> bytes:
    """An AUTHORIZATION_TOKEN parameter value that carries ``value`` whole (no Token Type
    is registered yet: 0, agreed out of band)."""
    return encode_varint(TOKEN_USE_VALUE) + encode_varint(token_type) + value


def token_value(raw: bytes) -> bytes:
    """The token an AUTHORIZATION_TOKEN parameter carries; DecodeError if malformed, too
    long, or an alias."""
    if len(raw) > MAX_TOKEN_BYTES:
        raise DecodeError("token longer than allowed", SessionErrorCode.MALFORMED_AUTH_TOKEN)
    reader = Reader(raw)
    try:
        alias_type = reader.varint()
        reader.varint()  # Token Type: what the value is, agreed out of band
    except MoqtError:
        raise DecodeError("malformed token", SessionErrorCode.MALFORMED_AUTH_TOKEN) from None
    if alias_type != TOKEN_USE_VALUE:
        raise DecodeError(
            "token aliases are not supported", SessionErrorCode.UNKNOWN_AUTH_TOKEN_ALIAS
        )
    return bytes(reader.raw(reader.remaining))


@dataclass(frozen=True, slots=True)
class _ParameterSet:
    """Known parameters as typed fields, unknown ones kept in ``unknown`` in wire order.

    Subclasses list their keys in ``_KEYS`` (key -> field name); keys in ``_REPEATABLE`` map to
    a tuple field and may appear many times, any other known key twice is a violation.
    """

    _KEYS: ClassVar[dict[int, str]] = {}
    _REPEATABLE: ClassVar[frozenset[int]] = frozenset()

    unknown: tuple[KeyValuePair, ...] = ()

    def pairs(self) -> tuple[KeyValuePair, ...]:
        out: list[KeyValuePair] = []
        for key, name in sorted(self._KEYS.items()):
            value = getattr(self, name)
            if key in self._REPEATABLE:
                out.extend((key, v) for v in value)
            elif value is not None:
                out.append((key, value))
        return (*out, *self.unknown)

    def encode(self) -> bytes:
        return encode_parameters(self.pairs())

    @classmethod
    def decode(cls, reader: Reader) -> Self:
        fields: dict[str, object] = {}
        repeated: dict[str, list[int | bytes]] = {}
        unknown: list[KeyValuePair] = []
        for key, value in reader.parameters():
            name = cls._KEYS.get(key)
            if name is None:
                unknown.append((key, value))
            elif key in cls._REPEATABLE:
                repeated.setdefault(name, []).append(value)
            elif name in fields:
                raise DecodeError(f"parameter {key:#x} repeated")
            else:
                fields[name] = value
        fields.update((name, tuple(values)) for name, values in repeated.items())
        return cls(unknown=tuple(unknown), **fields)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class SetupParameters(_ParameterSet):
    """CLIENT_SETUP / SERVER_SETUP parameters (their own registry, shared by all versions)."""

    _KEYS: ClassVar[dict[int, str]] = {
        0x01: "path",
        0x02: "max_request_id",
        0x03: "authorization_tokens",
        0x04: "max_auth_token_cache_size",
        0x05: "authority",
        0x07: "implementation",
    }
    _REPEATABLE: ClassVar[frozenset[int]] = frozenset({0x03})

    path: bytes | None = None
    max_request_id: int | None = None
    authorization_tokens: tuple[bytes, ...] = ()
    max_auth_token_cache_size: int | None = None
    authority: bytes | None = None
    implementation: bytes | None = None


@dataclass(frozen=True, slots=True)
class Parameters(_ParameterSet):
    """Version-specific parameters of request messages."""

    _KEYS: ClassVar[dict[int, str]] = {
        0x02: "delivery_timeout",
        0x03: "authorization_tokens",
        0x04: "max_cache_duration",
    }
    _REPEATABLE: ClassVar[frozenset[int]] = frozenset({0x03})

    delivery_timeout: int | None = None
    authorization_tokens: tuple[bytes, ...] = ()
    max_cache_duration: int | None = None


# Shared defaults (frozen, so one instance serves every message).
NO_PARAMETERS = Parameters()
NO_SETUP_PARAMETERS = SetupParameters()
