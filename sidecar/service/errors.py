"""Why the sidecar refuses a request, as exceptions the gRPC adapter maps to status codes.

The cores raise these with a message that tells the caller what to fix; only
`servicer` knows which gRPC status each one becomes.
"""

from __future__ import annotations


class RequestError(Exception):
    """A request the sidecar refuses; the subclass names the kind of refusal."""


class InvalidArgument(RequestError):
    """The request contradicts itself or the buffer set (shape, range, limits)."""


class NotFound(RequestError):
    """The request names something the sidecar does not hold (a buffer set)."""


class FailedPrecondition(RequestError):
    """The request is well formed but the state does not allow it now."""


class DeadlineExceeded(RequestError):
    """The request's deadline passed before any work could start."""


class Unavailable(RequestError):
    """The sidecar is draining and takes no new work; retry on another one."""
