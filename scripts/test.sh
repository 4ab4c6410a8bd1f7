#!/usr/bin/env bash
# Runs lint and the test suite in the project venv. Extra args go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the fast subset, or `-n 0` to run
# the first part in one process.
#
# Two parts: first every test but the `timing` ones, whole files on KVMOQ_TEST_WORKERS
# workers (default 3 on the 2-core machine: many tests wait on processes they started, and
# a third worker fills those gaps, 11.6 min instead of 12.8; tests in a file share engines
# and relays through module fixtures);
# then the `timing` tests alone, which time loads over paced links and stall watches that a
# second busy worker would starve. A part with nothing to run (exit 5) is not a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
.venv/bin/ruff check .

part() {
    local code=0
    KVMOQ_TEST_PHASE=$1 .venv/bin/python -m pytest "${@:2}" || code=$?
    [ "$code" -eq 5 ] && code=0
    return "$code"
}
status=0
part shared -n "${KVMOQ_TEST_WORKERS:-3}" --dist loadfile "$@" || status=$?
part timing "$@" -n 0 || status=$?
exit "$status"
