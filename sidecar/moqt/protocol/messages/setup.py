"""Session setup and flow control: CLIENT_SETUP, SERVER_SETUP (draft 18: SETUP), GOAWAY,
MAX_REQUEST_ID, REQUESTS_BLOCKED (gone in draft 18, whose stream limits do their job)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from ..drafts import Draft
from ..wire import (
    Reader,
)
from .base import MAX_GOAWAY_URI, ControlMessage, _register, _RequestIdOnly
from .parameters import NO_SETUP_PARAMETERS, SetupParameters


@_register
@dataclass(frozen=True, slots=True)
class ClientSetup(ControlMessage):
    """`versions`: the drafts offered, where SETUP names them (draft 14; from draft 15 the
    ALPN does, and the list is empty)."""

    TYPE: ClassVar[int] = 0x20
    UNTIL: ClassVar[int | None] = 16

    versions: tuple[int, ...]
    parameters: SetupParameters = NO_SETUP_PARAMETERS

    def encode_payload(self, draft: Draft) -> bytes:
        parameters = self.parameters.encode(draft)
        if draft.setup_version is None:
            return parameters
        versions = b"".join(draft.wire.varint(v) for v in self.versions)
        return draft.wire.varint(len(self.versions)) + versions + parameters

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        versions: tuple[int, ...] = ()
        if draft.setup_version is not None:
            count = reader.count(reader.remaining, "version")
            versions = tuple(reader.varint() for _ in range(count))
        return cls(versions, SetupParameters.decode(reader, draft))


@_register
@dataclass(frozen=True, slots=True)
class ServerSetup(ControlMessage):
    """`version`: the draft chosen, where SETUP names it (None from draft 15)."""

    TYPE: ClassVar[int] = 0x21
    UNTIL: ClassVar[int | None] = 16

    version: int | None
    parameters: SetupParameters = NO_SETUP_PARAMETERS

    def encode_payload(self, draft: Draft) -> bytes:
        parameters = self.parameters.encode(draft)
        if draft.setup_version is None:
            return parameters
        if self.version is None:
            raise ValueError(f"SERVER_SETUP names its version in {draft}")
        return draft.wire.varint(self.version) + parameters

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        version = None if draft.setup_version is None else reader.varint()
        return cls(version, SetupParameters.decode(reader, draft))


@_register
@dataclass(frozen=True, slots=True)
class Setup(ControlMessage):
    """Draft 18's one SETUP, sent by each side first on its own control stream (a
    unidirectional stream whose type is this message's): its options run to its end."""

    TYPE: ClassVar[int] = 0x2F00
    SINCE: ClassVar[int] = 18

    parameters: SetupParameters = NO_SETUP_PARAMETERS

    def encode_payload(self, draft: Draft) -> bytes:
        return draft.wire.kvps(self.parameters.pairs(draft), draft.delta_types)

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        return cls(SetupParameters.of(reader.kvps(draft.delta_types)))


@_register
@dataclass(frozen=True, slots=True)
class Goaway(ControlMessage):
    """Draft 18 adds how long the sender waits (`timeout`, ms, 0: it does not say) and, on
    the control stream, the first of the receiver's requests it did not take
    (`request_id`)."""

    TYPE: ClassVar[int] = 0x10

    new_session_uri: bytes = b""
    timeout: int = 0
    request_id: int | None = None

    def encode_payload(self, draft: Draft) -> bytes:
        uri = draft.wire.bytes_vi(self.new_session_uri)
        if not draft.request_streams:
            return uri
        after = b"" if self.request_id is None else draft.wire.varint(self.request_id)
        return uri + draft.wire.varint(self.timeout) + after

    @classmethod
    def decode_payload(cls, reader: Reader, draft: Draft) -> Self:
        uri = reader.bytes_vi(MAX_GOAWAY_URI, "new session URI")
        if not draft.request_streams:
            return cls(uri)
        timeout = reader.varint()
        return cls(uri, timeout, None if reader.at_end() else reader.varint())


@_register
@dataclass(frozen=True, slots=True)
class MaxRequestId(_RequestIdOnly):
    """``request_id`` is the new limit: the peer may use ids strictly below it."""

    TYPE: ClassVar[int] = 0x15
    UNTIL: ClassVar[int | None] = 16


@_register
@dataclass(frozen=True, slots=True)
class RequestsBlocked(_RequestIdOnly):
    """``request_id`` is the limit the sender is blocked on."""

    TYPE: ClassVar[int] = 0x1A
    UNTIL: ClassVar[int | None] = 16
