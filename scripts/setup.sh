#!/usr/bin/env bash
# Sets up a fresh machine: a virtual environment in .venv with the Python requirements,
# the Thrift compiler (needed only to regenerate gen-py/ and by its test) and headless
# Chromium with its driver (needed only by the dashboard's browser test).
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
# Headless Chromium and its WebDriver, for the dashboard's browser test (Selenium uses
# /usr/bin/chromedriver and never downloads a driver).
if [ ! -x /usr/bin/chromedriver ] || [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium and chromium-driver"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "note: chromium and chromium-driver are not installed; only needed by the dashboard's" \
         "browser test (Debian/Ubuntu: sudo apt-get install chromium chromium-driver)" >&2
  fi
fi
echo "set up: activate with 'source .venv/bin/activate'"
