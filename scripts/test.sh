#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs the linter and the tests:
#   scripts/test.sh          the whole suite, as CI runs it, in parallel worker processes
#   scripts/test.sh --fast   the fast tier: the tests that start no process, use no socket
#                            and wait out no real deadline (pytest -m "not processes and
#                            not slow"; tests/unit and tests/bench)
# Further arguments go to pytest, e.g. scripts/test.sh --fast -k policies
# TEST_WORKERS sets how many pytest processes share the whole suite (default: 2 per core,
# since most end-to-end tests wait on their servers' deadlines rather than compute; the
# fast tier: one per core); TEST_WORKERS=0 runs either in one process.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tier=()
parallel=(-n "${TEST_WORKERS:-$((2 * $(nproc)))}" --dist loadgroup)
if [ "${1:-}" = "--fast" ]; then
  shift
  tier=(-m "not processes and not slow")
  parallel=(-n "$(nproc)")  # one worker per core: these tests compute, they do not wait
fi
[ "${TEST_WORKERS:-}" = 0 ] && parallel=()
scripts/setup.sh
.venv/bin/python -m ruff check .
OMP_NUM_THREADS=1 .venv/bin/python -m pytest "${tier[@]}" "${parallel[@]}" "$@"
