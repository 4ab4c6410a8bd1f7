"""Shared-memory KV buffers registered with the sidecar, for as long as the sidecar lives.

A sidecar that restarts forgets its buffer sets (NOT_FOUND), and one that is down refuses
every call (UNAVAILABLE); vLLM must run on either way. So a registration is made on first
use, made again when the sidecar says it does not know it, and a call that still fails
raises the client's `SidecarError` for the caller to count as a miss.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

from kvmoq_client.buffers import KVBuffers
from kvmoq_client.client import KVCacheClient
from kvmoq_client.errors import NotFound, SidecarError

_Result = TypeVar("_Result")


class Registration:
    def __init__(self, client: KVCacheClient, buffers: KVBuffers, model: str) -> None:
        self.client = client
        self.buffers = buffers
        self.model = model
        self._set_id: str | None = None
        self._lock = threading.Lock()
        # vLLM does not always call the connector's shutdown (an engine process ending on a
        # signal): the buffers' file goes at interpreter exit all the same.
        self._remove_file = weakref.finalize(self, buffers.close)

    def call(self, method: Callable[[str], _Result]) -> _Result:
        """`method(buffer_set_id)`, registering first if needed and once more after a
        NOT_FOUND (the sidecar restarted)."""
        try:
            return method(self._registered())
        except NotFound:
            self._forget()
            return method(self._registered())

    def _registered(self) -> str:
        with self._lock:
            if self._set_id is None:
                request = self.buffers.register_request(self.model)
                self._set_id = self.client.register_buffers(request)
            return self._set_id

    def _forget(self) -> None:
        with self._lock:
            self._set_id = None

    def close(self) -> None:
        """Unregister (best effort: the sidecar may be gone) and remove the buffers' file."""
        with self._lock:
            set_id, self._set_id = self._set_id, None
        if set_id is not None:
            with contextlib.suppress(SidecarError):  # shutting down; the sidecar may be gone
                self.client.unregister_buffers(set_id)
        self._remove_file()
        self.client.close()
