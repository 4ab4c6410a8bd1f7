"""Mooncake in `kvmoq bench vllm`: the peer a vLLM operator picks today to move KV between
engines, run beside kvmoq on the same prompts and links.

Two vLLM OpenAI API servers with vLLM's MooncakeConnector over Mooncake's transfer engine
(protocol `tcp`), driven as vLLM's disaggregated-prefill proxy drives them: P
(`kv_producer`) prefills a request that asks it to keep the KV for a decoder
(`do_remote_decode`, one token), then D (`kv_consumer`, prefix cache off) gets the same
prompt naming P (`do_remote_prefill`: P's engine id, its bootstrap server, the transfer's
id) and pulls the prompt's KV from P's memory before it computes. D's wall time for that
request is its TTFT, as D's is for kvmoq's loads. Mooncake moves the KV as vLLM holds it
(bf16 here): no compression.

Servers, not the offline `LLM` engines the rest of the bench runs: P's engine must keep
stepping after its request ends to answer D's pull, which an offline engine, stepping only
inside `generate`, does not.

Mooncake's package for machines without CUDA (`mooncake-transfer-engine-non-cuda`, in
`.venv-vllm`; scripts/setup.sh installs it) links the RDMA libraries even for TCP (Debian's
libibverbs1, libnl-3-200, libnl-route-3-200), and vLLM's connector asks torch for an
accelerator at start-up: `bench/mooncake_cpu/sitecustomize.py` answers that one call.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.demo.children import Child, Children
    from sidecar.demo.vllm_engines import Answer

SHIM = Path(__file__).resolve().parent / "mooncake_cpu"
P_ENGINE = "mooncake-p"
PROTOCOL = "tcp"
HOST = "127.0.0.1"
"""Where the servers and transfer engines listen: vLLM would take the address of the
default route, and the bench's network namespace has none."""
TOKEN_ID = "token_id:"
"""How the server names a token when asked to (`return_tokens_as_token_ids`): its id, not
its text, which several ids can share."""
READY_POLL_S = 0.5
SETUP_HINT = (
    "`bash scripts/setup.sh` installs it, with Debian's libibverbs1, libnl-3-200 and "
    "libnl-route-3-200"
)


