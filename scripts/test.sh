#!/usr/bin/env bash
# Runs lint and the test suite in the project venv. Extra args go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the fast subset.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
