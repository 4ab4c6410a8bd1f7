"""Parameters as typed fields: setup parameters and the version-specific ones of requests.

Known keys become fields so callers never juggle raw pairs; unknown keys are kept, in wire
order, because the draft says to ignore them, not to drop them on the way through a relay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Self

from ..drafts import DRAFT_14, Draft
from ..errors import DecodeError, MoqtError, NeedMoreData, SessionErrorCode
from ..wire import MAX_KVP_BYTES, KeyValuePair, Reader

DELIVERY_TIMEOUT = 0x02
AUTHORIZATION_TOKEN = 0x03
RENDEZVOUS_TIMEOUT = 0x04
"""Draft 18: how long (ms) a relay may hold a SUBSCRIBE for a track with no publisher yet."""
SUBGROUP_DELIVERY_TIMEOUT = 0x06
EXPIRES = 0x08
LARGEST_OBJECT = 0x09
FILL_TIMEOUT = 0x0A
FORWARD = 0x10
SUBSCRIBER_PRIORITY = 0x20
SUBSCRIPTION_FILTER = 0x21
GROUP_ORDER = 0x22
NEW_GROUP_REQUEST = 0x32
FIELD_KEYS = frozenset(
    {EXPIRES, LARGEST_OBJECT, FORWARD, SUBSCRIBER_PRIORITY, SUBSCRIPTION_FILTER, GROUP_ORDER,
     NEW_GROUP_REQUEST}
)  # fmt: skip
"""Draft 16's message parameters for what draft 14 sends as fixed fields (expires, largest
location, forward, subscriber priority, filter, group order; `messages.base.Delivery`
reads and writes them), and one draft 14 has no field for (new group request)."""
ADVISORY_KEYS = frozenset({SUBGROUP_DELIVERY_TIMEOUT, FILL_TIMEOUT})
"""Draft 18's limits a peer may ask a publisher to keep (drop a subgroup older than this; wait
no longer than this for objects a FETCH needs from upstream), which kvmoq reads and does
not act on, as it does DELIVERY_TIMEOUT: it serves what it holds, under its own bounds. They
are dropped where they are read (no earlier draft can carry them on to the next hop)."""
MAX_CACHE_DURATION = 0x04
"""A message parameter in draft 14, a track extension from draft 16 on (where 0x04 is free
for draft 18's RENDEZVOUS_TIMEOUT)."""


class Form(Enum):
    """How draft 18 writes a message parameter's value (its parameters are no key-value
    pairs: the type alone says how long the value is)."""

    BYTE = "u8"
    INT = "vi"
    LOCATION = "bare location"
    BYTES = "length-prefixed"


TYPED_FORMS: dict[int, Form] = {
    DELIVERY_TIMEOUT: Form.INT,
    AUTHORIZATION_TOKEN: Form.BYTES,
    RENDEZVOUS_TIMEOUT: Form.INT,
    SUBGROUP_DELIVERY_TIMEOUT: Form.INT,
    EXPIRES: Form.INT,
    LARGEST_OBJECT: Form.LOCATION,
    FILL_TIMEOUT: Form.INT,
    FORWARD: Form.BYTE,
    SUBSCRIBER_PRIORITY: Form.BYTE,
    SUBSCRIPTION_FILTER: Form.BYTES,
    GROUP_ORDER: Form.BYTE,
    NEW_GROUP_REQUEST: Form.INT,
}
"""Draft 18's value form of each message parameter kvmoq reads or writes. Inside kvmoq a
parameter stays a key-value pair (a location as its bytes), whatever the draft."""

TOKEN_USE_VALUE = 0x3
"""AUTHORIZATION_TOKEN's Alias Type for a token sent whole. The others register, use or delete
aliases, which need a token cache: kvmoq offers none (MAX_AUTH_TOKEN_CACHE_SIZE stays 0)."""
MAX_TOKEN_BYTES = 8192


def authorization_token(value: bytes, draft: Draft, token_type: int = 0) -> bytes:
    """An AUTHORIZATION_TOKEN parameter value that carries ``value`` whole (no Token Type
    is registered yet: 0, agreed out of band)."""
    return draft.wire.varint(TOKEN_USE_VALUE) + draft.wire.varint(token_type) + value


def token_value(raw: bytes, draft: Draft) -> bytes:
    """The token an AUTHORIZATION_TOKEN parameter carries; DecodeError if malformed, too
    long, or an alias."""
    if len(raw) > MAX_TOKEN_BYTES:
        raise DecodeError("token longer than allowed", SessionErrorCode.MALFORMED_AUTH_TOKEN)
    reader = draft.wire.reader(raw)
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

    def pairs(self, draft: Draft = DRAFT_14) -> tuple[KeyValuePair, ...]:
        out: list[KeyValuePair] = []
        for key, name in sorted(self._KEYS.items()):
            value = getattr(self, name)
            if key in self._REPEATABLE:
                out.extend((key, v) for v in value)
            elif value is not None:
                out.append((key, value))
        return (*out, *self.unknown)

    def encode(self, draft: Draft = DRAFT_14) -> bytes:
        return draft.wire.parameters(self.pairs(draft), draft.delta_types)

    @classmethod
    def decode(cls, reader: Reader, draft: Draft = DRAFT_14) -> Self:
        return cls.of(reader.parameters(draft.delta_types))

    @classmethod
    def of(cls, pairs: Iterable[KeyValuePair]) -> Self:
        fields: dict[str, object] = {}
        repeated: dict[str, list[int | bytes]] = {}
        unknown: list[KeyValuePair] = []
        for key, value in pairs:
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
    LATER_KEYS: ClassVar[frozenset[int]] = frozenset({0x02, 0x03})
    """The keys that stay message parameters from draft 16 on: the maximum cache duration is
    a track extension there (the messages that carry extensions send it so), and a
    parameter the peer's table does not know closes its session."""

    delivery_timeout: int | None = None
    authorization_tokens: tuple[bytes, ...] = ()
    max_cache_duration: int | None = None
    rendezvous_timeout: int | None = None
    """Draft 18's RENDEZVOUS_TIMEOUT (0x04 there); no other draft can say it."""

    def pairs(self, draft: Draft = DRAFT_14) -> tuple[KeyValuePair, ...]:
        pairs = _ParameterSet.pairs(self, draft)
        if not draft.request_parameters:
            return pairs
        later = tuple(pair for pair in pairs if pair[0] in self.LATER_KEYS)
        if draft.rendezvous and self.rendezvous_timeout is not None:
            return ((RENDEZVOUS_TIMEOUT, self.rendezvous_timeout), *later)
        return later


def encode_message_parameters(
    fields: Iterable[KeyValuePair], parameters: Parameters, draft: Draft
) -> bytes:
    """A message's parameter block: draft 16's `fields` (see FIELD_KEYS; none under draft
    14, which sends them as fixed fields) and `parameters`."""
    pairs = (*fields, *parameters.pairs(draft))
    if not draft.typed_parameters:
        return draft.wire.parameters(pairs, draft.delta_types)
    out = bytearray(draft.wire.varint(len(pairs)))
    previous = 0
    for key, value in sorted(pairs, key=lambda pair: pair[0]):
        form = TYPED_FORMS.get(key)
        if form is None:
            raise ValueError(f"{draft} has no message parameter {key:#x}")
        out += draft.wire.varint(key - previous)
        previous = key
        if form is Form.BYTE:
            out.append(value)  # type: ignore[arg-type]
        elif form is Form.INT:
            out += draft.wire.varint(value)  # type: ignore[arg-type]
        elif form is Form.LOCATION:
            out += value  # type: ignore[operator]
        else:
            out += draft.wire.bytes_vi(value)  # type: ignore[arg-type]
    return bytes(out)


def _read_typed(reader: Reader, draft: Draft) -> tuple[KeyValuePair, ...]:
    """Draft 18's parameter block, as key-value pairs (see `TYPED_FORMS`). A type outside
    the table cannot be skipped (its length is unknowable): the session closes."""
    count = reader.varint()
    if count * 2 > reader.remaining:  # each takes two bytes at least
        raise NeedMoreData("parameters")
    pairs: list[KeyValuePair] = []
    key = 0
    for _ in range(count):
        key += reader.varint()
        form = TYPED_FORMS.get(key)
        if form is None:
            raise DecodeError(f"unknown message parameter {key:#x}")
        if form is Form.BYTE:
            pairs.append((key, reader.u8()))
        elif form is Form.INT:
            pairs.append((key, reader.varint()))
        elif form is Form.LOCATION:
            pairs.append((key, draft.wire.location(reader.location())))
        else:
            pairs.append((key, reader.bytes_vi(MAX_KVP_BYTES, f"parameter {key:#x}")))
    return tuple(pairs)


def decode_message_parameters(
    reader: Reader, draft: Draft
) -> tuple[dict[int, int | bytes], Parameters]:
    """A message's parameter block, split into draft 16's `fields` (FIELD_KEYS; none under
    draft 14) and the rest. From draft 16 on, a parameter neither table knows closes the
    session (draft 14 keeps it, unknown, for whoever reads it next)."""
    if not draft.request_parameters:
        return {}, Parameters.decode(reader, draft)
    fields: dict[int, int | bytes] = {}
    rest: list[KeyValuePair] = []
    rendezvous: int | None = None
    pairs = (
        _read_typed(reader, draft)
        if draft.typed_parameters
        else reader.parameters(draft.delta_types)
    )
    for key, value in pairs:
        if key in FIELD_KEYS:
            if key in fields:
                raise DecodeError(f"parameter {key:#x} repeated")
            fields[key] = value
        elif key in Parameters.LATER_KEYS:
            rest.append((key, value))
        elif key == RENDEZVOUS_TIMEOUT and draft.rendezvous and rendezvous is None:
            rendezvous = value  # type: ignore[assignment]
        elif key in ADVISORY_KEYS and draft.typed_parameters:
            continue
        else:
            raise DecodeError(f"unknown message parameter {key:#x}")
    parameters = Parameters.of(rest)
    if rendezvous is not None:
        parameters = dataclasses.replace(parameters, rendezvous_timeout=rendezvous)
    return fields, parameters


# Shared defaults (frozen, so one instance serves every message).
NO_PARAMETERS = Parameters()
NO_SETUP_PARAMETERS = SetupParameters()
