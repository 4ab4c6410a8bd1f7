#!/usr/bin/env bash
# Makes .whl/: the wheels scripts/gpu-check.sh installs on a GPU machine that reaches no
# package index (Python 3.12, x86-64), at the versions this checkout's .venv runs. The
# machine's own image brings torch (with CUDA), numpy, nvidia-ml-py, rich, prometheus-client
# and pytest; these are the sidecar's other dependencies (`pip install 'kvmoq[sidecar,fast]'`
# less what the image has), about 20 MB.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
    aioquic pylsqpack pyOpenSSL service-identity cryptography cffi pycparser PyJWT structlog
    grpcio grpcio-health-checking grpcio-reflection protobuf constriction jsonpatch jsonpointer
    qh3
)
rm -rf .whl
mkdir .whl
for name in "${PACKAGES[@]}"; do
    version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$name'))")
    .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_34_x86_64 -d .whl "$name==$version"
done
du -sh .whl
