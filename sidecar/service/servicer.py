"""The gRPC adapter of kvmoq.v1.KVCacheService over `KVService`.

Each RPC: a request id bound into structlog's context (every log line of the request
carries it; the caller's `x-request-id` metadata is kept when sent, and the id is returned
in trailing metadata), the request converted by `messages`, one call into the core, and
`RequestError`s mapped to the status codes the contract promises.
"""

from __future__ import annotations

import contextlib
import math
import re
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import structlog
import torch
from kvmoq_client.v1 import kv_cache_pb2 as pb
from kvmoq_client.v1 import kv_cache_pb2_grpc as pb_grpc

from sidecar.log import get_logger
from sidecar.service import messages
from sidecar.service.buffers import BufferSet
from sidecar.service.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RequestError,
    Unavailable,
)
from sidecar.service.kv_service import KVService, LoadOutcome
from sidecar.tensors.errors import HandleError, HandleUnavailable, InvalidHandle
from sidecar.tensors.handles import TensorHandle
from sidecar.transfer.resume import LoadBudget, within
from sidecar.transfer.subscriber import StopReason

log = get_logger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["KVCacheService"].full_name

_STATUS = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
}

_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")

_HANDLE_REFUSALS: dict[type[HandleError], type[RequestError]] = {
    InvalidHandle: InvalidArgument,
    HandleUnavailable: FailedPrecondition,
}
"""A handle that does not open: the model server sent something wrong, or this node
cannot open it (no GPU, device not visible): fix the node, not the call."""


class KVCacheServicer(pb_grpc.KVCacheServiceServicer):
    def __init__(self, service: KVService, open_handle: messages.HandleOpener) -> None:
        self.service = service
        self.open_handle = open_handle

    async def RegisterBuffers(
        self, request: pb.RegisterBuffersRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterBuffersResponse:
        async with _scope(context, "RegisterBuffers"):
            buffers = BufferSet(
                request.model,
                messages.layout(request.layout),
                messages.arrangement(request),
                [messages.buffer(b, self._open) for b in request.buffers],
            )
            return pb.RegisterBuffersResponse(buffer_set_id=self.service.register(buffers))

    async def UnregisterBuffers(
        self, request: pb.UnregisterBuffersRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterBuffersResponse:
        async with _scope(context, "UnregisterBuffers"):
            self.service.unregister(request.buffer_set_id)
            return pb.UnregisterBuffersResponse()

    async def Publish(
        self, request: pb.PublishRequest, context: grpc.aio.ServicerContext
    ) -> pb.PublishResponse:
        async with _scope(context, "Publish"):
            prompt = await self.service.publish(
                request.buffer_set_id,
                request.token_ids,
                messages.placement(request.source, "source"),
                request.tracks,
                request.default_track,
            )
            return messages.published(prompt)

    async def Lookup(
        self, request: pb.LookupRequest, context: grpc.aio.ServicerContext
    ) -> pb.LookupResponse:
        async with _scope(context, "Lookup"):
            found = await self.service.lookup(
                request.buffer_set_id, request.token_ids, _max_kl(request)
            )
            return messages.found(found)

    async def Load(
        self, request: pb.LoadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.LoadProgress]:
        async with _scope(context, "Load"):
            # aclosing: a client gone while a message is written must still end the load now
            events = contextlib.aclosing(
                self.service.load(
                    request.buffer_set_id,
                    request.token_ids,
                    messages.placement(request.destination, "destination"),
                    self._budget(request, context),
                    request.tracks,
                    request.held_tokens,
                    request.write_tokens,
                    _max_kl(request),
                )
            )
            async with events as progress:
                async for event in progress:
                    yield messages.progress(event)
                    if isinstance(event, LoadOutcome) and event.stop is StopReason.CANCELLED:
                        await context.abort(
                            grpc.StatusCode.CANCELLED,
                            f"the sidecar is shutting down; LoadFinished lists the"
                            f" {sum(map(len, event.loaded))} tokens written, compute the rest",
                        )

    def _open(self, handle: TensorHandle) -> torch.Tensor:
        try:
            return self.open_handle(handle)
        except HandleError as exc:
            refusal = next(r for e, r in _HANDLE_REFUSALS.items() if isinstance(exc, e))
            raise refusal(f"{type(handle).__name__} does not open: {exc}") from None

    def _budget(self, request: pb.LoadRequest, context: grpc.aio.ServicerContext) -> LoadBudget:
        """The load's one budget, from now: the earliest of the request's deadline and the
        call's gRPC deadline (else the sidecar's `load_seconds`), the request's wait for a
        lost relay session (else the sidecar's `relay_wait`), and the model server's compute
        rate where it gave one."""
        settings = self.service.settings
        bounds = []
        if request.HasField("deadline"):
            bounds.append(request.deadline.ToNanoseconds() / 1e9 - time.time())
        remaining = context.time_remaining()
        if remaining is not None:
            # A load planned to the call's deadline itself would race it and end in
            # DEADLINE_EXCEEDED with no word of what was written.
            bounds.append(within(remaining))
        relay_wait = settings.relay_wait
        if request.HasField("relay_wait"):
            relay_wait = request.relay_wait.ToNanoseconds() / 1e9
            if relay_wait < 0:
                raise InvalidArgument(f"relay_wait is {relay_wait:.3f} s: a wait is >= 0")
        rate = request.compute_tokens_per_second
        if not (math.isfinite(rate) and rate >= 0):
            raise InvalidArgument(
                f"compute_tokens_per_second is {rate}: a rate is finite and >= 0 (0: unknown)"
            )
        return LoadBudget.starting_now(
            min(bounds, default=settings.load_seconds), relay_wait, rate or None
        )


def _max_kl(request: pb.LoadRequest | pb.LookupRequest) -> float | None:
    """The request's quality floor; None (0 on the wire): the sidecar's. The service refuses
    a bound that is no bound (`TrackChoice`)."""
    return None if request.max_kl == 0 else request.max_kl


@asynccontextmanager
async def _scope(context: grpc.aio.ServicerContext, rpc: str) -> AsyncIterator[None]:
    """Request id in every log line; a refused request ends with its status and message."""
    sent = dict(context.invocation_metadata() or ()).get("x-request-id", "")
    request_id = sent if _REQUEST_ID.fullmatch(str(sent)) else secrets.token_hex(8)
    context.set_trailing_metadata((("x-request-id", request_id),))
    with structlog.contextvars.bound_contextvars(request_id=request_id, rpc=rpc):
        try:
            yield
        except RequestError as exc:
            code = _STATUS[type(exc)]
            log.info("request_refused", status=code.name, reason=str(exc))
            await context.abort(code, str(exc))
