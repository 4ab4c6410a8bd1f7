"""The blocking client: what a threaded model server (vLLM worker, HF script) calls."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import grpc

from kvmoq_client._closing import ClosesOnExit
from kvmoq_client.errors import SidecarError, from_rpc_error
from kvmoq_client.requests import (
    load_call_timeout,
    load_request,
    lookup_request,
    no_finish,
    publish_request,
)
from kvmoq_client.v1 import kv_cache_pb2, kv_cache_pb2_grpc

DEFAULT_TARGET = "unix:///run/kvmoq/sidecar.sock"
"""Where the sidecar listens in the pod (the socket lives in a volume both containers mount)."""

RECONNECT_WITHIN_S = 1.0
"""The sidecar is local: after it restarts (a container restart), calls find it again within
this long, instead of failing through gRPC's default backoff (up to 120 s between tries)."""
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", int(RECONNECT_WITHIN_S * 1000)),
)

_Reply = TypeVar("_Reply")


class Load:
    """A running Load: iterate to get each `ChunkLoaded` as its tokens land in the buffers.

    Once iteration ends, `finished` says which tokens were loaded and how many the model
    server must compute itself. A failed call raises a `SidecarError` from the iteration.
    """

    def __init__(self, call: grpc.Call, buffer_set_id: str) -> None:
        self._call = call
        self._buffer_set_id = buffer_set_id
        self.finished: kv_cache_pb2.LoadFinished | None = None

    def __iter__(self) -> Iterator[kv_cache_pb2.ChunkLoaded]:
        try:
            for progress in self._call:  # type: ignore[attr-defined]
                if progress.HasField("finished"):
                    self.finished = progress.finished
                else:
                    yield progress.chunk_loaded
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        if self.finished is None:
            raise SidecarError(grpc.StatusCode.UNKNOWN, no_finish(self._buffer_set_id))

    def wait(self) -> kv_cache_pb2.LoadFinished:
        """Drain the progress and return the outcome."""
        for _ in self:
            pass
        assert self.finished is not None  # __iter__ raised otherwise
        return self.finished

    def cancel(self) -> None:
        """Stop the load; tokens already reported stay written, nothing else is touched."""
        self._call.cancel()


class KVCacheClient(ClosesOnExit):
    """The sidecar's KVCacheService over one channel; safe to share between threads.

    `wait_for_ready` makes calls wait for a sidecar that is still starting instead of
    failing with `Unavailable`; `timeout` is the default deadline of every call.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float | None = None,
        wait_for_ready: bool = False,
    ) -> None:
        self._channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = kv_cache_pb2_grpc.KVCacheServiceStub(self._channel)
        self._timeout = timeout
        self._wait_for_ready = wait_for_ready

    def close(self) -> None:
        self._channel.close()

    def _unary(
        self, method: Callable[..., _Reply], request: object, *, wait_for_ready: bool | None = None
    ) -> _Reply:
        """`wait_for_ready`: this call's, else the client's."""
        ready = self._wait_for_ready if wait_for_ready is None else wait_for_ready
        try:
            return method(request, timeout=self._timeout, wait_for_ready=ready)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def register_buffers(self, request: kv_cache_pb2.RegisterBuffersRequest) -> str:
        """Hand the sidecar a model's KV buffers; returns the buffer set id for later calls."""
        return self._unary(self._stub.RegisterBuffers, request).buffer_set_id

    def unregister_buffers(self, buffer_set_id: str) -> None:
        """Once this returns the sidecar holds no view of the buffers: they may be freed.

        Never waits for a sidecar that is not up (whatever `wait_for_ready` says): one that
        is gone holds no views, and a process shutting down must not hang on it."""
        request = kv_cache_pb2.UnregisterBuffersRequest(buffer_set_id=buffer_set_id)
        self._unary(self._stub.UnregisterBuffers, request, wait_for_ready=False)

    def publish(
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
        return self._unary(self._stub.Publish, request)

    def lookup(
        self, buffer_set_id: str, token_ids: Sequence[int], *, max_kl: float | None = None
    ) -> kv_cache_pb2.LookupResponse:
        """What a load would find, and its estimated seconds under the quality floor
        `max_kl` (see `load`)."""
        request = lookup_request(buffer_set_id, token_ids, max_kl)
        return self._unary(self._stub.Lookup, request)

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
    ) -> Load:
        """Start loading the longest available prefix into `destination`.

        `deadline`: seconds from now by which the KV must be in place: the sidecar plans the
        load against it, leaves the chunks that cannot arrive in time for the model server to
        compute, and says what it wrote. `timeout`: the call's own (else `ANSWER_GRACE_S` past
        the deadline, else the client's default); without a `deadline` it is the load's
        deadline too, and a sidecar whose answer comes later than it (a busy CPU) leaves the
        call failed with `DeadlineExceeded` and nothing said of what was written.
        `held_tokens`: leading tokens whose KV the model server has already (its own prefix
        cache); the load starts at the chunk that holds the first token after them.
        `relay_wait`: seconds to wait for a relay session lost mid-load to come back and
        resume (else the sidecar's `--relay-wait`); past it the load ends RELAY_GONE.
        `write_tokens`: only the first this many tokens have slots in `destination`; the
        rest only name the prompt (0: every token has one).
        `max_kl`: the quality floor, a bound on the expected KL of the model's next-token
        distributions from the loaded KV: chunks go only on tracks measured within it, or
        are left to compute (else the sidecar's `--max-kl`, by default 1e-3: the
        near-lossless tracks only; `math.inf`: no floor). LoadFinished says the bound kept
        and the loaded KV's expected KL.
        `compute_tokens_per_second`: how fast the model server computes a prompt itself (its
        prefill rate): a load whose first chunk would arrive later than the server computes
        its tokens loads nothing (LoadFinished says COMPUTE_FASTER), and each chunk prefers
        the tracks that beat it; None: unknown.
        """
        request = load_request(
            buffer_set_id, token_ids, destination, tracks, held_tokens, relay_wait, write_tokens,
            max_kl, compute_tokens_per_second, deadline,
        )  # fmt: skip
        call = self._stub.Load(
            request,
            timeout=load_call_timeout(timeout, deadline, self._timeout),
            wait_for_ready=self._wait_for_ready,
        )
        return Load(call, buffer_set_id)
