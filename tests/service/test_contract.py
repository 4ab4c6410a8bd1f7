"""The committed stubs are exactly what the pinned grpcio-tools makes of proto/."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STUBS = REPO / "clients" / "python" / "src" / "kvmoq_client" / "v1"


def _generated(directory: Path) -> dict[str, str]:
    return {
        path.name: path.read_text()
        for path in sorted(directory.iterdir())
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"))
    }


def test_committed_stubs_match_the_proto_files(tmp_path: Path) -> None:
    subprocess.run([REPO / "scripts" / "gen_proto.sh", tmp_path], check=True, timeout=120)
    fresh = _generated(tmp_path)
    assert fresh, "gen_proto.sh wrote no stubs"
    committed = _generated(STUBS)
    assert sorted(committed) == sorted(fresh), "stub files differ: run scripts/gen_proto.sh"
    stale = [name for name in fresh if committed[name] != fresh[name]]
    assert not stale, f"stale stubs {stale}: run scripts/gen_proto.sh"


def test_the_service_is_the_versioned_contract() -> None:
    from kvmoq_client.v1 import kv_cache_pb2

    service = kv_cache_pb2.DESCRIPTOR.services_by_name["KVCacheService"]
    assert service.full_name == "kvmoq.v1.KVCacheService"
    methods = {m.name: m for m in service.methods}
    assert sorted(methods) == ["Load", "Lookup", "Publish", "RegisterBuffers", "UnregisterBuffers"]
    assert methods["Load"].server_streaming
    assert not any(m.client_streaming for m in methods.values())
    handle = kv_cache_pb2.KVBuffer.DESCRIPTOR.fields_by_name["handle"].message_type
    assert [f.name for f in handle.oneofs_by_name["handle"].fields] == [
        "shared_memory",
        "cuda_ipc",
    ]
