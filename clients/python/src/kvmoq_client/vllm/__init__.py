"""kvmoq as a vLLM KV connector: `--kv-transfer-config` with `"kv_connector":
"KVMoqConnector", "kv_connector_module_path": "kvmoq_client.vllm"` (see `connector`).

`KVMoqConnector` is imported on first use, so `kvmoq_client.vllm.settings` (the config's
contract) can be read where vLLM is not installed: the sidecar injector writes the
`--kv-transfer-config` of the pods it injects with it.
"""

from typing import Any

__all__ = ["KVMoqConnector"]


def __getattr__(name: str) -> Any:
    if name == "KVMoqConnector":
        from kvmoq_client.vllm.connector import KVMoqConnector

        return KVMoqConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
