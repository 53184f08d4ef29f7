#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs the linter and the tests:
#   scripts/test.sh          the whole suite, as CI runs it
#   scripts/test.sh --fast   the fast tier: the tests that start no process and use no socket
#                            (pytest -m "not processes"; tests/unit and tests/bench)
# Further arguments go to pytest, e.g. scripts/test.sh --fast -k policies
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tier=()
if [ "${1:-}" = "--fast" ]; then
  shift
  tier=(-m "not processes")
fi
scripts/setup.sh
.venv/bin/python -m ruff check .
OMP_NUM_THREADS=1 .venv/bin/python -m pytest "${tier[@]}" "$@"
