"""Every MoQT control message, as a frozen dataclass with ``encode(draft)``.

Framing is ``type (vi) | length (u16) | payload`` for every message (draft-14's ``Length (i)`` in
the PUBLISH diagrams is an editorial slip; peers use u16). ``decode_control`` parses one framed
message from the front of a buffer, as a draft has it. Messages that share a layout share one
class body (``_SubscribeLayout`` for SUBSCRIBE and TRACK_STATUS, ``_RequestError`` for every
*_ERROR ...), so a layout is written once and the wire type is the only difference. The
classes are draft 14's messages; what a later draft does differently to a family is written
in that family's module, reading the `drafts.Draft` it encodes for (`replies` holds draft
16's REQUEST_OK and REQUEST_ERROR, which stand in for draft 14's per-family replies).

One module per message family; import from this package, which registers them all.
Decoded integers that name codes (error codes, statuses) stay plain ``int``: a peer may use codes
newer than our tables; the enums in ``errors`` name the ones we know.
"""

from __future__ import annotations

from .base import (
    _REGISTRY,
    DEFAULT_FILTER,
    MAX_GOAWAY_URI,
    MAX_MESSAGE_LENGTH,
    ON_STREAM,
    UNKNOWN_STREAM_COUNT,
    ControlMessage,
    FilterType,
    RequestError,
    RequestOk,
    SubscriptionFilter,
    decode_buffered,
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
    Namespace,
    NamespaceDone,
    NamespaceOptions,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceError,
    PublishNamespaceOk,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeTracks,
    UnsubscribeNamespace,
)
from .parameters import NO_PARAMETERS, NO_SETUP_PARAMETERS, Parameters, SetupParameters
from .publish import Publish, PublishError, PublishOk
from .replies import (
    ERROR_OF_REQUEST,
    REQUEST_OF_ERROR,
    REQUEST_OF_OK,
    family_reply,
)
from .setup import ClientSetup, Goaway, MaxRequestId, RequestsBlocked, ServerSetup, Setup
from .subscribe import (
    PublishDone,
    Subscribe,
    SubscribeError,
    SubscribeOk,
    SubscribeUpdate,
    Unsubscribe,
)
from .track_status import TrackStatus, TrackStatusError, TrackStatusOk

ALL_MESSAGE_TYPES: tuple[type[ControlMessage], ...] = tuple(
    {cls: None for table in _REGISTRY.values() for cls in table.values()}
)
"""Every message class of every draft."""

__all__ = [
    "ALL_MESSAGE_TYPES",
    "DEFAULT_FILTER",
    "ERROR_OF_REQUEST",
    "MAX_GOAWAY_URI",
    "MAX_MESSAGE_LENGTH",
    "NO_PARAMETERS",
    "NO_SETUP_PARAMETERS",
    "ON_STREAM",
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
    "Namespace",
    "NamespaceDone",
    "NamespaceOptions",
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
    "RequestError",
    "RequestOk",
    "RequestsBlocked",
    "ServerSetup",
    "Setup",
    "SetupParameters",
    "StandaloneFetch",
    "Subscribe",
    "SubscribeError",
    "SubscribeNamespace",
    "SubscribeNamespaceError",
    "SubscribeNamespaceOk",
    "SubscribeOk",
    "SubscribeTracks",
    "SubscribeUpdate",
    "SubscriptionFilter",
    "TrackStatus",
    "TrackStatusError",
    "TrackStatusOk",
    "Unsubscribe",
    "UnsubscribeNamespace",
    "decode_buffered",
    "decode_control",
    "family_reply",
    "fetch_end",
]
