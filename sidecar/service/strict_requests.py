"""gRPC services whose requests that do not parse are refused with INVALID_ARGUMENT.

grpcio parses a request before the method runs, and when the bytes are not a valid message
of the method's type it ends the call with UNKNOWN ("Unexpected DecodeError"): a client bug
that reads like a server fault. Here a service's methods take the raw bytes and parse them
themselves, so such a request gets INVALID_ARGUMENT naming the message type it should have
been, and the method never sees it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

MAX_REQUEST_BYTES = 16 << 20
"""The largest request the server takes (grpc.max_receive_message_length): far above a
Load of the most tokens a request may hold, far below what would strain the sidecar."""

SERVER_OPTIONS = (("grpc.max_receive_message_length", MAX_REQUEST_BYTES),)


class _Capture:
    """Stands in for a server while generated code registers a service: keeps its handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}
        self.service = ""

    def add_generic_rpc_handlers(self, _: Any) -> None:
        pass

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.service, self.handlers = service, handlers


def add_strict_service(
    register: Callable[[Any, Any], None], servicer: Any, server: grpc.aio.Server
) -> None:
    """``register(servicer, server)`` (a generated ``add_*Servicer_to_server``), with every
    method parsing its own request."""
    capture = _Capture()
    register(servicer, capture)
    handlers = {name: _strict(h) for name, h in capture.handlers.items()}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(capture.service, handlers),)
    )
    server.add_registered_method_handlers(capture.service, handlers)


def _strict(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    parse = handler.request_deserializer
    assert parse is not None and not handler.request_streaming
    serialize = handler.response_serializer
    kind = getattr(parse, "__self__", None)  # FromString's message class
    type_name = kind.DESCRIPTOR.full_name if kind is not None else "request"

    async def parsed(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            return parse(raw)
        except DecodeError:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {type_name}"
            )

    if handler.response_streaming:
        stream = handler.unary_stream
        assert stream is not None

        async def streaming(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for reply in stream(await parsed(raw, context), context):
                yield reply

        return grpc.unary_stream_rpc_method_handler(streaming, response_serializer=serialize)
    unary = handler.unary_unary
    assert unary is not None

    async def single(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        return await unary(await parsed(raw, context), context)

    return grpc.unary_unary_rpc_method_handler(single, response_serializer=serialize)
