"""What a session needs of its QUIC connection, and the bounds it keeps against its peer:
shared by the session and the two halves of its data plane (``incoming``, ``outgoing``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .data import DEFAULT_MAX_OBJECT_PAYLOAD


class QuicConnectionLike(Protocol):
    """The part of aioquic's (and qh3's) ``QuicConnection`` the session uses."""

    def get_next_available_stream_id(self, is_unidirectional: bool = False) -> int: ...
    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None: ...
    def reset_stream(self, stream_id: int, error_code: int) -> None: ...
    def stop_stream(self, stream_id: int, error_code: int) -> None: ...
    def close(
        self, error_code: int = ..., frame_type: int | None = ..., reason_phrase: str = ...
    ) -> None: ...
    def send_datagram_frame(self, data: bytes) -> None: ...


@dataclass(slots=True)
class SessionLimits:
    """Bounds on what a peer can make the session hold."""

    # Requests the peer may have open at once; credit returns as they finish.
    request_window: int = 100
    max_object_payload: int = DEFAULT_MAX_OBJECT_PAYLOAD
    # Bytes of incomplete objects held across all incoming streams (QUIC flow control alone
    # would let every stream fill its own window).
    max_buffered_bytes: int = 256 * 1024 * 1024
    # Data streams that arrived before their track alias was known.
    max_pending_streams: int = 64
    max_pending_bytes: int = 64 * 1024 * 1024
    pending_stream_timeout: float = 5.0
    # How long a finished subscription keeps its alias for late streams.
    drain_timeout: float = 10.0
