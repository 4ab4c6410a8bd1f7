"""A vLLM engine with the kvmoq connector, driven over stdin/stdout by the tests.

Runs in `.venv-vllm` (vLLM's own environment, as in a deployment: a vLLM container beside
the sidecar's). Prints {"event": "ready"} once the engine is up, then answers each line of
JSON, {"requests": [{"token_ids": [...], "max_tokens": N, "tracks": [...]}, ...]} (tracks:
the load's, optional), with one line: every
request's generated token ids and text, greedy, the top log-probabilities at each position,
and the prompt tokens vLLM did not compute (`cached_tokens`: its own prefix cache and the
connector's loads).

    .venv-vllm/bin/python tests/vllm/engine.py --model DIR --role kv_both \\
        --extra '{"sidecar": "unix:///tmp/s.sock"}'
"""

from __future__ import annotations

import argparse
import json
import sys

TOP_LOGPROBS = 5
"""Log-probabilities of the top tokens at each generated position, returned with the text."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model directory")
    parser.add_argument("--role", default="kv_both", help="kv_producer, kv_consumer, kv_both")
    parser.add_argument("--extra", default="{}", help="kv_connector_extra_config, JSON")
    parser.add_argument("--max-model-len", type=int, default=8192)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    transfer = KVTransferConfig(
        kv_connector="KVMoqConnector",
        kv_connector_module_path="kvmoq_client.vllm",
        kv_role=args.role,
        kv_load_failure_policy="recompute",
        kv_connector_extra_config=json.loads(args.extra),
    )
    llm = LLM(
        model=args.model,
        dtype="float16",
        max_model_len=args.max_model_len,
        enforce_eager=True,
        kv_transfer_config=transfer,
    )
    print(json.dumps({"event": "ready"}), flush=True)
    for line in sys.stdin:
        batch = json.loads(line)["requests"]
        prompts = [{"prompt_token_ids": r["token_ids"]} for r in batch]
        params = [
            SamplingParams(
                temperature=0,
                max_tokens=r["max_tokens"],
                logprobs=TOP_LOGPROBS,
                extra_args={"kv_transfer_params": {"kvmoq_tracks": r["tracks"]}}
                if r.get("tracks")
                else None,
            )
            for r in batch
        ]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        answers = [
            {
                "token_ids": list(out.outputs[0].token_ids),
                "text": out.outputs[0].text,
                "cached_tokens": out.num_cached_tokens or 0,
                "logprobs": [
                    {str(token): entry.logprob for token, entry in position.items()}
                    for position in out.outputs[0].logprobs or ()
                ],
            }
            for out in outputs
        ]
        print(json.dumps({"event": "generated", "outputs": answers}), flush=True)


if __name__ == "__main__":
    main()
