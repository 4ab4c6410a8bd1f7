#!/usr/bin/env bash
# The GPU path on a machine with a CUDA GPU and no package index (the lent `device`
# machines: Python 3.12, torch with CUDA, grpcio, protobuf, nvidia-ml-py): installs the
# wheels scripts/gpu-wheels.sh made here (.whl/, carried with the tree), runs every CUDA test
# (and the codec tests, on that machine's torch), then `kvmoq bench gpu`: a 32k-token
# Llama-3-8B prompt published and loaded in place over CUDA IPC, every byte checked.
# Under 8 minutes on one H100.
#
#   scripts/gpu-check.sh [OUT]    the bench's figures go to OUT/gpu-bench.json (default out/)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out}
mkdir -p "$out"
PY=${KVMOQ_GPU_PYTHON:-python3}
export PYTHONUNBUFFERED=1

site=$(mktemp -d)
if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
fi
export PYTHONPATH="$PWD:$PWD/clients/python/src:$site${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'PY'
import sys

import google.protobuf
import grpc
import torch

print(
    f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}),"
    f" grpcio {grpc.__version__}, protobuf {google.protobuf.__version__},"
    f" GPU {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}"
)
sys.exit(0 if torch.cuda.is_available() else "gpu-check: torch sees no CUDA GPU")
PY

"$PY" -m pytest -q -p no:cacheprovider -o addopts= --timeout 300 -rs \
    tests/kvcache/test_codec_devices.py tests/kvcache/test_codec_rotation.py \
    tests/kvcache/test_codec_fixed.py tests/tensors tests/service/test_buffers.py \
    tests/service/test_gpu_sidecar.py
"$PY" -m sidecar.cli bench gpu --json "$out/gpu-bench.json"
