"""The application's half of a MoQT session: the requests it makes (SUBSCRIBE, FETCH,
PUBLISH, ...) and its answers to the peer's (SUBSCRIBE_OK, REQUEST_ERROR, PUBLISH_DONE, ...).

`MoqtSession` is a `Requests`: these methods are its own, kept apart from the session's
handling of what arrives (`session.py`). Each builds draft 14's semantic message; where it
travels and how each draft writes it is the session's `_send` (`request_streams.route`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .drafts import Draft
from .errors import UsageError
from .messages import (
    DEFAULT_FILTER,
    ERROR_OF_REQUEST,
    NO_PARAMETERS,
    ControlMessage,
    Fetch,
    FetchCancel,
    FetchOk,
    Goaway,
    JoiningFetch,
    Parameters,
    Publish,
    PublishDone,
    PublishOk,
    StandaloneFetch,
    Subscribe,
    SubscribeOk,
    SubscribeUpdate,
    SubscriptionFilter,
    TrackStatus,
    TrackStatusOk,
    Unsubscribe,
)
from .model import FullTrackName, GroupOrder, Location

if TYPE_CHECKING:
    from .incoming import Incoming
    from .outgoing import Outgoing


class SessionPart:
    """What the session's halves (`Requests`, `session_namespaces.NamespaceRequests`) use
    of the session itself, which `MoqtSession` defines."""

    draft: Draft
    is_client: bool

    def _next_id(self) -> int: ...
    def _request(self, message: Any, expects_reply: bool = True) -> int: ...
    def _send(self, message: ControlMessage) -> None: ...
    def _reply(self, message: Any) -> None: ...
    def _answerable(self, request_id: int, request_type: type[ControlMessage]) -> Any: ...
    def _finish_peer_request(self, request_id: int) -> None: ...


class Requests(SessionPart):
    """See the module docstring; the attributes below are the session's."""

    objects: Outgoing
    _incoming: Incoming

    def subscribe(
        self,
        track: FullTrackName,
        *,
        filter: SubscriptionFilter = DEFAULT_FILTER,
        subscriber_priority: int = 128,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        forward: bool = True,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        if self._incoming.subscribed(track):
            raise UsageError(f"already subscribed to {track}")
        request_id = self._request(
            Subscribe(
                self._next_id(),
                track,
                subscriber_priority,
                group_order,
                forward,
                filter,
                parameters,
            )
        )
        self._incoming.subscribe(request_id, track)
        return request_id

    def subscribe_update(
        self,
        subscription_request_id: int,
        start: Location,
        end_group: int | None = None,
        *,
        subscriber_priority: int = 128,
        forward: bool = True,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        if not self._incoming.has(subscription_request_id):
            raise UsageError(f"no subscription {subscription_request_id}")
        update = SubscribeUpdate(
            self._next_id(),
            subscription_request_id,
            start,
            end_group,
            subscriber_priority,
            forward,
            parameters,
        )
        # Draft 16 answers an update (REQUEST_OK); draft 14 does not.
        return self._request(update, expects_reply=self.draft.request_replies)

    def unsubscribe(self, request_id: int) -> None:
        """End our subscription (or one the peer made with PUBLISH); late objects are dropped."""
        self._incoming.unsubscribe(request_id, self._now)
        self._send(Unsubscribe(request_id))

    def fetch(
        self,
        target: StandaloneFetch | JoiningFetch,
        *,
        subscriber_priority: int = 128,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        if isinstance(target, JoiningFetch) and not self._incoming.has(target.joining_request_id):
            raise UsageError(f"no subscription {target.joining_request_id} to join")
        request_id = self._request(
            Fetch(self._next_id(), target, subscriber_priority, group_order, parameters)
        )
        self._incoming.fetch(request_id, group_order == GroupOrder.DESCENDING)
        return request_id

    def fetch_cancel(self, request_id: int) -> None:
        self._incoming.cancel_fetch(request_id)
        self._send(FetchCancel(request_id))

    def publish(
        self,
        track: FullTrackName,
        *,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        largest: Location | None = None,
        forward: bool = True,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        """Offer a track to the peer; objects may be sent right away with the returned id."""
        request_id = self._next_id()
        alias = self.objects.add_track(request_id, track)
        try:
            self._request(
                Publish(request_id, track, alias, group_order, largest, forward, parameters)
            )
        except UsageError:
            self.objects.drop_track(request_id)
            raise
        return request_id

    def track_status(
        self,
        track: FullTrackName,
        *,
        filter: SubscriptionFilter = DEFAULT_FILTER,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        return self._request(
            TrackStatus(self._next_id(), track, 128, GroupOrder.ASCENDING, True, filter, parameters)
        )

    def goaway(self, new_session_uri: bytes = b"") -> None:
        if self.is_client and new_session_uri:
            raise UsageError("only a server may name a new session URI")
        self._send(Goaway(new_session_uri))

    # Answers to the peer's requests.

    def subscribe_ok(
        self,
        request_id: int,
        *,
        expires: int = 0,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        largest: Location | None = None,
        parameters: Parameters = NO_PARAMETERS,
    ) -> int:
        """Accept a SUBSCRIBE; returns the track alias we chose for it."""
        request = self._answerable(request_id, Subscribe)
        alias = self.objects.add_track(request_id, request.track)
        try:
            self._reply(SubscribeOk(request_id, alias, expires, group_order, largest, parameters))
        except UsageError:
            self.objects.drop_track(request_id)
            raise
        return alias

    def publish_ok(
        self,
        request_id: int,
        *,
        forward: bool = True,
        subscriber_priority: int = 128,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        filter: SubscriptionFilter = DEFAULT_FILTER,
        parameters: Parameters = NO_PARAMETERS,
    ) -> None:
        self._answerable(request_id, Publish)
        self._reply(
            PublishOk(request_id, forward, subscriber_priority, group_order, filter, parameters)
        )

    def fetch_ok(
        self,
        request_id: int,
        end: Location,
        *,
        end_of_track: bool = False,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        parameters: Parameters = NO_PARAMETERS,
    ) -> None:
        self._answerable(request_id, Fetch)
        self._reply(FetchOk(request_id, end, end_of_track, group_order, parameters))

    def track_status_ok(
        self,
        request_id: int,
        *,
        largest: Location | None = None,
        group_order: GroupOrder = GroupOrder.ASCENDING,
        expires: int = 0,
        parameters: Parameters = NO_PARAMETERS,
    ) -> None:
        self._answerable(request_id, TrackStatus)
        self._reply(TrackStatusOk(request_id, 0, expires, group_order, largest, parameters))
        self._finish_peer_request(request_id)

    def reject(self, request_id: int, error_code: int, reason: str = "") -> None:
        """Refuse any open request of the peer with the *_ERROR message of its family."""
        request = self._answerable(request_id, ControlMessage)
        self._reply(ERROR_OF_REQUEST[type(request)](request_id, error_code, reason))
        if isinstance(request, Publish):
            self._incoming.forget(request_id)
        self._finish_peer_request(request_id)

    def publish_done(self, request_id: int, status_code: int, reason: str = "") -> None:
        """End a track we publish (the peer's subscription, or our PUBLISH)."""
        track = self.objects.track(request_id)
        self._send(PublishDone(request_id, status_code, track.streams_opened, reason))
        self.objects.drop_track(request_id)
        self._finish_peer_request(request_id)
