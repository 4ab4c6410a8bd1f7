#!/usr/bin/env bash
# Regenerates the Python stubs of proto/kvmoq/v1 into the client package, where both the
# client library and the sidecar import them (kvmoq_client.v1). The stubs are committed;
# tests/service/test_contract.py fails when they differ from what this script writes.
#
#   scripts/gen_proto.sh [OUT_DIR]   (default clients/python/src/kvmoq_client/v1)
#
# grpcio-tools is pinned: another version writes different (equally valid) code, and the
# runtime floor it stamps into the stubs decides the protobuf range the packages allow.
set -euo pipefail
cd "$(dirname "$0")/.."

GRPCIO_TOOLS_VERSION=1.85.1
PY=${KVMOQ_PYTHON:-.venv/bin/python}
out=${1:-clients/python/src/kvmoq_client/v1}

have=$("$PY" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))')
if [ "$have" != "$GRPCIO_TOOLS_VERSION" ]; then
    echo "gen_proto.sh: needs grpcio-tools==$GRPCIO_TOOLS_VERSION, found $have" >&2
    exit 1
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$PY" -m grpc_tools.protoc -I proto \
    --python_out="$scratch" --pyi_out="$scratch" --grpc_python_out="$scratch" \
    proto/kvmoq/v1/*.proto

# protoc names Python modules after proto paths (kvmoq.v1); they live in kvmoq_client.v1.
mkdir -p "$out"
for file in "$scratch"/kvmoq/v1/*.py "$scratch"/kvmoq/v1/*.pyi; do
    sed 's/^from kvmoq\.v1 import /from kvmoq_client.v1 import /' "$file" >"$out/$(basename "$file")"
done
