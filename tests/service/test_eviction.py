"""A sidecar that publishes prompt after prompt keeps only what --max-published-bytes allows."""

from __future__ import annotations

from kvmoq_client.v1 import kv_cache_pb2 as pb

from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.aio.tls import CertificatePaths
from tests.support.relay import RelayProcess
from tests.support.sidecar import ContiguousKV, running_sidecar, shm_directory, synthetic_kv

MODEL = "SmolLM2-135M"
LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=16, dtype="float16")
TOKENS = 50  # 512 bytes a token in fp16: 25.6 kB of KV, as much again in the fp16 track
BUDGET = 80_000  # one prompt fits, two do not


def test_the_oldest_prompt_is_withdrawn_beyond_the_budget(
    relay: RelayProcess, cert: CertificatePaths
) -> None:
    flags = ("--chunk-size", "16", "--max-published-bytes", str(BUDGET))
    prompts = [list(range(1000, 1000 + TOKENS)), list(range(5000, 5000 + TOKENS))]
    with shm_directory() as shm, running_sidecar(relay.url, cert, *flags) as sidecar:
        sidecar.wait_ready()
        buffers = ContiguousKV(LAYOUT, max_tokens=64, directory=shm)
        set_id = sidecar.stub.RegisterBuffers(buffers.request(MODEL)).buffer_set_id
        published = []
        for seed, prompt in enumerate(prompts):
            buffers.put(0, synthetic_kv(LAYOUT, TOKENS, seed=seed))
            published.append(
                sidecar.stub.Publish(
                    pb.PublishRequest(
                        buffer_set_id=set_id,
                        token_ids=prompt,
                        source=pb.KVLocation(token_range=pb.TokenRange(start=0, end=TOKENS)),
                        tracks=["fp16"],
                        default_track="fp16",
                    )
                )
            )
        evicted = sidecar.wait_log("prompt_evicted")
        assert evicted["prompt"] == published[0].prompt_id
        assert sidecar.metric("kvmoq_evicted_prompts_total") == 1

        def lookup(prompt: list[int]) -> pb.LookupResponse:
            return sidecar.stub.Lookup(pb.LookupRequest(buffer_set_id=set_id, token_ids=prompt))

        newest = lookup(prompts[1])
        assert (newest.available_tokens, newest.relay_url) == (TOKENS, "")  # held here
        oldest = lookup(prompts[0])
        assert oldest.relay_url != "" or oldest.available_tokens == 0  # not held here any more

        # Publishing the withdrawn prompt again works: its namespace is free.
        buffers.put(0, synthetic_kv(LAYOUT, TOKENS, seed=0))
        again = sidecar.stub.Publish(
            pb.PublishRequest(
                buffer_set_id=set_id,
                token_ids=prompts[0],
                source=pb.KVLocation(token_range=pb.TokenRange(start=0, end=TOKENS)),
                tracks=["fp16"],
                default_track="fp16",
            )
        )
        assert again.prompt_id == published[0].prompt_id
        assert sidecar.metric("kvmoq_evicted_prompts_total") == 2
