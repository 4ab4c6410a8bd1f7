"""PUBLISH_NAMESPACE (ANNOUNCE before -13) and SUBSCRIBE_NAMESPACE families."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from ..wire import (
    Reader,
    encode_reason,
    encode_tuple,
    encode_varint,
)
from .base import (
    ControlMessage,
    _NamespaceOnly,
    _NamespaceRequest,
    _register,
    _RequestError,
    _RequestIdOnly,
)


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespace(_NamespaceRequest):
    TYPE: ClassVar[int] = 0x06


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceOk(_RequestIdOnly):
    TYPE: ClassVar[int] = 0x07


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceError(_RequestError):
    TYPE: ClassVar[int] = 0x08


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceDone(_NamespaceOnly):
    """Withdraws a namespace. Draft-14 carries no request id, only the namespace."""

    TYPE: ClassVar[int] = 0x09


@_register
@dataclass(frozen=True, slots=True)
class PublishNamespaceCancel(ControlMessage):
    TYPE: ClassVar[int] = 0x0C

    namespace: tuple[bytes, ...]
    error_code: int
    reason: str = ""

    def encode_payload(self) -> bytes:
        return (
            encode_tuple(self.namespace)
            + encode_varint(self.error_code)
            + encode_reason(self.reason)
        )

    @classmethod
    def decode_payload(cls, reader: Reader) -> Self:
        return cls(reader.tuple(), reader.varint(), reader.reason())


# ---------------------------------------------------------------------------------------------
# SUBSCRIBE_NAMESPACE family.


@_register
@dataclass(frozen=True, slots=True)
class SubscribeNamespace(_NamespaceRequest):
    TYPE: ClassVar[int] = 0x11
    ALLOW_EMPTY: ClassVar[bool] = True


@_register
@dataclass(frozen=True, slots=True)
class SubscribeNamespaceOk(_RequestIdOnly):
    TYPE: ClassVar[int] = 0x12


@_register
@dataclass(frozen=True, slots=True)
class SubscribeNamespaceError(_RequestError):
    TYPE: ClassVar[int] = 0x13


@_register
@dataclass(frozen=True, slots=True)
class UnsubscribeNamespace(_NamespaceOnly):
    """The prefix may be empty, like the SUBSCRIBE_NAMESPACE it ends."""

    TYPE: ClassVar[int] = 0x14
    ALLOW_EMPTY: ClassVar[bool] = True
