"""What a ``MoqtSession`` reports upward, as frozen dataclasses (like aioquic's events).

Requests from the peer carry the decoded message, so the application sees every field without
the session copying them into parallel classes; it answers with the session's reply methods
(``subscribe_ok``, ``reject`` ...). Replies to our own requests come as ``RequestAccepted`` or
``RequestRejected`` holding the reply message, whose type says which request it answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .data import ObjectBody
from .drafts import Draft
from .messages import (
    Fetch,
    FetchError,
    FetchOk,
    Publish,
    PublishDone,
    PublishError,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceError,
    PublishNamespaceOk,
    PublishOk,
    SetupParameters,
    Subscribe,
    SubscribeError,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeOk,
    SubscribeUpdate,
    TrackStatus,
    TrackStatusError,
    TrackStatusOk,
)
from .model import FullTrackName, ObjectStatus


class MoqtEvent:
    """Base class of session events."""


@dataclass(frozen=True, slots=True)
class SetupCompleted(MoqtEvent):
    """Both SETUP messages were exchanged; requests may flow. ``parameters`` are the peer's."""

    draft: Draft
    parameters: SetupParameters


@dataclass(frozen=True, slots=True)
class SessionClosed(MoqtEvent):
    """The session is over: the peer closed, QUIC failed, or we closed on a violation."""

    error_code: int
    reason: str
    by_peer: bool


@dataclass(frozen=True, slots=True)
class GoawayReceived(MoqtEvent):
    new_session_uri: bytes


@dataclass(frozen=True, slots=True)
class MaxRequestIdReceived(MoqtEvent):
    """The peer raised our request limit; requests refused with ``RequestLimitReached`` may retry."""

    limit: int


@dataclass(frozen=True, slots=True)
class RequestsBlockedReceived(MoqtEvent):
    limit: int


# Requests from the peer. Each needs exactly one answer, except the update and the withdrawals.


@dataclass(frozen=True, slots=True)
class SubscribeRequested(MoqtEvent):
    """Answer with ``subscribe_ok`` or ``reject``."""

    message: Subscribe


@dataclass(frozen=True, slots=True)
class SubscribeUpdated(MoqtEvent):
    message: SubscribeUpdate


@dataclass(frozen=True, slots=True)
class Unsubscribed(MoqtEvent):
    """The peer ended its subscription ``request_id`` (a SUBSCRIBE of theirs or a PUBLISH of ours)."""

    request_id: int


@dataclass(frozen=True, slots=True)
class FetchRequested(MoqtEvent):
    """Answer with ``fetch_ok`` then a fetch stream, or ``reject``.

    ``track`` is resolved by the session for joining fetches (from the joined subscription).
    """

    message: Fetch
    track: FullTrackName


@dataclass(frozen=True, slots=True)
class FetchCancelled(MoqtEvent):
    request_id: int


@dataclass(frozen=True, slots=True)
class PublishRequested(MoqtEvent):
    """The peer offers a track. Its objects may arrive already; answer ``publish_ok`` or ``reject``."""

    message: Publish


@dataclass(frozen=True, slots=True)
class TrackStatusRequested(MoqtEvent):
    """Answer with ``track_status_ok`` or ``reject``."""

    message: TrackStatus


@dataclass(frozen=True, slots=True)
class NamespacePublished(MoqtEvent):
    """Answer with ``publish_namespace_ok`` or ``reject``."""

    message: PublishNamespace


@dataclass(frozen=True, slots=True)
class NamespaceAnnounced(MoqtEvent):
    """A namespace subscription of ours heard of a namespace (draft 16's NAMESPACE, which,
    unlike draft 14's PUBLISH_NAMESPACE, is not answered)."""

    namespace: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class NamespacePublishDone(MoqtEvent):
    """The peer withdrew a namespace it published."""

    namespace: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class NamespacePublishCancelled(MoqtEvent):
    """The peer no longer accepts a namespace we published."""

    message: PublishNamespaceCancel


@dataclass(frozen=True, slots=True)
class NamespaceSubscribeRequested(MoqtEvent):
    """Answer with ``subscribe_namespace_ok`` or ``reject``. The prefix may be empty (moq-rs)."""

    message: SubscribeNamespace


@dataclass(frozen=True, slots=True)
class NamespaceUnsubscribed(MoqtEvent):
    prefix: tuple[bytes, ...]


# Replies to our requests.

OkReply = (
    SubscribeOk | PublishOk | FetchOk | TrackStatusOk | PublishNamespaceOk | SubscribeNamespaceOk
)
ErrorReply = (
    SubscribeError
    | PublishError
    | FetchError
    | TrackStatusError
    | PublishNamespaceError
    | SubscribeNamespaceError
)


@dataclass(frozen=True, slots=True)
class RequestAccepted(MoqtEvent):
    request_id: int
    message: OkReply


@dataclass(frozen=True, slots=True)
class RequestRejected(MoqtEvent):
    request_id: int
    message: ErrorReply


@dataclass(frozen=True, slots=True)
class SubscriptionEnded(MoqtEvent):
    """The publisher sent PUBLISH_DONE for our subscription (or for a PUBLISH it made)."""

    request_id: int
    message: PublishDone


# Data.


class ObjectSource(Enum):
    SUBGROUP = "subgroup"
    FETCH = "fetch"
    DATAGRAM = "datagram"


@dataclass(frozen=True, slots=True)
class ObjectReceived(MoqtEvent):
    """One complete object. ``request_id`` is the subscription (or fetch) it belongs to.

    ``subgroup_id`` is None for datagrams; ``stream_id`` is None for datagrams.
    ``end_of_group`` is set only by a datagram's flag (streams report it in ``DataStreamEnded``).
    """

    request_id: int
    source: ObjectSource
    group_id: int
    subgroup_id: int | None
    object_id: int
    publisher_priority: int
    body: ObjectBody
    stream_id: int | None = None
    track_alias: int | None = None
    end_of_group: bool = False

    @property
    def payload(self) -> bytes:
        return self.body.payload

    @property
    def status(self) -> ObjectStatus:
        return self.body.status

    @property
    def extensions(self) -> bytes:
        return self.body.extensions


@dataclass(frozen=True, slots=True)
class DataStreamEnded(MoqtEvent):
    """A subgroup or fetch stream ended with FIN after its last object.

    ``end_of_group`` is the subgroup header's flag: that last object ended the group.
    """

    stream_id: int
    request_id: int
    source: ObjectSource
    group_id: int | None = None
    end_of_group: bool = False


@dataclass(frozen=True, slots=True)
class DataStreamReset(MoqtEvent):
    """An incoming data stream was reset by the peer: its group may be incomplete."""

    stream_id: int
    request_id: int
    error_code: int


@dataclass(frozen=True, slots=True)
class DataStreamStopped(MoqtEvent):
    """The peer asked us to stop sending on one of our data streams; the session reset it."""

    stream_id: int
    request_id: int
    error_code: int
