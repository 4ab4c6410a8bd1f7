"""Every MoQT draft-14 control message, as a frozen dataclass with ``encode()``.

Framing is ``type (vi) | length (u16) | payload`` for every message (draft-14's ``Length (i)`` in
the PUBLISH diagrams is an editorial slip; peers use u16). ``decode_control`` parses one framed
message from the front of a buffer. Messages that share a layout share one class body
(``_SubscribeLayout`` for SUBSCRIBE and TRACK_STATUS, ``_RequestError`` for every *_ERROR ...),
so a layout is written once and the wire type is the only difference.

One module per message family; import from this package, which registers them all.
Decoded integers that name codes (error codes, statuses) stay plain ``int``: a peer may use codes
newer than our tables; the enums in ``errors`` name the ones we know.
"""

from __future__ import annotations

from .base import (
    _REGISTRY,
    DEFAULT_FILTER,
    DRAFT_14,
    MAX_GOAWAY_URI,
    MAX_MESSAGE_LENGTH,
    UNKNOWN_STREAM_COUNT,
    ControlMessage,
    FilterType,
    SubscriptionFilter,
    decode_control,
)
from .fetch import (
    Fetch,
    FetchCancel,
    FetchError,
    FetchOk,
    FetchType,
    JoiningFetch,
    StandaloneFetch,
    fetch_end,
)
from .namespace import (
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceError,
    PublishNamespaceOk,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    UnsubscribeNamespace,
)
from .parameters import NO_PARAMETERS, NO_SETUP_PARAMETERS, Parameters, SetupParameters
from .publish import Publish, PublishError, PublishOk
from .setup import ClientSetup, Goaway, MaxRequestId, RequestsBlocked, ServerSetup
from .subscribe import (
    PublishDone,
    Subscribe,
    SubscribeError,
    SubscribeOk,
    SubscribeUpdate,
    Unsubscribe,
)
from .track_status import TrackStatus, TrackStatusError, TrackStatusOk

ALL_MESSAGE_TYPES: tuple[type[ControlMessage], ...] = tuple(_REGISTRY.values())

REQUEST_OF_OK: dict[type[ControlMessage], type[ControlMessage]] = {
    SubscribeOk: Subscribe,
    PublishOk: Publish,
    FetchOk: Fetch,
    TrackStatusOk: TrackStatus,
    PublishNamespaceOk: PublishNamespace,
    SubscribeNamespaceOk: SubscribeNamespace,
}
"""The request each *_OK answers."""
REQUEST_OF_ERROR: dict[type[ControlMessage], type[ControlMessage]] = {
    SubscribeError: Subscribe,
    PublishError: Publish,
    FetchError: Fetch,
    TrackStatusError: TrackStatus,
    PublishNamespaceError: PublishNamespace,
    SubscribeNamespaceError: SubscribeNamespace,
}
"""The request each *_ERROR refuses."""
ERROR_OF_REQUEST = {request: error for error, request in REQUEST_OF_ERROR.items()}
"""The *_ERROR that refuses each request."""

__all__ = [
    "ALL_MESSAGE_TYPES",
    "DEFAULT_FILTER",
    "DRAFT_14",
    "ERROR_OF_REQUEST",
    "MAX_GOAWAY_URI",
    "MAX_MESSAGE_LENGTH",
    "NO_PARAMETERS",
    "NO_SETUP_PARAMETERS",
    "REQUEST_OF_ERROR",
    "REQUEST_OF_OK",
    "UNKNOWN_STREAM_COUNT",
    "ClientSetup",
    "ControlMessage",
    "Fetch",
    "FetchCancel",
    "FetchError",
    "FetchOk",
    "FetchType",
    "FilterType",
    "Goaway",
    "JoiningFetch",
    "MaxRequestId",
    "Parameters",
    "Publish",
    "PublishDone",
    "PublishError",
    "PublishNamespace",
    "PublishNamespaceCancel",
    "PublishNamespaceDone",
    "PublishNamespaceError",
    "PublishNamespaceOk",
    "PublishOk",
    "RequestsBlocked",
    "ServerSetup",
    "SetupParameters",
    "StandaloneFetch",
    "Subscribe",
    "SubscribeError",
    "SubscribeNamespace",
    "SubscribeNamespaceError",
    "SubscribeNamespaceOk",
    "SubscribeOk",
    "SubscribeUpdate",
    "SubscriptionFilter",
    "TrackStatus",
    "TrackStatusError",
    "TrackStatusOk",
    "Unsubscribe",
    "UnsubscribeNamespace",
    "decode_control",
    "fetch_end",
]
