"""The client package stays light and stands alone: what an inference server imports."""

from __future__ import annotations

import subprocess
import sys

_CHECK = """
import sys
import kvmoq_client
assert "torch" not in sys.modules, "importing kvmoq_client pulled in torch"
import kvmoq_client.buffers, kvmoq_client.dynamic_cache, kvmoq_client.transformers_cache
leaked = sorted(name for name in sys.modules if name.split(".")[0] in ("sidecar", "tests"))
assert not leaked, leaked
"""


def test_the_client_imports_without_torch_and_never_imports_the_sidecar() -> None:
    subprocess.run([sys.executable, "-c", _CHECK], cwd="/", check=True, timeout=120)
