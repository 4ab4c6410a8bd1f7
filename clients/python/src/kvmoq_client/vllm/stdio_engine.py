"""A vLLM engine driven by JSON lines on stdin: what kvmoq's demo, benchmark and tests run in
vLLM's own environment.

vLLM and the sidecar live in different environments (here `.venv-vllm` beside kvmoq's venv;
in a pod, a vLLM container beside the sidecar's), so the process that runs a demo or a
benchmark cannot import vLLM: it starts this module with vLLM's Python and talks to it over
pipes. vLLM logs to stdout as well, so answers are the lines that start with `{"event"`.

Prints {"event": "ready"} once the engine is up, then answers each line
{"requests": [{"token_ids": [...], "max_tokens": N, "tracks": [...], "deadline": S,
"max_kl": KL, "logprobs": K}, ...]} (`tracks`, `deadline` and `max_kl`: the kvmoq load's,
optional, as the connector's `kvmoq_tracks`, `kvmoq_deadline` and `kvmoq_max_kl`;
`logprobs`: top K per generated position, -1 for the whole vocabulary, default 5) with one
line {"event": "generated", "seconds": S, "outputs": [...]}: S is the wall time of the
batch, each output the greedy token ids and text, the log-probabilities, and the prompt
tokens vLLM did not compute (`cached_tokens`: its own prefix cache and the connector's
loads). Top-K log-probabilities come as `logprobs`, a {token id: value} object per position;
the whole vocabulary's as `vocabulary_logprobs`, base64 of little-endian float32
`[positions, vocabulary]` in token id order (and `logprobs` empty). The engine stops at the
end of stdin.

    python -m kvmoq_client.vllm.stdio_engine --model DIR --connector kvmoq --role kv_both \\
        --extra '{"sidecar": "unix:///run/kvmoq/sidecar.sock"}'
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from typing import Any

DEFAULT_LOGPROBS = 5
CONNECTORS = ("kvmoq", "example", "none")
"""`example` is vLLM's ExampleConnector (KV in safetensors files under
`shared_storage_path`), the reference a vLLM user already has."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model directory")
    parser.add_argument("--connector", choices=CONNECTORS, default="kvmoq", help="KV connector")
    parser.add_argument("--role", default="kv_both", help="kv_producer, kv_consumer, kv_both")
    parser.add_argument("--extra", default="{}", help="kv_connector_extra_config, JSON")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        help="the model's dtype in vLLM (default bfloat16: vLLM's CPU kernels run a 4096-token "
        "prefill 4x faster in it than in float16 where the CPU has AVX512-BF16)",
    )
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="turn vLLM's prefix cache off: every prompt is computed or loaded again",
    )
    args = parser.parse_args()

    from vllm import LLM
    from vllm.config import KVTransferConfig

    from kvmoq_client.vllm.settings import LOAD_FAILURE_POLICY, kv_transfer_config

    extra = json.loads(args.extra)
    transfer = None
    if args.connector == "kvmoq":
        transfer = KVTransferConfig(**kv_transfer_config(args.role, extra))
    elif args.connector == "example":
        transfer = KVTransferConfig(
            kv_connector="ExampleConnector",
            kv_role=args.role,
            kv_load_failure_policy=LOAD_FAILURE_POLICY,
            kv_connector_extra_config=extra,
        )
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enforce_eager=True,
        enable_prefix_caching=not args.no_prefix_caching,
        max_logprobs=-1,
        kv_transfer_config=transfer,
    )
    print(json.dumps({"event": "ready"}), flush=True)
    for line in sys.stdin:
        print(json.dumps(_generate(llm, json.loads(line)["requests"])), flush=True)


def _transfer_params(request: dict[str, Any]) -> dict[str, Any] | None:
    """The kvmoq `kv_transfer_params` a request line asks for, as vLLM's `extra_args`."""
    from kvmoq_client.vllm.scheduler import DEADLINE_PARAM, MAX_KL_PARAM, TRACKS_PARAM

    fields = ((TRACKS_PARAM, "tracks"), (DEADLINE_PARAM, "deadline"), (MAX_KL_PARAM, "max_kl"))
    params = {key: request[field] for key, field in fields if request.get(field)}
    return {"kv_transfer_params": params} if params else None


def _generate(llm: Any, batch: list[dict[str, Any]]) -> dict[str, Any]:
    prompts = [{"prompt_token_ids": r["token_ids"]} for r in batch]
    params = [_sampling(r) for r in batch]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    answers = [
        _answer(llm, out, p.logprobs == WHOLE_VOCABULARY)
        for out, p in zip(outputs, params, strict=True)
    ]
    return {"event": "generated", "seconds": seconds, "outputs": answers}


WHOLE_VOCABULARY = -1


def _sampling(request: dict[str, Any]) -> Any:
    """Greedy sampling. The whole vocabulary's log-probabilities come flat (one list, not an
    object per token) and without decoding each token's text: as vLLM's dicts of decoded
    tokens, a whole vocabulary costs the engine seconds per request."""
    from vllm import SamplingParams

    logprobs = request.get("logprobs", DEFAULT_LOGPROBS)
    whole = logprobs == WHOLE_VOCABULARY
    return SamplingParams(
        temperature=0,
        max_tokens=request["max_tokens"],
        logprobs=logprobs,
        flat_logprobs=whole,
        detokenize=not whole,
        extra_args=_transfer_params(request),
    )


def _answer(llm: Any, out: Any, whole: bool) -> dict[str, Any]:
    completion = out.outputs[0]
    token_ids = list(completion.token_ids)
    answer = {
        "token_ids": token_ids,
        "text": _decoded(llm, token_ids) if whole else completion.text,
        "cached_tokens": out.num_cached_tokens or 0,
        "logprobs": [],
    }
    if whole:
        answer["vocabulary_logprobs"] = _vocabulary_logprobs(completion.logprobs)
    else:
        answer["logprobs"] = [
            {str(token): entry.logprob for token, entry in position.items()}
            for position in completion.logprobs or ()
        ]
    return answer


def _decoded(llm: Any, token_ids: list[int]) -> str:
    """The text of `token_ids` as vLLM's own detokenizing gives it (special tokens skipped),
    for requests that told it not to detokenize."""
    return llm.get_tokenizer().decode(token_ids, skip_special_tokens=True)


def _vocabulary_logprobs(flat: Any) -> str:
    """vLLM's `FlatLogprobs` of every token at each position as base64 float32
    `[positions, vocabulary]`, by token id (the sampled token, listed first, again among
    the ranked ones)."""
    import numpy as np

    token_ids = np.asarray(flat.token_ids, dtype=np.int64)
    values = np.asarray(flat.logprobs, dtype=np.float32)
    vocabulary = int(token_ids.max()) + 1 if token_ids.size else 0
    table = np.full((len(flat), vocabulary), -np.inf, dtype="<f4")
    for position, (start, end) in enumerate(zip(flat.start_indices, flat.end_indices, strict=True)):
        table[position, token_ids[start:end]] = values[start:end]
    return base64.b64encode(table.tobytes()).decode()


if __name__ == "__main__":
    main()
