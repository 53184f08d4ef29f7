#!/usr/bin/env bash
# Sets up a fresh machine: a virtual environment in .venv with the Python requirements,
# and the Thrift compiler (needed only to regenerate gen-py/ and by its test).
# Usage: scripts/setup.sh            (idempotent; re-run after pulling)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r requirements-dev.txt
if ! command -v thrift >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing the Thrift compiler"
    apt-get update -qq && apt-get install -y -qq thrift-compiler >/dev/null
  else
    echo "note: the Thrift compiler is not installed; only needed to regenerate gen-py/" \
         "(Debian/Ubuntu: sudo apt-get install thrift-compiler)" >&2
  fi
fi
echo "set up: activate with 'source .venv/bin/activate'"
