"""A sidecar process through what happens to it: the relay goes and comes back, a client
leaves mid-load, Kubernetes sends SIGTERM while a load runs."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kvmoq_client.v1 import kv_cache_pb2 as pb

from sidecar.address import free_udp_port
from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.aio.tls import CertificatePaths
from tests.support.relay import RelayProcess, running_relay
from tests.support.sidecar import (
    ContiguousKV,
    PagedKV,
    SidecarProcess,
    load,
    running_sidecar,
    shm_directory,
    spans,
    wait_for,
)

# Times loads over paced links or stall watches: scripts/test.sh runs it alone (see there).
pytestmark = pytest.mark.timing

MODEL = "SmolLM2-135M"
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float16")
TOKENS = list(range(500, 520))
BLOCKS = pb.KVLocation(blocks=pb.BlockList(block_ids=[0, 1, 2]))
PATIENT = ("--relay-timeout", "120", "--relay-stall-timeout", "120")
"""The relay is frozen for a while, and these tests are about something else than noticing
it: the session must not end."""


@pytest.fixture
def shm() -> Iterator[Path]:
    with shm_directory() as directory:
        yield directory


def register(sidecar: SidecarProcess, shm: Path) -> tuple[str, PagedKV]:
    buffers = PagedKV(LAYOUT, block_size=8, num_blocks=4, directory=shm)
    return sidecar.stub.RegisterBuffers(buffers.request(MODEL)).buffer_set_id, buffers


def health(sidecar: SidecarProcess, service: str) -> int:
    with grpc.insecure_channel(sidecar.probe) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status


BIG = KVLayout(num_layers=8, num_kv_heads=4, head_dim=64, dtype="float16")
BIG_PROMPT = 2048
"""Tokens of a prompt loaded in 128 chunks of 16: a few hundred FETCHes, long enough to
interrupt after the first."""


@dataclass
class LoadUnderWay:
    """A big prompt published by one sidecar and being loaded by another, one chunk in."""

    relay: RelayProcess
    decoder: SidecarProcess
    kv: torch.Tensor
    destination: ContiguousKV
    first: pb.LoadProgress
    rest: Future[list[pb.LoadProgress]]

    def messages(self, timeout: float) -> list[pb.LoadProgress]:
        """Every message of the load, LoadFinished last."""
        return [self.first, *self.rest.result(timeout=timeout)]

    def cut_short(self, timeout: float) -> tuple[pb.LoadFinished, int, int]:
        """LoadFinished of a load that ended part way, the tokens its progress reported and
        the count of its ChunkLoaded messages, once checked that LoadFinished lists exactly
        those tokens and that they are written as published."""
        *progress, last = self.messages(timeout)
        written = sum(m.chunk_loaded.tokens.end - m.chunk_loaded.tokens.start for m in progress)
        assert 0 < written < BIG_PROMPT
        assert spans(last.finished.loaded) == [(0, written)]
        assert torch.equal(self.destination.get(0, written), self.kv[:, :, :written])
        return last.finished, written, len(progress)


@contextmanager
def a_big_load_under_way(
    cert: CertificatePaths,
    shm: Path,
    seed: int,
    *,
    port: int | None = None,
    prefill_flags: tuple[str, ...] = (),
    decoder_flags: tuple[str, ...] = (),
    timeout: float = 60,
    **request: Any,
) -> Iterator[LoadUnderWay]:
    """A relay (on `port`), a prefill sidecar that publishes a `BIG_PROMPT`-token prompt in
    fp16, and a decoder sidecar whose Load of it (more LoadRequest fields in `request`,
    `timeout` the call's) has just written its first chunk."""
    from tests.support.sidecar import publish_whole, synthetic_kv

    prompt = list(range(seed * 10_000, seed * 10_000 + BIG_PROMPT))
    kv = synthetic_kv(BIG, len(prompt), seed=seed)
    flags = ("--chunk-size", "16")
    every_token = pb.KVLocation(token_range=pb.TokenRange(start=0, end=len(prompt)))
    with (
        running_relay(cert, port=port) as relay,
        running_sidecar(relay.url, cert, *flags, *prefill_flags) as prefill,
        running_sidecar(relay.url, cert, *flags, *decoder_flags) as decoder,
        shm_directory() as own,
        ThreadPoolExecutor(1) as pool,
    ):
        prefill.wait_ready()
        decoder.wait_ready()
        publish_whole(prefill, MODEL, BIG, kv, prompt, shm, tracks=["fp16"])
        destination = ContiguousKV(BIG, max_tokens=len(prompt), directory=own)
        set_id = decoder.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
        load_request = pb.LoadRequest(
            buffer_set_id=set_id, token_ids=prompt, destination=every_token, **request
        )
        call = decoder.stub.Load(load_request, timeout=timeout)
        first = next(call)
        assert first.HasField("chunk_loaded")
        yield LoadUnderWay(relay, decoder, kv, destination, first, pool.submit(list, call))


def has_load_started(logs: list[dict[str, Any]]) -> bool:
    return any(entry["event"] == "load_started" for entry in logs)


def read_until_error(
    call: Iterator[pb.LoadProgress],
) -> tuple[list[pb.LoadProgress], grpc.RpcError]:
    """Every message of a stream that must end with an error status, and that error."""
    messages: list[pb.LoadProgress] = []
    try:
        for message in call:
            messages.append(message)
    except grpc.RpcError as error:
        return messages, error
    raise AssertionError(f"the stream ended without an error after {messages}")


@pytest.mark.slow
def test_without_a_relay_loads_ask_for_every_token_until_it_is_back(
    cert: CertificatePaths, shm: Path
) -> None:
    port = free_udp_port()
    with running_sidecar(f"moqt://127.0.0.1:{port}", cert) as sidecar:
        set_id, _ = register(sidecar, shm)
        status, reason = sidecar.get("/readyz")
        assert (status, reason) == (503, f"no session to the relay moqt://127.0.0.1:{port}\n")
        assert sidecar.get("/healthz")[0] == 200
        assert health(sidecar, "") == health_pb2.HealthCheckResponse.SERVING
        assert (
            health(sidecar, "kvmoq.v1.KVCacheService") == health_pb2.HealthCheckResponse.NOT_SERVING
        )
        request = pb.LoadRequest(buffer_set_id=set_id, token_ids=TOKENS, destination=BLOCKS)
        chunks, finished = load(sidecar.stub, request, timeout=60)
        assert not chunks and not finished.loaded
        assert finished.stop_reason == pb.STOP_REASON_RELAY_GONE
        assert finished.compute_tokens == len(TOKENS)

        with running_relay(cert, port=port):
            sidecar.wait_ready()
            assert (
                health(sidecar, "kvmoq.v1.KVCacheService") == health_pb2.HealthCheckResponse.SERVING
            )
        wait_for(lambda: sidecar.get("/readyz")[0] == 503, "/readyz 503 once the relay left")
        with running_relay(cert, port=port):
            sidecar.wait_ready()
            assert sidecar.metric("kvmoq_relay_reconnects_total") == 1
            _, finished = load(sidecar.stub, request, timeout=60)
            assert finished.stop_reason == pb.STOP_REASON_NOT_FOUND


@pytest.mark.slow
def test_a_relay_that_stops_answering_is_noticed_in_about_a_second(
    cert: CertificatePaths, shm: Path
) -> None:
    """A frozen relay is a dead one as far as the network can tell. Once it has
    acknowledged no PING for --relay-stall-timeout (1 s; not the 10 s idle timeout) the
    session is over and /readyz turns 503; a load waiting on it waits --relay-wait (2 s)
    for the relay to come back, well inside its deadline (10 s here), then ends RELAY_GONE
    with what it wrote (nothing). Back on a session opened while the relay was frozen
    (QUIC's timers stretched by the handshake's seconds-long round trip), the sidecar still
    stops within a couple of seconds of SIGTERM, without waiting out QUIC's closing period."""
    with (
        running_relay(cert) as relay,
        running_sidecar(relay.url, cert) as sidecar,
        ThreadPoolExecutor(1) as pool,
    ):
        sidecar.wait_ready()
        set_id, _ = register(sidecar, shm)
        deadline = Timestamp()
        deadline.FromNanoseconds(time.time_ns() + 10_000_000_000)
        request = pb.LoadRequest(
            buffer_set_id=set_id, token_ids=TOKENS, destination=BLOCKS, deadline=deadline
        )
        with relay.frozen():
            started = time.monotonic()
            loading = pool.submit(load, sidecar.stub, request, timeout=60)
            wait_for(lambda: sidecar.get("/readyz")[0] == 503, "/readyz 503")
            unready = time.monotonic() - started
            chunks, finished = loading.result(timeout=60)
            ended = time.monotonic() - started
            assert finished.stop_reason == pb.STOP_REASON_RELAY_GONE
            assert (chunks, finished.compute_tokens) == ([], len(TOKENS))
            assert unready < 3.0 and 1.5 < ended - unready < 3.0, (unready, ended)
            print(f"relay loss: /readyz 503 after {unready:.2f} s; load ended at {ended:.2f} s")
        sidecar.wait_ready()
        again = pb.LoadRequest(buffer_set_id=set_id, token_ids=TOKENS, destination=BLOCKS)
        _, finished = load(sidecar.stub, again, timeout=60)
        assert finished.stop_reason == pb.STOP_REASON_NOT_FOUND
        stopping = time.monotonic()
        assert sidecar.stop() == 0
        assert time.monotonic() - stopping < 3.0


@pytest.mark.slow
def test_prompts_outlive_their_killed_publisher_in_the_relay_cache(
    cert: CertificatePaths, shm: Path
) -> None:
    """A prefill pod restarts (SIGKILL here): what the relay cached of its prompts still
    loads, on a decoder that loaded it before and on one that never asked, and Lookup says
    the prompt is withdrawn once the relay has noticed (on the decoder that heard of it
    while it was published: the other never heard of it, and still finds and loads it)."""
    from tests.support.sidecar import ContiguousKV, publish_whole, synthetic_kv

    prompt = list(range(8000, 8064))
    kv = synthetic_kv(LAYOUT, len(prompt), seed=3)
    flags = ("--chunk-size", "16")
    every_token = pb.KVLocation(token_range=pb.TokenRange(start=0, end=len(prompt)))
    with (
        running_relay(cert) as relay,
        running_sidecar(relay.url, cert, *flags) as prefill,
        running_sidecar(relay.url, cert, *flags) as early,
        running_sidecar(relay.url, cert, *flags) as late,
    ):
        for sidecar in (prefill, early, late):
            sidecar.wait_ready()
        publish_whole(prefill, MODEL, LAYOUT, kv, prompt, shm, tracks=["fp16"])

        def loads_whole(decoder: SidecarProcess) -> pb.LoadFinished:
            with shm_directory() as own:
                destination = ContiguousKV(LAYOUT, max_tokens=len(prompt), directory=own)
                set_id = decoder.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
                request = pb.LoadRequest(
                    buffer_set_id=set_id, token_ids=prompt, destination=every_token
                )
                _, finished = load(decoder.stub, request, timeout=60)
                assert finished.stop_reason == pb.STOP_REASON_COMPLETE, finished
                assert torch.equal(destination.get(0, len(prompt)), kv)
                found = decoder.stub.Lookup(
                    pb.LookupRequest(buffer_set_id=set_id, token_ids=prompt)
                )
                assert found.available_tokens == len(prompt)
                return found

        assert not loads_whole(early).withdrawn  # the relay now caches every chunk
        prefill.process.kill()
        prefill.process.wait(10)
        started = time.monotonic()
        loads_whole(late)
        loads_whole(early)
        took = time.monotonic() - started
        assert took < 8.0, took  # before: a 5 s block, then "the publisher left"
        wait_for(lambda: loads_whole(early).withdrawn, "Lookup says withdrawn")
        assert not loads_whole(late).withdrawn


@pytest.mark.slow
def test_a_load_resumes_where_it_was_when_the_relay_dies_and_comes_back(
    cert: CertificatePaths, shm: Path
) -> None:
    """The relay is SIGKILLed mid-load and another starts on its address: the decoder
    notices, reconnects with backoff and loads the chunks it still lacks, the prefill
    sidecar announces its prompt again, and the load ends COMPLETE, every byte exact, inside
    its deadline. Had the relay not come back, it would end RELAY_GONE with exactly what was
    verified (test_a_relay_killed_mid_load_ends_it_after_the_relay_wait)."""
    port = free_udp_port()
    deadline = Timestamp()
    deadline.FromSeconds(int(time.time()) + 40)
    with a_big_load_under_way(
        cert,
        shm,
        2,
        port=port,
        prefill_flags=("--relay-timeout", "3"),
        deadline=deadline,
        relay_wait=Duration(seconds=30),  # the new relay, and the prompt announced again
    ) as load:
        os.kill(load.relay.process.pid, signal.SIGSTOP)  # now, mid-load; then dead
        os.kill(load.relay.process.pid, signal.SIGKILL)
        load.relay.process.wait(10)
        with running_relay(cert, port=port):
            messages = load.messages(60)
        finished = messages[-1].finished
        assert finished.stop_reason == pb.STOP_REASON_COMPLETE, finished
        assert spans(finished.loaded) == [(0, BIG_PROMPT)]
        assert torch.equal(load.destination.get(0, BIG_PROMPT), load.kv)
        resumed = load.decoder.wait_log("load_resuming")
        assert 0 < resumed["first_chunk"] < BIG_PROMPT // 16


@pytest.mark.slow
@pytest.mark.parametrize("wait", [None, 0.0, 5.0], ids=["default", "none", "asked"])
def test_a_relay_killed_mid_load_ends_it_after_the_relay_wait(
    cert: CertificatePaths, shm: Path, wait: float | None
) -> None:
    """The relay is SIGKILLed mid-load and never comes back; the request sets no deadline and
    the call has 120 s. Once the sidecar notices (about a second), the load waits the
    request's `relay_wait` (else the sidecar's --relay-wait, 2 s) for a relay session to come
    back, then ends RELAY_GONE and reports every chunk it wrote: not 120 s later in
    DEADLINE_EXCEEDED with no word."""
    request = {} if wait is None else {"relay_wait": Duration(seconds=int(wait))}
    waits = 2.0 if wait is None else wait
    with a_big_load_under_way(cert, shm, 4, timeout=120, **request) as load:
        killed = time.monotonic()
        load.relay.process.kill()
        finished, _, _ = load.cut_short(60)
        ended = time.monotonic() - killed
        assert finished.stop_reason == pb.STOP_REASON_RELAY_GONE, finished
        assert waits < ended < waits + 4.0, ended
        print(f"relay killed: LoadFinished after {ended:.2f} s (relay wait {waits} s)")


@pytest.mark.slow
def test_a_client_that_leaves_mid_load_cancels_only_its_load(
    cert: CertificatePaths, shm: Path
) -> None:
    with running_relay(cert) as relay, running_sidecar(relay.url, cert, *PATIENT) as sidecar:
        sidecar.wait_ready()
        set_id, buffers = register(sidecar, shm)
        request = pb.LoadRequest(buffer_set_id=set_id, token_ids=TOKENS, destination=BLOCKS)
        with relay.frozen():
            call = sidecar.stub.Load(request, metadata=(("x-request-id", "leaver"),), timeout=60)
            sidecar.wait_log("load_started", request_id="leaver")
            call.cancel()
            finished = sidecar.wait_log("load_finished", request_id="leaver")
        assert (finished["stop"], finished["loaded"]) == ("cancelled", [])
        assert not any(tensor.any() for tensor in buffers.keys + buffers.values)
        found = sidecar.stub.Lookup(pb.LookupRequest(buffer_set_id=set_id, token_ids=TOKENS))
        assert found.available_tokens == 0
        assert sidecar.get("/readyz")[0] == 200


@pytest.mark.slow
def test_sigterm_drains_running_loads_then_exits(cert: CertificatePaths, shm: Path) -> None:
    with (
        running_relay(cert) as relay,
        running_sidecar(relay.url, cert, "--drain-seconds", "1", *PATIENT) as sidecar,
        ThreadPoolExecutor(1) as pool,
    ):
        sidecar.wait_ready()
        set_id, _ = register(sidecar, shm)
        request = pb.LoadRequest(buffer_set_id=set_id, token_ids=TOKENS, destination=BLOCKS)
        with relay.frozen():
            call = sidecar.stub.Load(request, metadata=(("x-request-id", "drained"),), timeout=60)
            received: Future[tuple[list[pb.LoadProgress], grpc.RpcError]] = pool.submit(
                read_until_error, call
            )
            sidecar.wait_log("load_started", request_id="drained")
            sidecar.process.send_signal(signal.SIGTERM)
            sidecar.wait_log("sidecar_draining")
            assert health(sidecar, "") == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as refused:
                sidecar.stub.Lookup(pb.LookupRequest(buffer_set_id=set_id, token_ids=TOKENS))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            messages, error = received.result(timeout=30)
            assert error.code() == grpc.StatusCode.CANCELLED
            assert "shutting down" in (error.details() or "")
            [last] = messages
            assert last.finished.stop_reason == pb.STOP_REASON_CANCELLED
            assert (spans(last.finished.loaded), last.finished.compute_tokens) == ([], 20)
            assert sidecar.process.wait(30) == 0
        finished = sidecar.wait_log("load_finished", request_id="drained")
        assert (finished["stop"], finished["loaded"]) == ("cancelled", [])


@pytest.mark.slow
def test_a_load_out_of_time_mid_way_accounts_for_every_chunk_it_wrote(
    cert: CertificatePaths, shm: Path
) -> None:
    """The relay goes silent after the first chunks and the load runs out of time: it ends
    DEADLINE through the subscriber's own deadline, a margin before the hard bound, so its
    LoadFinished and the metrics count the chunks it wrote and their bytes, not only their
    positions. (Ended by the hard bound instead, a load lost that account: the vLLM bench
    read such loads at 100 Mbit/s as no chunk at all.)"""
    with a_big_load_under_way(
        cert, shm, 3, decoder_flags=PATIENT, tracks=["fp16"], timeout=4
    ) as load:
        with load.relay.frozen():
            finished, written, chunks = load.cut_short(30)
        assert finished.stop_reason == pb.STOP_REASON_DEADLINE, finished
        assert finished.track_bytes["fp16"] >= written * BIG.fp16_bytes_per_token
        assert load.decoder.metric("kvmoq_loaded_chunks_total", track="fp16") == chunks
        logged = load.decoder.wait_log("load_finished", stop="deadline")
        assert logged["loaded"] == [[0, written]]


@pytest.mark.slow
def test_a_load_stuck_on_a_silent_relay_still_ends_with_load_finished(
    cert: CertificatePaths, shm: Path
) -> None:
    """The relay stops answering mid-load and the client's gRPC deadline is short: the
    sidecar ends the load a margin before that deadline and reports what it wrote
    (nothing here), instead of the call ending in DEADLINE_EXCEEDED with no word.

    Then the sidecar itself is held up past the load's deadline (SIGSTOP; a busy CPU did it
    to the demo's 0.1 s loads on CI): a load given its own `deadline` through the client
    still ends with LoadFinished, as its call waits `ANSWER_GRACE_S` longer for the
    answer, where a call whose timeout is the deadline fails without a word."""
    from kvmoq_client import DeadlineExceeded, KVCacheClient, token_slots

    from tests.support.sidecar import ContiguousKV, publish_whole, synthetic_kv

    prompt = list(range(7000, 7064))
    kv = synthetic_kv(LAYOUT, len(prompt), seed=1)
    with (
        running_relay(cert) as relay,
        shm_directory() as own,
        running_sidecar(relay.url, cert, "--chunk-size", "16") as prefill,
        running_sidecar(relay.url, cert, "--chunk-size", "16", *PATIENT) as decoder,
    ):
        prefill.wait_ready()
        decoder.wait_ready()
        publish_whole(prefill, MODEL, LAYOUT, kv, prompt, shm, tracks=["fp16"])
        destination = ContiguousKV(LAYOUT, max_tokens=64, directory=own)
        set_id = decoder.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
        every_token = pb.KVLocation(token_range=pb.TokenRange(start=0, end=len(prompt)))
        request = pb.LoadRequest(
            buffer_set_id=set_id, token_ids=prompt, destination=every_token, tracks=["fp16"]
        )
        with relay.frozen():
            chunks, finished = load(decoder.stub, request, timeout=3)
        assert finished.stop_reason == pb.STOP_REASON_DEADLINE
        assert spans(finished.loaded) == [] and not chunks
        assert finished.compute_tokens == len(prompt)

        late = 1.0
        with KVCacheClient(decoder.grpc) as client, relay.frozen():
            for bound in ({"deadline": late}, {"timeout": late}):
                before = len(decoder.logs())
                call = client.load(set_id, prompt, token_slots(0, len(prompt)), **bound)
                wait_for(lambda n=before: has_load_started(decoder.logs()[n:]), "the load to start")
                decoder.process.send_signal(signal.SIGSTOP)
                time.sleep(late + 0.5)
                decoder.process.send_signal(signal.SIGCONT)
                if "timeout" in bound:
                    with pytest.raises(DeadlineExceeded):
                        call.wait()
                    continue
                finished = call.wait()
                assert finished.stop_reason == pb.STOP_REASON_DEADLINE
                assert finished.compute_tokens == len(prompt)