def unavailable_reason() -> str | None:
    """Why Mooncake's engines cannot run here, or None: its transfer engine must load in
    vLLM's environment (it does not without the RDMA libraries)."""
    from sidecar.demo.vllm_engines import VLLM_PYTHON

    probe = subprocess.run(
        [str(VLLM_PYTHON), "-c", "from mooncake.engine import TransferEngine"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode == 0:
        return None
    said = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    return f"Mooncake's transfer engine does not load in {VLLM_PYTHON} ({said}; {SETUP_HINT})"


@dataclass
class Server:
    """One of vLLM's OpenAI API servers, a child process."""

    child: Child
    url: str

    @classmethod
    def start(
        cls,
        children: Children,
        name: str,
        role: str,
        dtype: str,
        env: dict[str, str],
        *flags: str,
    ) -> Server:
        """Serve SmolLM2 with Mooncake's connector in `role`; return once it answers."""
        from sidecar.address import free_tcp_port
        from sidecar.demo import vllm_engines

        port = free_tcp_port(HOST)
        transfer = {
            "kv_connector": "MooncakeConnector",
            "kv_role": role,
            "engine_id": P_ENGINE if role == "kv_producer" else "mooncake-d",
            "kv_connector_extra_config": {"mooncake_protocol": PROTOCOL},
        }
        argv = [
            str(vllm_engines.VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(vllm_engines.model_directory()), "--host", HOST, "--port", str(port),
            "--dtype", dtype, "--max-model-len", str(vllm_engines.MAX_MODEL_LEN),
            "--enforce-eager", "--max-logprobs", "-1", "--enable-prompt-tokens-details",
            "--kv-transfer-config", json.dumps(transfer), *flags,
        ]  # fmt: skip
        shim = os.pathsep.join(filter(None, (str(SHIM), os.environ.get("PYTHONPATH"))))
        child = children.start(
            name,
            argv,
            ready_prefix=None,
            timeout=vllm_engines.ENGINE_START_S,
            env=vllm_engines.engine_env() | {"PYTHONPATH": shim, "VLLM_HOST_IP": HOST} | env,
        )
        server = cls(child, f"http://{HOST}:{port}")
        server._wait_ready(vllm_engines.ENGINE_START_S)
        return server

    def _wait_ready(self, timeout: float) -> None:
        from sidecar.demo.children import ChildFailed

        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            if (status := self.child.process.poll()) is not None:
                raise ChildFailed(
                    f"{self.child.name} exited with {status}:\n{self.child.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=READY_POLL_S):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(READY_POLL_S)
        raise ChildFailed(f"{self.child.name} silent for {timeout:.0f} s:\n{self.child.log_tail()}")

    def complete(self, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """POST /v1/completions: its wall time and the server's reply."""
        data = json.dumps(body).encode()
        post = urllib.request.Request(
            f"{self.url}/v1/completions", data, {"Content-Type": "application/json"}
        )
        from sidecar.demo.vllm_engines import GENERATE_S

        start = time.perf_counter()
        try:
            with urllib.request.urlopen(post, timeout=GENERATE_S) as reply:
                answer = json.load(reply)
        except urllib.error.HTTPError as error:
            raise AssertionError(
                f"{self.child.name} refused a request ({error.code}): {error.read()[:500]!r}"
            ) from None
        return time.perf_counter() - start, answer

    def close(self) -> None:
        self.child.stop()


@dataclass
class Mooncake:
    """P and D, once started: each `run` is one disaggregated request."""

    p: Server
    d: Server
    bootstrap: str
    _transfers: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def start(cls, children: Children, dtype: str) -> Mooncake:
        """P and D side by side (each spends most of its start importing)."""
        from sidecar.address import free_tcp_port

        port = free_tcp_port(HOST)
        starts = [
            ("mooncake p", "kv_producer", {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(port)}, ()),
            ("mooncake d", "kv_consumer", {}, ("--no-enable-prefix-caching",)),
        ]
        with concurrent.futures.ThreadPoolExecutor(len(starts)) as pool:
            futures = [
                pool.submit(Server.start, children, name, role, dtype, env, *flags)
                for name, role, env, flags in starts
            ]
            p, d = (future.result() for future in futures)
        return cls(p, d, f"http://{HOST}:{port}")

    def run(self, request: dict[str, Any]) -> Answer:
        """D's answer to `request` (`bench.vllm.request`'s fields: token ids, max tokens,
        log-probabilities), its KV pulled from P, which prefills it first."""
        transfer = f"bench-{next(self._transfers)}"
        prefill = {"do_remote_decode": True, "transfer_id": transfer}
        self.p.complete(_body(request["token_ids"], 1, None, prefill))
        pull = {
            "do_remote_prefill": True,
            "remote_engine_id": P_ENGINE,
            "remote_bootstrap_addr": self.bootstrap,
            "transfer_id": transfer,
        }
        body = _body(request["token_ids"], request["max_tokens"], request["logprobs"], pull)
        seconds, reply = self.d.complete(body)
        return _answer(seconds, reply)

    def close(self) -> None:
        for server in (self.d, self.p):
            server.close()


def _body(
    token_ids: list[int], max_tokens: int, logprobs: int | None, transfer: dict[str, Any]
) -> dict[str, Any]:
    """A greedy completion of `token_ids`; its tokens come back as ids, and so do those of
    its log-probabilities (`logprobs`: top K per position, -1 for the whole vocabulary)."""
    from sidecar.demo.vllm_engines import model_directory

    return {
        "model": str(model_directory()),
        "prompt": token_ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": logprobs,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "kv_transfer_params": transfer,
    }


def _answer(seconds: float, reply: dict[str, Any]) -> Answer:
    """The server's reply as the bench's engines answer (`vllm_engines.Answer`)."""
    from sidecar.demo.vllm_engines import Answer, Output

    (choice,) = reply["choices"]
    logprobs = choice["logprobs"] or {"top_logprobs": []}
    details = reply["usage"].get("prompt_tokens_details") or {}
    output = Output(
        token_ids=choice["token_ids"],
        text=choice["text"],
        cached_tokens=details.get("cached_tokens") or 0,
        logprobs=[
            {token.removeprefix(TOKEN_ID): value for token, value in (top or {}).items()}
            for top in logprobs["top_logprobs"]
        ],
    )
    return Answer(seconds, [output])
