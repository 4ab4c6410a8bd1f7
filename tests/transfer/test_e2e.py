"""End to end on SmolLM2-135M's real KV: relay and publisher as processes, the subscriber here.

The test prompts are prefixes of the pydoc text (tests/conftest.py); the KV of a prefix is
the slice of the 4096-token prompt's KV (causal attention). A loaded cache must make the
model predict the same next token as the recomputed one.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from sidecar.kvcache.codecs import get_codec
from sidecar.models import kv_store
from sidecar.models.kv import forward_with_kv, kv_layout
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.transfer.subscriber import StopReason
from sidecar.transfer.track_quality import TrackChoice
from tests.support.aio import run
from tests.support.kv_net import MODEL, layout_of, network, publisher_process
from tests.support.relay import RelayProcess

pytestmark = [pytest.mark.model, pytest.mark.slow]

PUBLISHED = 640  # 5 chunks of 128


def next_token(model: PreTrainedModel, kv: torch.Tensor, token_ids: list[int], cached: int) -> int:
    """The model's next token after `token_ids`, given the KV of the first `cached` of them."""
    return int(forward_with_kv(model, kv[:, :, :cached], token_ids[cached:])[-1].argmax())


def test_loaded_cache_predicts_what_recompute_predicts(
    relay: RelayProcess,
    cert: CertificatePaths,
    smollm2: PreTrainedModel,
    pydoc_kv: kv_store.PromptKV,
    tmp_path: Path,
) -> None:
    """On the near-lossless track and on int8: the whole published prompt, then a shorter
    query that shares two whole chunks with it (found from the catalog seen on the first
    load) and recomputes its other 44 tokens."""
    ids = list(pydoc_kv.token_ids[: PUBLISHED + 1])
    exact = pydoc_kv.kv[:, :, :PUBLISHED]
    layout = kv_layout(smollm2)
    whole, shorter = ids[: PUBLISHED + 1], ids[:300]
    expected_whole = next_token(smollm2, exact, whole, PUBLISHED)
    expected_shorter = next_token(smollm2, exact, shorter, 299)
    with publisher_process(relay.url, cert, exact, ids[:PUBLISHED], tmp_path, ("int8", "fp16")):

        async def main() -> None:
            async with network(relay.url, cert) as net:
                subscriber = await net.subscriber()
                for track in ("fp16", "int8"):
                    out = torch.zeros(layout.shape(PUBLISHED))
                    result = await subscriber.load(
                        MODEL, ids[:PUBLISHED], out, 60, choice=TrackChoice.only(track)
                    )
                    assert result.stopped is StopReason.COMPLETE
                    assert result.loaded_tokens == (range(0, PUBLISHED),)
                    # In a thread: a forward pass on the loop would starve the session for
                    # seconds on a busy machine, and the relay would take it for gone.
                    got = await asyncio.to_thread(next_token, smollm2, out, whole, PUBLISHED)
                    assert got == expected_whole, track

                    partial = torch.zeros(layout.shape(300))
                    result = await subscriber.load(
                        MODEL, shorter, partial, 60, choice=TrackChoice.only(track)
                    )
                    assert result.available == result.prefix_tokens == 256
                    got = await asyncio.to_thread(next_token, smollm2, partial, shorter, 256)
                    assert got == expected_shorter, track

        run(main)


@pytest.mark.timing  # the relay's stall watch within the load's deadline: run alone
def test_publisher_killed_mid_load(
    relay: RelayProcess,
    cert: CertificatePaths,
    pydoc_kv: kv_store.PromptKV,
    tmp_path: Path,
) -> None:
    """SIGKILL once two chunks are written: the load returns what arrived before (those two,
    and the one whose FETCH was already answered, if any), verified, and says the publisher
    left: the relay drops it within its --stall-timeout and refuses the next chunk's FETCH
    on every track (or resets the one it was forwarding), long before the 6 s deadline."""
    ids = list(pydoc_kv.token_ids[:PUBLISHED])
    exact = pydoc_kv.kv[:, :, :PUBLISHED]
    layout = layout_of(exact)
    written: dict[int, torch.Tensor] = {}
    loaded = 0
    with publisher_process(relay.url, cert, exact, ids, tmp_path) as publisher:

        def sink(span: range, kv: torch.Tensor) -> None:
            written[span.start] = kv
            if len(written) == 2:
                publisher.send_signal(signal.SIGKILL)

        async def main() -> None:
            nonlocal loaded
            async with network(relay.url, cert) as net:
                subscriber = await net.subscriber()
                result = await subscriber.load(MODEL, ids, sink, 6)
                assert result.stopped is StopReason.PUBLISHER_GONE, result
                loaded = result.prefix_tokens
                assert loaded in (256, 384)
                assert result.loaded_tokens == (range(0, loaded),)
                assert {r.index for r in result.rejected} == {loaded // 128}, result.rejected
                # Refused, or reset by the relay when the publisher left mid-fetch.
                assert all(
                    "Fetch refused" in r.reason or "fetch stream reset" in r.reason
                    for r in result.rejected
                ), result.rejected

        run(main)
    codec = get_codec("int8")
    expected = codec.decode(codec.encode(exact[:, :, :loaded], layout), layout)
    assert torch.equal(torch.cat([written[start] for start in sorted(written)], dim=2), expected)
