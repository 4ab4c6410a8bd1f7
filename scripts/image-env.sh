#!/usr/bin/env bash
# The Python environment of the kvmoq container image: a venv at $1 with the kvmoq
# distribution and the client library installed from this tree (not editable), with the pins
# of pyproject.toml (torch==2.13.0: the one pin of torch, shared with scripts/setup.sh).
# The Containerfile runs this script; tests/test_image.py runs it into a scratch directory,
# so the image's recipe is exercised on every CI run without a container engine.
#
# KVMOQ_TORCH_INDEX: an extra index for torch's build (the Containerfile passes PyTorch's CPU
# or CUDA index; a local build such as 2.13.0+cpu satisfies the ==2.13.0 pin). Empty: pip's
# own configuration decides (on the dev machines, the CPU wheel on local disk).
set -euo pipefail
prefix=${1:?usage: scripts/image-env.sh PREFIX}
src=$(cd "$(dirname "$0")/.." && pwd)
extra=()
if [ -n "${KVMOQ_TORCH_INDEX:-}" ]; then
    extra=(--extra-index-url "$KVMOQ_TORCH_INDEX")
fi
# The Python the sidecar is tied to (the CPU torch wheel here, the image's base): as setup.sh.
"${KVMOQ_PYTHON:-python3.11}" -m venv "$prefix"
"$prefix/bin/pip" install --no-cache-dir --quiet "${extra[@]}" \
    "$src/clients/python" "$src[fast]"
# A wheel build leaves build/ and *.egg-info in the tree; the image has no use for them.
rm -rf "$src/build" "$src/clients/python/build"
