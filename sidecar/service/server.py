"""The sidecar process: gRPC on a Unix socket and a TCP probe port, HTTP probes, the relay.

One gRPC server listens on both: the Unix socket (mode 0660, so only the model server's
group reaches it) is the model server's; the TCP port (loopback by default) exists for
Kubernetes gRPC probes, with the same services. Health has two names:

* `""` (liveness): SERVING while the process runs, NOT_SERVING once it drains;
* `kvmoq.v1.KVCacheService` (readiness): SERVING only while the relay session is up.

SIGTERM or SIGINT drains: health goes NOT_SERVING, new work is refused with UNAVAILABLE,
running loads get `drain_seconds` to finish and are then cancelled (each still reports
what it wrote), then the servers close and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import OVERALL_HEALTH
from grpc_health.v1.health import SERVICE_NAME as HEALTH_SERVICE
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from kvmoq_client.v1 import kv_cache_pb2_grpc as pb_grpc

from sidecar import codec_process
from sidecar.address import format_address
from sidecar.kvcache.signing import TRUST_THE_RELAY
from sidecar.log import get_logger
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.moqt.relay.auth import read_token
from sidecar.service.config import SidecarConfig
from sidecar.service.kv_service import KVService, ServiceSettings
from sidecar.service.messages import HandleOpener
from sidecar.service.metrics import Metrics
from sidecar.service.probes import ProbeState, serve_probes
from sidecar.service.relay_link import RelayLink
from sidecar.service.servicer import SERVICE_NAME, KVCacheServicer
from sidecar.service.strict_requests import SERVER_OPTIONS, add_strict_service
from sidecar.tensors import cuda_available
from sidecar.transfer.publisher import KVPublisher

log = get_logger(__name__)

SOCKET_MODE = 0o660
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
GRPC_STOP_GRACE = 2.0
"""After the drain: time for in-flight unary calls before the server cuts them."""
RELAY_CLOSE_S = 1.0
"""How long a stopping sidecar waits for its relay session to close. The link sends QUIC's
CONNECTION_CLOSE at once, then waits out the closing period (three PTOs), which a relay
that was slow a moment before stretches to many seconds. Nothing is left to say to the
relay by then."""


async def run_sidecar(
    config: SidecarConfig,
    open_handle: HandleOpener,
    *,
    on_serving: Callable[[dict[str, str]], None],
) -> None:
    """Serve until SIGTERM/SIGINT, then drain. `on_serving` gets the bound addresses."""
    codec_process.set_up(config.codec_threads)
    asyncio.get_running_loop().set_default_executor(codec_process.executor(config.codec_threads))
    metrics = Metrics()
    health = health_aio.HealthServicer()
    settings = QuicSettings(
        backend=config.quic_backend,
        drafts=config.drafts,
        max_datagram_size=config.max_datagram_size,
        ca_file=config.ca,
        idle_timeout=config.relay_timeout,
        stall_timeout=config.relay_stall_timeout,
    )

    async def relay_changed(up: bool, reconnect: bool) -> None:
        metrics.relay_up.set(int(up))
        if reconnect:
            metrics.relay_reconnects.inc()
        await health.set(SERVICE_NAME, SERVING if up else NOT_SERVING)

    trust = dataclasses.replace(
        config.trusted_keys or TRUST_THE_RELAY,
        on_refusal=lambda refusal: metrics.catalog_refusals.labels(refusal.value).inc(),
    )
    link = RelayLink(
        config.relay,
        settings,
        KVPublisher(prompt_key=config.prompt_key, signer=config.catalog_key),
        chunk_size=config.chunk_size,
        on_change=relay_changed,
        token=lambda: read_token(config.token),
        trust=trust,
    )
    service = KVService(
        link,
        metrics,
        ServiceSettings(
            chunk_size=config.chunk_size,
            tracks=config.tracks,
            default_track=config.default_track,
            load_seconds=config.load_seconds,
            max_kl=config.max_kl,
            relay_wait=config.relay_wait,
            max_request_tokens=config.max_request_tokens,
            max_buffer_sets=config.max_buffer_sets,
            max_published_bytes=config.max_published_bytes,
        ),
    )

    servicer = KVCacheServicer(service, open_handle)
    server = _grpc_server(health, servicer)
    socket_path = config.grpc
    with contextlib.suppress(FileNotFoundError):
        socket_path.unlink()  # a socket left by a killed predecessor
    server.add_insecure_port(f"unix://{socket_path}")
    # The probe port is TCP, reachable from the pod's network: health and reflection only,
    # unless the KV API is asked for there too (--probe-api).
    probe_server = _grpc_server(health, servicer if config.probe_api else None)
    probe_port = probe_server.add_insecure_port(format_address(config.probe))
    await server.start()
    await probe_server.start()
    os.chmod(socket_path, SOCKET_MODE)
    await health.set(OVERALL_HEALTH, SERVING)
    await health.set(SERVICE_NAME, NOT_SERVING)

    def not_ready() -> str | None:
        if service.draining:
            return "draining"
        return None if link.up else f"no session to the relay {link.url}"

    probes = await serve_probes(*config.http, ProbeState(not_ready, metrics.exposition))
    http_port = probes.sockets[0].getsockname()[1]
    relay_task = asyncio.create_task(link.run())

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    addresses = {
        "grpc": f"unix://{socket_path}",
        "probe": format_address((config.probe[0], probe_port)),
        "http": format_address((config.http[0], http_port)),
    }
    cuda_available()  # says once, at start, when this node runs the CPU path only
    log.info("sidecar_serving", relay=config.relay, quic_backend=config.quic_backend, **addresses)
    on_serving(addresses)
    try:
        await stop.wait()
    finally:
        log.info("sidecar_draining", grace=config.drain_seconds)
        await health.enter_graceful_shutdown()
        await service.drain(config.drain_seconds)
        await server.stop(GRPC_STOP_GRACE)
        await probe_server.stop(GRPC_STOP_GRACE)
        probes.close()
        relay_task.cancel()
        await asyncio.wait([relay_task], timeout=RELAY_CLOSE_S)
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        log.info("sidecar_stopped")


def _grpc_server(
    health: health_aio.HealthServicer, servicer: KVCacheServicer | None
) -> grpc.aio.Server:
    """A gRPC server with health and reflection, and the KV API when given its servicer
    (requests bounded in size, and refused with INVALID_ARGUMENT when they do not parse)."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    names = [HEALTH_SERVICE, reflection.SERVICE_NAME]
    if servicer is not None:
        add_strict_service(pb_grpc.add_KVCacheServiceServicer_to_server, servicer, server)
        names.insert(0, SERVICE_NAME)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(names, server)
    return server
