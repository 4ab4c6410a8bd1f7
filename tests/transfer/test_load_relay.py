"""Publisher and subscriber through a real relay process, on synthetic KV (fast)."""

from __future__ import annotations

import torch

from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.tls import CertificatePaths
from sidecar.transfer.subscriber import StopReason
from tests.moqt.test_relay_harness import RelayProcess
from tests.transfer.kv_net import MODEL, cert, network, relay, run, synthetic_kv  # noqa: F401

LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=16, dtype="float32")
CHUNK = 16


def test_whole_prompt_loads_on_the_default_track(
    relay: RelayProcess,  # noqa: F811
    cert: CertificatePaths,  # noqa: F811
) -> None:
    token_ids = list(range(100, 170))
    kv = synthetic_kv(len(token_ids), LAYOUT)

    async def main() -> None:
        async with network(relay.url, cert) as net:
            publisher, session = await net.publisher()
            prompt = publisher.prompt(
                MODEL, LAYOUT, token_ids, tracks=("int8", "fp16"), chunk_size=CHUNK
            )
            await session.publish_namespace(prompt.namespace)
            await prompt.publish(kv)
            subscriber = await net.subscriber()
            subscriber.chunk_size = CHUNK
            found = await subscriber.lookup(MODEL, token_ids)
            assert (found.prompt, found.tokens, found.ready_tokens) == (prompt.name, 70, 70)
            out = torch.zeros_like(kv)
            result = await subscriber.load(
                MODEL, token_ids, out, deadline=30, quality_order=("int8",)
            )
            assert result.stopped is StopReason.COMPLETE, result
            assert result.loaded_tokens == (range(0, 70),)
            assert not result.rejected
            expected = get_codec("int8").decode(get_codec("int8").encode(kv, LAYOUT), LAYOUT)
            assert torch.equal(out, expected)
            assert prompt.kept_tracks == ("int8",)

    run(main)
