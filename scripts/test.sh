#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs the linter and the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k policies
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
.venv/bin/python -m ruff check .
OMP_NUM_THREADS=1 .venv/bin/python -m pytest "$@"
