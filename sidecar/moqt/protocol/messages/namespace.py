"""PUBLISH_NAMESPACE (ANNOUNCE before -13) and SUBSCRIBE_NAMESPACE families.

From draft 16 a namespace's withdrawal and cancellation name the PUBLISH_NAMESPACE by its
request id instead of the namespace, and a namespace subscription hears of namespaces by
NAMESPACE and NAMESPACE_DONE (on a stream of its own, which UNSUBSCRIBE_NAMESPACE's closing
replaces).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Self

from ..drafts import Draft
from ..errors import (
    PUBLISH_NAMESPACE_RENUMBERED,
    SUBSCRIBE_NAMESPACE_RENUMBERED,
    DecodeError,
    draft_14_code,
)
from ..wire import (
    Reader,
)
from .base import (
    ControlMessage,
    _NamespaceOnly,
    _OkOfRequest,
    _register,
    _RequestError,
)
from .parameters import (
    NO_PARAMETERS,
    Parameters,
    decode_message_parameters,
    encode_message_parameters,
)


def _request_id_of(message: PublishNamespaceDone | PublishNamespaceCancel, draft: Draft) -> bytes:
    if message.request_id is None:
        raise ValueError(f"{type(message).__name__} needs the request id from draft 16 on")
    return draft.wire.varint(message.request_id)


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespace(ControlMessage):
    TYPE: ClassVar[int] = 0x06
    NEW_REQUEST: ClassVar[bool] = True

    request_id: int
    namespace: tuple[bytes, ...]
    parameters: Parameters = NO_PARAMETERS

    def encode_payload(self, draft: Draft) -> bytes:
        return (
            draft.wire.varint(self.request_id)
            + draft.wire.tuple(self.namespace)
            + encode_message_parameters((), self.parameters, draft)
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id, namespace = reader.varint(), reader.tuple()
        _, parameters = decode_message_parameters(reader, draft)
        return cls(request_id, namespace, parameters)


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceOk(_OkOfRequest):
    TYPE: ClassVar[int] = 0x07


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceError(_RequestError):
    TYPE: ClassVar[int] = 0x08
    RENUMBERED: ClassVar[dict[int, int]] = PUBLISH_NAMESPACE_RENUMBERED


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceDone(ControlMessage):
    """Withdraws a namespace: draft 14 names it, draft 16 the PUBLISH_NAMESPACE's request
    id (the session fills in whichever the bytes lack); draft 18 resets the request's
    stream instead."""

    TYPE: ClassVar[int] = 0x09
    UNTIL: ClassVar[int | None] = 16

    namespace: tuple[bytes, ...]
    request_id: int | None = None

    def encode_payload(self, draft: Draft) -> bytes:
        if draft.request_replies:
            return _request_id_of(self, draft)
        return draft.wire.tuple(self.namespace)

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        if draft.request_replies:
            return cls((), reader.varint())
        return cls(reader.tuple())


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceCancel(ControlMessage):
    """The receiver stops accepting a namespace; named as PUBLISH_NAMESPACE_DONE names it."""

    TYPE: ClassVar[int] = 0x0C
    UNTIL: ClassVar[int | None] = 16  # draft 18: the receiver resets the request's stream

    namespace: tuple[bytes, ...]
    error_code: int
    reason: str = ""
    request_id: int | None = None

    def encode_payload(self, draft: Draft) -> bytes:
        if draft.request_replies:
            code = PUBLISH_NAMESPACE_RENUMBERED.get(self.error_code, self.error_code)
            return (
                _request_id_of(self, draft)
                + draft.wire.varint(code)
                + draft.wire.reason(self.reason)
            )
        return (
            draft.wire.tuple(self.namespace)
            + draft.wire.varint(self.error_code)
            + draft.wire.reason(self.reason)
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        if draft.request_replies:
            request_id = reader.varint()
            code = draft_14_code(PUBLISH_NAMESPACE_RENUMBERED, reader.varint())
            return cls((), code, reader.reason(), request_id)
        return cls(reader.tuple(), reader.varint(), reader.reason())


# ---------------------------------------------------------------------------------------------
# SUBSCRIBE_NAMESPACE family.


class NamespaceOptions(IntEnum):
    """What a namespace subscription asks to hear of (draft 16's Subscribe Options)."""

    PUBLISH = 0x0
    NAMESPACE = 0x1
    BOTH = 0x2


@_register
@dataclass(frozen=True, slots=True)
class SubscribeNamespace(ControlMessage):
    """The prefix may be empty (moq-rs sends one right after setup). Draft 14 hears of
    both namespaces and tracks; draft 16 says which (`options`); draft 18 numbers it 0x50
    and hears of namespaces only: it asks for tracks with SUBSCRIBE_TRACKS (options
    PUBLISH; both at once it cannot ask in one request, and kvmoq then asks for
    namespaces)."""

    TYPE: ClassVar[int] = 0x11
    TYPE_FROM: ClassVar[tuple[tuple[int, int], ...]] = ((18, 0x50),)
    NEW_REQUEST: ClassVar[bool] = True

    request_id: int
    namespace: tuple[bytes, ...]
    parameters: Parameters = NO_PARAMETERS
    options: NamespaceOptions = NamespaceOptions.BOTH

    READ_IN_18: ClassVar[NamespaceOptions] = NamespaceOptions.NAMESPACE

    def wire_type(self, draft: Draft) -> int:
        if draft.request_streams and self.options == NamespaceOptions.PUBLISH:
            return SubscribeTracks.TYPE
        return self.type_in(draft.number)

    def encode_payload(self, draft: Draft) -> bytes:
        options = draft.wire.varint(self.options) if draft.namespace_options else b""
        return b"".join(
            (
                draft.wire.varint(self.request_id),
                draft.wire.tuple(self.namespace),
                options,
                encode_message_parameters((), self.parameters, draft),
            )
        )

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        request_id, prefix = reader.varint(), reader.tuple(allow_empty=True)
        options = cls.READ_IN_18 if draft.request_streams else NamespaceOptions.BOTH
        if draft.namespace_options:
            value = reader.varint()
            if value > NamespaceOptions.BOTH:
                raise DecodeError(f"subscribe options {value}")
            options = NamespaceOptions(value)
        _, parameters = decode_message_parameters(reader, draft)
        return cls(request_id, prefix, parameters, options)


@_register
@dataclass(frozen=True, slots=True)
class SubscribeTracks(SubscribeNamespace):
    """Draft 18's request for the tracks under a prefix (PUBLISH, each on a stream of its
    own): a `SubscribeNamespace` that asks for tracks alone, as draft 16 says it."""

    TYPE: ClassVar[int] = 0x51
    TYPE_FROM: ClassVar[tuple[tuple[int, int], ...]] = ()
    SINCE: ClassVar[int] = 18
    READ_IN_18: ClassVar[NamespaceOptions] = NamespaceOptions.PUBLISH


@_register
@dataclass(frozen=True, slots=True)
class SubscribeNamespaceOk(_OkOfRequest):
    TYPE: ClassVar[int] = 0x12


@_register
@dataclass(frozen=True, slots=True)
class SubscribeNamespaceError(_RequestError):
    TYPE: ClassVar[int] = 0x13
    RENUMBERED: ClassVar[dict[int, int]] = SUBSCRIBE_NAMESPACE_RENUMBERED


@_register
@dataclass(frozen=True, slots=True)
class UnsubscribeNamespace(_NamespaceOnly):
    """The prefix may be empty, like the SUBSCRIBE_NAMESPACE it ends. Draft 14 only: from
    draft 16 the subscription's stream is closed instead."""

    TYPE: ClassVar[int] = 0x14
    UNTIL: ClassVar[int | None] = 14
    ALLOW_EMPTY: ClassVar[bool] = True


@_register
@dataclass(frozen=True, slots=True)
class Namespace(_NamespaceOnly):
    """A namespace under a subscription's prefix now has a publisher: `namespace` is what
    follows the prefix (empty where it is the prefix itself)."""

    TYPE: ClassVar[int] = 0x08
    SINCE: ClassVar[int] = 16
    ALLOW_EMPTY: ClassVar[bool] = True


@_register
@dataclass(frozen=True, slots=True)
class NamespaceDone(_NamespaceOnly):
    """A namespace NAMESPACE announced has no publisher any more (suffix as there)."""

    TYPE: ClassVar[int] = 0x0E
    SINCE: ClassVar[int] = 16
    ALLOW_EMPTY: ClassVar[bool] = True
