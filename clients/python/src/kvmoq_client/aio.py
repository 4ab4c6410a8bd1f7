"""The asyncio client: what an async model server (an SGLang or vLLM frontend) awaits."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self, TypeVar

import grpc
import grpc.aio

from kvmoq_client.client import CHANNEL_OPTIONS, DEFAULT_TARGET
from kvmoq_client.errors import SidecarError, from_rpc_error
from kvmoq_client.requests import (
    load_call_timeout,
    load_request,
    lookup_request,
    no_finish,
    publish_request,
)
from kvmoq_client.v1 import kv_cache_pb2, kv_cache_pb2_grpc

_Reply = TypeVar("_Reply")


class AsyncLoad:
    """A running Load: `async for` each `ChunkLoaded`; `finished` once the stream ends."""

    def __init__(self, call: grpc.aio.UnaryStreamCall, buffer_set_id: str) -> None:
        self._call = call
        self._buffer_set_id = buffer_set_id
        self.finished: kv_cache_pb2.LoadFinished | None = None

    async def __aiter__(self) -> AsyncIterator[kv_cache_pb2.ChunkLoaded]:
        try:
            async for progress in self._call:
                if progress.HasField("finished"):
                    self.finished = progress.finished
                else:
                    yield progress.chunk_loaded
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        if self.finished is None:
            raise SidecarError(grpc.StatusCode.UNKNOWN, no_finish(self._buffer_set_id))

    async def wait(self) -> kv_cache_pb2.LoadFinished:
        """Drain the progress and return the outcome."""
        async for _ in self:
            pass
        assert self.finished is not None  # __aiter__ raised otherwise
        return self.finished

    def cancel(self) -> None:
        """Stop the load; tokens already reported stay written, nothing else is touched."""
        self._call.cancel()


class AsyncKVCacheClient:
    """The asyncio twin of `KVCacheClient`: same calls, same exceptions, awaitable."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float | None = None,
        wait_for_ready: bool = False,
    ) -> None:
        self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = kv_cache_pb2_grpc.KVCacheServiceStub(self._channel)
        self._timeout = timeout
        self._wait_for_ready = wait_for_ready

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _unary(
        self,
        method: Callable[..., Awaitable[_Reply]],
        request: object,
        *,
        wait_for_ready: bool | None = None,
    ) -> _Reply:
        """`wait_for_ready`: this call's, else the client's."""
        ready = self._wait_for_ready if wait_for_ready is None else wait_for_ready
        try:
            return await method(request, timeout=self._timeout, wait_for_ready=ready)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    async def register_buffers(self, request: kv_cache_pb2.RegisterBuffersRequest) -> str:
        """Hand the sidecar a model's KV buffers; returns the buffer set id for later calls."""
        return (await self._unary(self._stub.RegisterBuffers, request)).buffer_set_id

    async def unregister_buffers(self, buffer_set_id: str) -> None:
        """Once this returns the sidecar holds no view of the buffers: they may be freed.

        Never waits for a sidecar that is not up (whatever `wait_for_ready` says): one that
        is gone holds no views, and a process shutting down must not hang on it."""
        request = kv_cache_pb2.UnregisterBuffersRequest(buffer_set_id=buffer_set_id)
        await self._unary(self._stub.UnregisterBuffers, request, wait_for_ready=False)

    async def publish(
        self,
        buffer_set_id: str,
        token_ids: Sequence[int],
        source: kv_cache_pb2.KVLocation,
        *,
        tracks: Sequence[str] = (),
        default_track: str = "",
    ) -> kv_cache_pb2.PublishResponse:
        """Publish the KV of `token_ids` read from `source`; the slots are free again on return."""
        request = publish_request(buffer_set_id, token_ids, source, tracks, default_track)
        return await self._unary(self._stub.Publish, request)

    async def lookup(
        self, buffer_set_id: str, token_ids: Sequence[int], *, max_kl: float | None = None
    ) -> kv_cache_pb2.LookupResponse:
        """What a load would find (see `KVCacheClient.lookup`)."""
        request = lookup_request(buffer_set_id, token_ids, max_kl)
        return await self._unary(self._stub.Lookup, request)

    def load(
        self,
        buffer_set_id: str,
        token_ids: Sequence[int],
        destination: kv_cache_pb2.KVLocation,
        *,
        tracks: Sequence[str] = (),
        timeout: float | None = None,
        held_tokens: int = 0,
        relay_wait: float | None = None,
        write_tokens: int = 0,
        max_kl: float | None = None,
        compute_tokens_per_second: float | None = None,
        deadline: float | None = None,
    ) -> AsyncLoad:
        """Start loading the longest available prefix into `destination` (see `KVCacheClient.load`)."""
        request = load_request(
            buffer_set_id, token_ids, destination, tracks, held_tokens, relay_wait, write_tokens,
            max_kl, compute_tokens_per_second, deadline,
        )  # fmt: skip
        call = self._stub.Load(
            request,
            timeout=load_call_timeout(timeout, deadline, self._timeout),
            wait_for_ready=self._wait_for_ready,
        )
        return AsyncLoad(call, buffer_set_id)
