"""MoQT error codes (draft 14's, and how draft 16 renumbers them) and the exceptions the
protocol core raises.

Codes are IntEnums so that logs and tests read as names, while the wire keeps plain integers:
a peer may send codes this table does not know, so decoded messages hold ``int``.

Exceptions come in three kinds, because callers must treat them differently:

* ``NeedMoreData``: the bytes are fine so far but stop early; wait for more.
* ``ProtocolError`` (and its ``DecodeError``): the peer broke the protocol; the session closes
  with ``code``.
* ``UsageError``: the local application asked for something the protocol forbids right now;
  nothing went on the wire.
"""

from __future__ import annotations

from enum import IntEnum


class SessionErrorCode(IntEnum):
    """Application error codes of CONNECTION_CLOSE (draft-14 §Session Termination)."""

    NO_ERROR = 0x0
    INTERNAL_ERROR = 0x1
    UNAUTHORIZED = 0x2
    PROTOCOL_VIOLATION = 0x3
    INVALID_REQUEST_ID = 0x4
    DUPLICATE_TRACK_ALIAS = 0x5
    KEY_VALUE_FORMATTING_ERROR = 0x6
    TOO_MANY_REQUESTS = 0x7
    INVALID_PATH = 0x8
    MALFORMED_PATH = 0x9
    GOAWAY_TIMEOUT = 0x10
    CONTROL_MESSAGE_TIMEOUT = 0x11
    DATA_STREAM_TIMEOUT = 0x12
    AUTH_TOKEN_CACHE_OVERFLOW = 0x13
    DUPLICATE_AUTH_TOKEN_ALIAS = 0x14
    VERSION_NEGOTIATION_FAILED = 0x15
    MALFORMED_AUTH_TOKEN = 0x16
    UNKNOWN_AUTH_TOKEN_ALIAS = 0x17
    EXPIRED_AUTH_TOKEN = 0x18
    INVALID_AUTHORITY = 0x19
    MALFORMED_AUTHORITY = 0x1A


class SubscribeErrorCode(IntEnum):
    """SUBSCRIBE_ERROR and TRACK_STATUS_ERROR codes."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    TRACK_DOES_NOT_EXIST = 0x4
    INVALID_RANGE = 0x5
    MALFORMED_AUTH_TOKEN = 0x10
    EXPIRED_AUTH_TOKEN = 0x12


class FetchErrorCode(IntEnum):
    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    TRACK_DOES_NOT_EXIST = 0x4
    INVALID_RANGE = 0x5
    NO_OBJECTS = 0x6
    INVALID_JOINING_REQUEST_ID = 0x7
    UNKNOWN_STATUS_IN_RANGE = 0x8
    MALFORMED_TRACK = 0x9
    MALFORMED_AUTH_TOKEN = 0x10
    EXPIRED_AUTH_TOKEN = 0x12


class PublishErrorCode(IntEnum):
    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    UNINTERESTED = 0x4


class PublishNamespaceErrorCode(IntEnum):
    """PUBLISH_NAMESPACE_ERROR and PUBLISH_NAMESPACE_CANCEL codes."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    UNINTERESTED = 0x4
    MALFORMED_AUTH_TOKEN = 0x10
    EXPIRED_AUTH_TOKEN = 0x12


class SubscribeNamespaceErrorCode(IntEnum):
    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    NAMESPACE_PREFIX_UNKNOWN = 0x4
    NAMESPACE_PREFIX_OVERLAP = 0x5
    MALFORMED_AUTH_TOKEN = 0x10
    EXPIRED_AUTH_TOKEN = 0x12


