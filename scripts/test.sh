#!/usr/bin/env bash
# Runs lint and the test suite in the project venv. Extra args go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the fast subset, or `-n 0` to run
# in one process. Files run whole on KVMOQ_TEST_WORKERS workers (default 2): tests
# in a file share engines and relays through module fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
.venv/bin/ruff check .
.venv/bin/python -m pytest -n "${KVMOQ_TEST_WORKERS:-2}" --dist loadfile "$@"
