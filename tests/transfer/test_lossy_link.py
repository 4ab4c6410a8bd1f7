"""Loads over a path that loses and delays packets: the decoder reaches a real relay process
through bench/lossy_link.py (a UDP forwarder that drops and delays real QUIC datagrams;
this kernel has no netem), at internet packet sizes."""

from __future__ import annotations

import asyncio

import pytest
import torch

from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.aio import api
from sidecar.moqt.aio.quic_backend import QuicSettings
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.transfer.publisher import KVPublisher
from sidecar.transfer.subscriber import KVSubscriber, StopReason
from tests.support.aio import run
from tests.support.kv_net import MODEL, lossy_link, synthetic_kv
from tests.support.relay import running_relay

# Times loads over paced links or stall watches: scripts/test.sh runs it alone (see there).
pytestmark = pytest.mark.timing

LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype="float16")
CHUNK = 128
TOKENS = 512  # 1 MiB of fp16 KV, 0.5 MiB on int8


@pytest.mark.slow
@pytest.mark.parametrize("loss", [0.01, 0.05])
def test_loads_complete_and_verify_through_loss_and_delay(
    cert: CertificatePaths, loss: float
) -> None:
    """1% and 5% of the datagrams dropped each way, each held 20-50 ms: QUIC recovers what
    is lost, and every chunk arrives whole, verifies and decodes bit-exact."""
    token_ids = list(range(10_000, 10_000 + TOKENS))
    kv = synthetic_kv(TOKENS, LAYOUT, seed=9)
    settings = QuicSettings(ca_file=cert.cert)  # 1350-byte datagrams, as on the internet
    with (
        running_relay(cert, "--max-datagram-size", str(settings.max_datagram_size)) as relay,
        lossy_link(relay.url, loss, "20-50") as (url, counts),
    ):

        async def main() -> None:
            publisher = KVPublisher()
            async with (
                api.connect(relay.url, settings, publisher=publisher) as prefill,
                api.connect(url, settings) as decode,
            ):
                prompt = publisher.prompt(
                    MODEL, LAYOUT, token_ids, tracks=("int8",), chunk_size=CHUNK
                )
                await prefill.publish_namespace(prompt.namespace)
                await prompt.publish(kv)
                subscriber = KVSubscriber(decode, chunk_size=CHUNK)
                out = torch.zeros_like(kv)
                started = asyncio.get_running_loop().time()
                result = await subscriber.load(MODEL, token_ids, out, 90)
                took = asyncio.get_running_loop().time() - started
                print(f"loss {loss:.0%}: {sum(c.nbytes for c in result.loaded)} B in {took:.1f} s")
                assert result.stopped is StopReason.COMPLETE, result
                assert not result.rejected
                codec = get_codec("int8")
                assert torch.equal(out, codec.decode(codec.encode(kv, LAYOUT), LAYOUT))

        run(main)
    assert counts["dropped"] > 0
    assert counts["dropped"] / (counts["dropped"] + counts["forwarded"]) == pytest.approx(
        loss, abs=0.02
    )
