"""What an application reads from a session (`api.Session`): objects of its subscriptions and
fetches, the namespaces announced under a prefix, each through an async iterator with a
bound on what waits unread; and the errors the API raises."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from sidecar.moqt.aio.quic_backend import MiB
from sidecar.moqt.protocol import events as ev
from sidecar.moqt.protocol.messages import UNKNOWN_STREAM_COUNT
from sidecar.moqt.protocol.model import FullTrackName, Location, ObjectStatus, has_prefix

if TYPE_CHECKING:
    from sidecar.moqt.aio.api import Session

T = TypeVar("T")

DEFAULT_RECEIVE_BUFFER = 256 * MiB


class MoqtApiError(Exception):
    """Base of the errors this API raises to applications."""


class RequestRefused(MoqtApiError):
    """The peer answered a request with *_ERROR."""

    def __init__(self, request: str, code: int, reason: str) -> None:
        super().__init__(f"{request} refused: {reason or 'no reason'} (code {code:#x})")
        self.request = request
        self.code = code
        self.reason = reason


class SessionGone(MoqtApiError, ConnectionError):
    """The session closed while a request or a stream of objects was still open."""


class FetchReset(MoqtApiError):
    """The peer reset a FETCH's data stream: its objects stop there, the session stays up.
    A relay does this when its upstream leaves in the middle of the fetch."""


class ReceiveOverflow(MoqtApiError):
    """The application read objects slower than they came and the buffer bound was reached."""


@dataclass(frozen=True, slots=True)
class Object:
    """One object as the application reads it."""

    group_id: int
    object_id: int
    payload: bytes
    extensions: bytes = b""
    status: ObjectStatus = ObjectStatus.NORMAL

    @property
    def location(self) -> Location:
        return Location(self.group_id, self.object_id)


@dataclass(frozen=True, slots=True)
class Announcement:
    """A namespace the peer announced (PUBLISH_NAMESPACE) or withdrew (PUBLISH_NAMESPACE_DONE)."""

    namespace: tuple[bytes, ...]
    published: bool


@dataclass(frozen=True, slots=True)
class TrackStatus:
    """TRACK_STATUS_OK: the newest object the publisher has (None: nothing yet)."""

    largest: Location | None


class Queue(Generic[T]):
    """What arrived for the application and waits to be read: an async iterator that stops
    once ended, and raises the error it failed with (dropping what was unread)."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._wakeup = asyncio.Event()
        self._error: BaseException | None = None
        self._ended = False

    def put(self, item: T) -> bool:
        """Queue an item; False if the queue refused it (and failed: see _ObjectQueue)."""
        self._items.append(item)
        self._wakeup.set()
        return True

    def end(self) -> None:
        self._ended = True
        self._wakeup.set()

    def fail(self, error: BaseException) -> None:
        if self._error is None and not self._ended:
            self._error = error
            self._items.clear()
        self._wakeup.set()

    @property
    def finished(self) -> bool:
        return self._ended or self._error is not None

    def take_ready(self) -> list[T]:
        """The items queued now, without waiting (an error or the end is for the iterator
        to raise)."""
        items = list(self._items)
        self._items.clear()
        return items

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        while not self._items:
            if self._error is not None:
                raise self._error
            if self._ended:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._items.popleft()


class _ObjectQueue(Queue[Object]):
    """Objects of one subscription or fetch, waiting for the application; bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__()
        self._bytes = 0
        self._max_bytes = max_bytes

    def put(self, item: Object) -> bool:
        """Queue an object; False (and the queue fails) when the bound is exceeded."""
        self._bytes += len(item.payload)
        if self._bytes > self._max_bytes:
            self.fail(ReceiveOverflow(f"more than {self._max_bytes} bytes unread"))
            return False
        return super().put(item)

    async def __anext__(self) -> Object:
        obj = await super().__anext__()
        self._bytes -= len(obj.payload)
        return obj


class Subscription(_ObjectQueue):
    """A SUBSCRIBE the peer accepted: iterate to read objects; ends after PUBLISH_DONE.

    The iteration ends once PUBLISH_DONE came and as many data streams as it counts have
    ended, so objects on streams that overtake nothing are never cut off.
    """

    def __init__(self, session: Session, request_id: int, track: FullTrackName) -> None:
        super().__init__(session.receive_buffer)
        self.session = session
        self.request_id = request_id
        self.track = track
        self.largest: Location | None = None
        self.done_status: int | None = None
        self._streams_open: set[int] = set()
        self._streams_ended = 0
        self._expected_streams: int | None = None

    async def unsubscribe(self) -> None:
        """Stop the subscription; objects already queued can still be read."""
        if not self.finished:
            self.session.cancel(self)
            self.end()

    def _object(self, event: ev.ObjectReceived) -> None:
        if event.stream_id is not None and event.stream_id not in self._streams_open:
            self._streams_open.add(event.stream_id)
        self.put(object_of(event))

    def _stream_over(self, stream_id: int) -> None:
        self._streams_open.discard(stream_id)
        self._streams_ended += 1
        self._maybe_end()

    def _publish_done(self, event: ev.SubscriptionEnded) -> None:
        self.done_status = event.message.status_code
        count = event.message.stream_count
        self._expected_streams = None if count == UNKNOWN_STREAM_COUNT else count
        self._maybe_end()

    def _maybe_end(self) -> None:
        if self.done_status is None or self._streams_open:
            return
        if self._expected_streams is None or self._streams_ended >= self._expected_streams:
            self.session.forget(self)
            self.end()


class FetchStream(_ObjectQueue):
    """A FETCH the peer accepted: iterate to read the objects; ends with the fetch stream."""

    def __init__(self, session: Session, request_id: int) -> None:
        super().__init__(session.receive_buffer)
        self.session = session
        self.request_id = request_id
        self.end_location: Location | None = None
        """FETCH_OK's End Location, in FETCH's encoding: the last object + 1 (0: whole group)."""

    async def cancel(self) -> None:
        if not self.finished:
            self.session.cancel(self)
            self.end()


class NamespaceSubscription(Queue[Announcement]):
    """A SUBSCRIBE_NAMESPACE the peer accepted: iterate to read the announcements of the
    namespaces under its prefix, those already published first; ends after `unsubscribe`.

    Not bounded in bytes like the object queues: announcements are small, and the peer (a
    relay) bounds how many namespaces it routes.
    """

    def __init__(self, session: Session, request_id: int, prefix: tuple[bytes, ...]) -> None:
        super().__init__()
        self.session = session
        self.request_id = request_id
        self.prefix = prefix

    def covers(self, namespace: tuple[bytes, ...]) -> bool:
        return has_prefix(namespace, self.prefix)

    async def unsubscribe(self) -> None:
        """UNSUBSCRIBE_NAMESPACE; announcements already queued can still be read."""
        if not self.finished:
            self.session.cancel(self)
            self.end()


def object_of(event: ev.ObjectReceived) -> Object:
    return Object(event.group_id, event.object_id, event.payload, event.extensions, event.status)
