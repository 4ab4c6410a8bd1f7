"""kvmoq as a vLLM KV connector: `--kv-transfer-config` with `"kv_connector":
"KVMoqConnector", "kv_connector_module_path": "kvmoq_client.vllm"` (see `connector`)."""

from kvmoq_client.vllm.connector import KVMoqConnector

__all__ = ["KVMoqConnector"]
