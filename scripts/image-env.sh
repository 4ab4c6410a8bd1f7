#!/usr/bin/env bash
# The Python environment of a kvmoq container image: a venv at $1 with the kvmoq
# distribution installed from this tree (not editable), with the pins of pyproject.toml.
# The Containerfile runs this script; tests/test_image.py runs it into a scratch directory,
# so the images' recipe is exercised on every CI run without a container engine.
#
#   scripts/image-env.sh PREFIX           # the kvmoq image: sidecar, relay, injector, CLI
#   scripts/image-env.sh PREFIX relay     # the relay image (IMAGE=relay): no torch
#
# The kvmoq image adds the `sidecar` extra and the client library, on the Python the sidecar
# is tested on (KVMOQ_PYTHON, python3.11 as in setup.sh), with scripts/constraints.txt's
# torch: an image is one tested build, where `pip install 'kvmoq[sidecar]'` takes the range
# that runs beside a GPU node's own torch. The relay image has no torch and runs on any
# Python >= 3.11 (KVMOQ_PYTHON).
#
# KVMOQ_TORCH_INDEX: an extra index for torch's build (the Containerfile passes PyTorch's CPU
# or CUDA index; a local build such as 2.13.0+cpu satisfies the pin). Empty: pip's own
# configuration decides (on the dev machines, the CPU wheel on local disk).
set -euo pipefail
prefix=${1:?usage: scripts/image-env.sh PREFIX [sidecar|relay]}
role=${2:-sidecar}
src=$(cd "$(dirname "$0")/.." && pwd)
case "$role" in
    sidecar) packages=("$src/clients/python" "$src[sidecar,fast]") ;;
    relay) packages=("$src[fast,pquic]") ;;
    *) echo "image-env.sh: unknown image '$role' (sidecar or relay)" >&2; exit 2 ;;
esac
extra=(-c "$src/scripts/constraints.txt")
if [ -n "${KVMOQ_TORCH_INDEX:-}" ]; then
    extra+=(--extra-index-url "$KVMOQ_TORCH_INDEX")
fi
"${KVMOQ_PYTHON:-python3.11}" -m venv "$prefix"
"$prefix/bin/pip" install --no-cache-dir --quiet "${extra[@]}" "${packages[@]}"
# A wheel build leaves build/ and *.egg-info in the tree; the image has no use for them.
rm -rf "$src/build" "$src/clients/python/build"
