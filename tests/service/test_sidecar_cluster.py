"""Sidecars on different edges of a relay cluster: a prompt published through edge A loads,
bit-exact, through edges B and C, and what the root fetched from A for B it serves C itself."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
import torch
from kvmoq_client.v1 import kv_cache_pb2 as pb

from sidecar.moqt.aio.tls import CertificatePaths
from tests.support.relay import cluster_relay, edge_flags
from tests.support.sidecar import (
    CHUNK,
    LAYOUT,
    MODEL,
    ContiguousKV,
    load,
    publish_whole,
    running_sidecar,
    shm_directory,
    spans,
    synthetic_kv,
)


@pytest.mark.slow
def test_a_prompt_published_on_one_edge_loads_through_the_others(cert: CertificatePaths) -> None:
    prompt = list(range(3000, 3064))  # 4 whole chunks
    kv = synthetic_kv(LAYOUT, len(prompt), seed=3)
    flags = ("--chunk-size", str(CHUNK))
    with ExitStack() as stack:
        root = stack.enter_context(cluster_relay(cert))
        a, b, c = (
            stack.enter_context(cluster_relay(cert, *edge_flags(root.url, cert.cert)))
            for _ in "ABC"
        )
        for edge in (a, b, c):
            edge.wait_for("upstream_up", 1)
        shm = stack.enter_context(shm_directory())
        prefill = stack.enter_context(running_sidecar(a.url, cert, *flags))
        decoders = [stack.enter_context(running_sidecar(e.url, cert, *flags)) for e in (b, c)]
        for sidecar in (prefill, *decoders):
            sidecar.wait_ready()

        publish_whole(prefill, MODEL, LAYOUT, kv, prompt, shm, tracks=["fp16"])
        every_token = pb.KVLocation(token_range=pb.TokenRange(start=0, end=len(prompt)))

        for decoder in decoders:
            own = stack.enter_context(shm_directory())  # buffer files are named per layer
            destination = ContiguousKV(LAYOUT, max_tokens=64, directory=own)
            set_id = decoder.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
            request = pb.LoadRequest(
                buffer_set_id=set_id, token_ids=prompt, destination=every_token, tracks=["fp16"]
            )
            _, finished = load(decoder.stub, request, timeout=60)
            assert finished.stop_reason == pb.STOP_REASON_COMPLETE
            assert spans(finished.loaded) == [(0, len(prompt))]
            assert torch.equal(destination.get(0, len(prompt)), kv)

        # The root asks edge A only, and edge C's loads came from what the root cached for
        # edge B's: it fetched each object from A once (4 chunks and the catalog's revision)
        # for the two edges, and subscribed A at most once for every two edge subscriptions.
        assert root.metric("fetches_received") == 2 * root.metric("fetches_sent")
        assert root.metric("fetches_sent") == a.metric("fetches_received") == 5
        assert root.metric("subscribes_sent") == a.metric("subscribes_received")
        assert 2 * root.metric("subscribes_sent") <= root.metric("subscribes_received")
