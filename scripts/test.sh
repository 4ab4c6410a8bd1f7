#!/usr/bin/env bash
# Runs lint and the test suite in the project venv. Extra args go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the fast subset, or `-n 0` to run
# the first part in one process.
#
# Two parts at once. The `timing` tests (loads over paced links, stall watches, deadlines)
# run in one process; they mostly wait (relays frozen on purpose, links paced), so they
# need little CPU, but need it when they ask. Every other test runs beside them, whole files
# on KVMOQ_TEST_WORKERS workers (default 3 on the 2-core machine: many tests wait on
# processes they started, and a third worker fills those gaps; tests in a file share
# engines and relays through module fixtures), under `nice`, so that what the timing tests
# start wins the CPU whenever both want it. The timing part's report follows the other's.
# A part with nothing to run (exit 5) is not a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
.venv/bin/ruff check .

pytest=(.venv/bin/python -m pytest)
timing_log=$(mktemp)
# Both parts run in the background, so that an interrupted run (Ctrl-C, SIGTERM) reaches
# this script at once and it stops both (tests/conftest.py: SIGTERM unwinds pytest, so the
# fixtures stop the relays, sidecars and engines the tests started).
trap 'left=$(jobs -p); [ -z "$left" ] || { kill $left; wait $left; } 2>/dev/null
      rm -f "$timing_log"' EXIT
trap 'exit 130' INT TERM

KVMOQ_TEST_PHASE=timing "${pytest[@]}" "$@" -n 0 >"$timing_log" 2>&1 &
timing=$!
KVMOQ_TEST_PHASE=shared nice -n 10 "${pytest[@]}" -n "${KVMOQ_TEST_WORKERS:-3}" \
    --dist loadfile "$@" &
shared=0
wait $! || shared=$?
timed=0
wait "$timing" || timed=$?
echo "---------------------------------- timing tests ----------------------------------"
cat "$timing_log"
for code in "$shared" "$timed"; do
    [ "$code" -eq 0 ] || [ "$code" -eq 5 ] || exit "$code"
done
