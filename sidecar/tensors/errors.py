"""Why a tensor handle cannot be opened, split by who must act.

Handles come from another process over a socket, so every field is checked before anything
is mapped; the caller (the gRPC servicer) turns `InvalidHandle` into INVALID_ARGUMENT (the
model server sent something wrong) and `HandleUnavailable` into FAILED_PRECONDITION (this
node cannot open it: no GPU, device not visible, memory short).
"""

from __future__ import annotations


class HandleError(Exception):
    """Base of every refusal to open a tensor handle."""


class InvalidHandle(HandleError):
    """The handle contradicts itself or the memory it names (bounds, dtype, path, stride)."""


class HandleUnavailable(HandleError):
    """The handle is well formed but this process cannot open it now."""
