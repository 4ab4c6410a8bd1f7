"""The sidecar's refusals as exceptions a model server can catch by meaning.

A model server decides differently per kind: a bad request is a bug to log, a sidecar that
is unavailable or past the deadline means "compute the KV yourself". gRPC status codes are
mapped once here so no caller matches on `grpc.StatusCode`.
"""

from __future__ import annotations

import grpc


class SidecarError(Exception):
    """A call to the sidecar failed; `code` is the gRPC status, `details` its message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class InvalidArgument(SidecarError):
    """The request contradicts itself or the registered buffers: fix the caller."""


class NotFound(SidecarError):
    """The request names a buffer set the sidecar does not hold (e.g. after a restart)."""


class FailedPrecondition(SidecarError):
    """Well formed, but not now: e.g. unregistering a buffer set a load still writes into."""


class DeadlineExceeded(SidecarError):
    """The call's deadline passed: compute the KV instead of waiting for it."""


class Unavailable(SidecarError):
    """No sidecar answers, or it is draining: compute the KV, or retry on another one."""


class Cancelled(SidecarError):
    """The call was cancelled, by this client or by the sidecar shutting down."""


_BY_CODE: dict[grpc.StatusCode, type[SidecarError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def from_rpc_error(error: grpc.RpcError) -> SidecarError:
    """The typed exception for a failed call (sync `grpc.RpcError` or `grpc.aio.AioRpcError`)."""
    code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
    details: str = error.details() or ""  # type: ignore[attr-defined]
    return _BY_CODE.get(code, SidecarError)(code, details)
