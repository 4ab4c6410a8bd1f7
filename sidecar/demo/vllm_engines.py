"""vLLM engines as child processes, for the demo, `kvmoq bench vllm` and the connector tests.

vLLM lives in its own environment (`.venv-vllm`, made by scripts/setup.sh; in a deployment,
its own container), so an engine here is `kvmoq_client.vllm.stdio_engine` run with that
environment's Python: requests go in on its stdin, answers come back on its stdout. Engines
take about 35 s to start on this machine; callers start each once and send it many requests.
"""

from __future__ import annotations

import base64
import json
import math
import queue
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.demo.children import Child, ChildFailed, Children

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MODEL_DIR = REPO / ".cache" / "smollm2-hf"
"""SmolLM2-135M as a Hugging Face directory (vLLM cannot read the GGUF file)."""
ENGINE_START_S = 300.0
GENERATE_S = 600.0
ENGINE_STOP_S = 60.0
KV_CACHE_GIB = 1
"""vLLM's CPU KV cache per engine (`VLLM_CPU_KVCACHE_SPACE`): 45k SmolLM2 tokens."""
RESERVED_CPUS = 0
"""Cores vLLM keeps its compute threads off (`VLLM_CPU_NUM_OF_RESERVED_CPU`). Left to
itself it reserves one core for its scheduler process and one more when a KV connector is
configured; where that is every core (2 here) it reserves none. So on this machine a plain
engine computed on one core and a connector's engine on two: a plain 4096-token prefill took
15 s, the same prefill 8 s beside a connector. Every engine here computes on every core, so
the baselines are not slowed by a setting the engines they are compared with escape."""
MAX_MODEL_LEN = 8192
ANSWER = '{"event": "generated"'


SETUP = REPO / "scripts" / "setup.sh"


def unavailable_reason() -> str | None:
    """Why vLLM engines cannot run here, or None when they can."""
    if not VLLM_PYTHON.exists():
        return f"no {VLLM_PYTHON} (`bash scripts/setup.sh vllm` makes it)"
    return None


def set_up_vllm() -> str | None:
    """Make vLLM's environment in a checkout that lacks it (`scripts/setup.sh vllm`, about
    3 minutes, its output shown); why vLLM engines still cannot run, or None when they can."""
    if (reason := unavailable_reason()) is None or not SETUP.exists():
        return reason
    print(f"kvmoq demo --engine vllm: making {VLLM_PYTHON.parent.parent} (about 3 minutes)")
    if subprocess.run(["bash", str(SETUP), "vllm"], check=False).returncode != 0:
        return f"{SETUP} vllm failed (its output is above)"
    return unavailable_reason()


def model_directory() -> Path:
    """The model directory vLLM loads, written from the GGUF file on first use."""
    from sidecar.models.smollm2 import write_hf_directory

    return write_hf_directory(MODEL_DIR)


@dataclass
class Output:
    token_ids: list[int]
    text: str
    cached_tokens: int
    logprobs: list[dict[str, float]]
    """Per generated position, the top tokens' log-probabilities (token id as a string);
    empty where the stdio engine sent the whole vocabulary's (`vocabulary_logprobs`)."""
    vocabulary_logprobs: str | None = None
    """Every token's log-probability at each position: base64 of float32 `[positions,
    vocabulary]` by token id, the stdio engine's answer to a request for all of them."""

    def vocabulary_table(self) -> torch.Tensor:
        """`[positions, vocabulary]` float64 log-probabilities, from `vocabulary_logprobs`
        or from `logprobs` where each position lists every token (an OpenAI-style server's
        answer for the whole vocabulary)."""
        import torch

        if self.vocabulary_logprobs is not None:
            raw = bytearray(base64.b64decode(self.vocabulary_logprobs))
            flat = torch.frombuffer(raw, dtype=torch.float32)
            return flat.reshape(len(self.token_ids), -1).to(torch.float64)
        vocabulary = max(int(token) for position in self.logprobs for token in position) + 1
        table = torch.full((len(self.logprobs), vocabulary), -math.inf, dtype=torch.float64)
        for at, position in enumerate(self.logprobs):
            tokens = torch.tensor([int(token) for token in position])
            table[at, tokens] = torch.tensor(list(position.values()), dtype=torch.float64)
        return table


@dataclass(frozen=True)
class Answer:
    seconds: float
    """Wall time of the batch in the engine: with one request and one token, its TTFT."""
    outputs: list[Output]


class Engine:
    """A running stdio engine: requests in on its stdin, answers on its stdout."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        """Answers only: vLLM logs to stdout too (a load failure it recovers from, say).
        None once the engine's stdout ends: it exited, and no answer will come."""
        assert self.child.process.stdout is not None
        for line in self.child.process.stdout:
            if line.startswith(ANSWER):
                self._answers.put(line)
            else:
                self.child.extra_lines.append(line)
        self._answers.put(None)

    def run(self, *requests: dict[str, Any]) -> Answer:
        """Greedy outputs of `requests` ({"token_ids", "max_tokens", "tracks"?,
        "logprobs"?}), in one batch."""
        stdin = self.child.process.stdin
        assert stdin is not None
        stdin.write(json.dumps({"requests": list(requests)}) + "\n")
        stdin.flush()
        try:
            line = self._answers.get(timeout=GENERATE_S)
        except queue.Empty:
            raise AssertionError(
                f"{self.child.name} did not answer:\n{self.child.log_tail()}"
            ) from None
        if line is None:
            self._answers.put(None)  # for any later call
            raise ChildFailed(
                f"{self.child.name} exited with {self.child.process.wait()}:\n"
                f"{self.child.log_tail()}"
            )
        reply = json.loads(line)
        return Answer(reply["seconds"], [Output(**output) for output in reply["outputs"]])


def close_engines(*engines: Engine) -> None:
    """End each engine's stdin, then wait for all: each shuts down (a kvmoq connector
    unregisters and removes its shared memory), side by side, as each takes seconds."""
    for engine in engines:
        stdin = engine.child.process.stdin
        assert stdin is not None
        stdin.close()
    for engine in engines:
        engine.child.process.wait(ENGINE_STOP_S)


def start_engine(
    children: Children,
    name: str,
    connector: str = "kvmoq",
    *,
    role: str = "kv_both",
    extra: dict[str, Any] | None = None,
    prefix_caching: bool = True,
    dtype: str = "bfloat16",
) -> Engine:
    """A vLLM engine serving SmolLM2 with `connector` ("kvmoq", "example" or "none").

    bfloat16 by default, as vLLM on CPUs is run: here a 4096-token prefill takes 7-8 s in it,
    about 4x longer in float16 (no AVX512-FP16 on these CPUs).
    """
    argv = [
        str(VLLM_PYTHON), "-m", "kvmoq_client.vllm.stdio_engine",
        "--model", str(model_directory()), "--connector", connector, "--role", role,
        "--extra", json.dumps(extra or {}), "--dtype", dtype,
        "--max-model-len", str(MAX_MODEL_LEN),
    ]  # fmt: skip
    if not prefix_caching:
        argv.append("--no-prefix-caching")
    child = children.start(
        name,
        argv,
        ready_prefix='{"event": "ready"',
        timeout=ENGINE_START_S,
        env=engine_env(),
        stdin=True,
    )
    return Engine(child)


def engine_env() -> dict[str, str]:
    """What every vLLM process started here runs with, besides this process's environment:
    its CPU KV cache, every core to compute on, no hub."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": str(RESERVED_CPUS),
        "HF_HUB_OFFLINE": "1",
    }