class RequestErrorCode(IntEnum):
    """REQUEST_ERROR codes (draft 16 on): one table for every request family."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    MALFORMED_AUTH_TOKEN = 0x4
    EXPIRED_AUTH_TOKEN = 0x5
    GOING_AWAY = 0x6  # draft 18
    EXCESSIVE_LOAD = 0x9  # draft 18
    DOES_NOT_EXIST = 0x10
    INVALID_RANGE = 0x11
    MALFORMED_TRACK = 0x12
    DUPLICATE_SUBSCRIPTION = 0x19
    UNINTERESTED = 0x20
    PREFIX_OVERLAP = 0x30
    NAMESPACE_TOO_LARGE = 0x31  # draft 18
    INVALID_JOINING_REQUEST_ID = 0x32
    UNSUPPORTED_EXTENSION = 0x33  # draft 18
    REDIRECT = 0x34  # draft 18: a Redirect (where to ask instead) follows the reason


_AUTH_RENUMBERED = {
    0x10: RequestErrorCode.MALFORMED_AUTH_TOKEN,
    0x12: RequestErrorCode.EXPIRED_AUTH_TOKEN,
}
SUBSCRIBE_RENUMBERED: dict[int, int] = {
    SubscribeErrorCode.TRACK_DOES_NOT_EXIST: RequestErrorCode.DOES_NOT_EXIST,
    SubscribeErrorCode.INVALID_RANGE: RequestErrorCode.INVALID_RANGE,
    **_AUTH_RENUMBERED,
}
"""Draft 14's SUBSCRIBE_ERROR (and TRACK_STATUS_ERROR) codes that REQUEST_ERROR numbers
otherwise; the codes below 4 are the same in both tables. So for each family below."""
FETCH_RENUMBERED: dict[int, int] = {
    FetchErrorCode.TRACK_DOES_NOT_EXIST: RequestErrorCode.DOES_NOT_EXIST,
    FetchErrorCode.INVALID_RANGE: RequestErrorCode.INVALID_RANGE,
    FetchErrorCode.NO_OBJECTS: RequestErrorCode.INVALID_RANGE,
    FetchErrorCode.INVALID_JOINING_REQUEST_ID: RequestErrorCode.INVALID_JOINING_REQUEST_ID,
    FetchErrorCode.UNKNOWN_STATUS_IN_RANGE: RequestErrorCode.INTERNAL_ERROR,
    FetchErrorCode.MALFORMED_TRACK: RequestErrorCode.MALFORMED_TRACK,
    **_AUTH_RENUMBERED,
}
PUBLISH_RENUMBERED: dict[int, int] = {PublishErrorCode.UNINTERESTED: RequestErrorCode.UNINTERESTED}
PUBLISH_NAMESPACE_RENUMBERED: dict[int, int] = {
    PublishNamespaceErrorCode.UNINTERESTED: RequestErrorCode.UNINTERESTED,
    **_AUTH_RENUMBERED,
}
SUBSCRIBE_NAMESPACE_RENUMBERED: dict[int, int] = {
    SubscribeNamespaceErrorCode.NAMESPACE_PREFIX_UNKNOWN: RequestErrorCode.DOES_NOT_EXIST,
    SubscribeNamespaceErrorCode.NAMESPACE_PREFIX_OVERLAP: RequestErrorCode.PREFIX_OVERLAP,
    **_AUTH_RENUMBERED,
}


def draft_14_code(renumbered: dict[int, int], code: int) -> int:
    """The draft-14 code of a family whose codes `renumbered` maps, for a draft-16 `code`:
    a code that moved maps back; one that did not is itself, unless draft 14 numbered
    something else so (then INTERNAL_ERROR, 0 in every table); unknown ones pass."""
    ours = next((old for old, new in renumbered.items() if new == code), None)
    if ours is not None:
        return ours
    return 0 if code in renumbered else code


class PublishDoneStatus(IntEnum):
    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TRACK_ENDED = 0x2
    SUBSCRIPTION_ENDED = 0x3
    GOING_AWAY = 0x4
    EXPIRED = 0x5
    TOO_FAR_BEHIND = 0x6
    MALFORMED_TRACK = 0x7


PUBLISH_DONE_RENUMBERED_16: dict[int, int] = {PublishDoneStatus.MALFORMED_TRACK: 0x12}
"""Draft 16 moved MALFORMED_TRACK to REQUEST_ERROR's number."""
PUBLISH_DONE_RENUMBERED_18: dict[int, int] = {
    **PUBLISH_DONE_RENUMBERED_16,
    PublishDoneStatus.EXPIRED: 0x6,
    PublishDoneStatus.TOO_FAR_BEHIND: 0x5,
}
"""Draft 18 swapped EXPIRED and TOO_FAR_BEHIND (to match the stream reset codes)."""


class StreamResetCode(IntEnum):
    """RESET_STREAM / STOP_SENDING codes on data streams."""

    INTERNAL_ERROR = 0x0
    CANCELLED = 0x1
    DELIVERY_TIMEOUT = 0x2
    SESSION_CLOSED = 0x3


class MoqtError(Exception):
    """Base of every exception the MoQT core raises on purpose."""


class NeedMoreData(MoqtError):
    """The input is a valid prefix but ends before the item does.

    ``needed`` is the buffer position the item needs to reach, when the item's length is known
    (a payload), so a stream parser can wait for that much instead of retrying on every packet.
    """

    def __init__(self, what: str, needed: int | None = None) -> None:
        super().__init__(what)
        self.needed = needed


class ProtocolError(MoqtError):
    """The peer violated the protocol; the session must close with ``code``."""

    def __init__(
        self, reason: str, code: SessionErrorCode = SessionErrorCode.PROTOCOL_VIOLATION
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class DecodeError(ProtocolError):
    """Bytes that can never become a valid item (as opposed to ``NeedMoreData``)."""


class ObjectTooLarge(DecodeError):
    """An object's declared payload exceeds the local cap.

    Legal on the wire, so it costs the stream, not the session.
    """


class UsageError(MoqtError):
    """The local caller asked for something the protocol or the session state forbids."""


class RequestLimitReached(UsageError):
    """The peer's MAX_REQUEST_ID does not allow another request yet.

    The session has told the peer with REQUESTS_BLOCKED; retry after a ``MaxRequestIdReceived``.
    """
