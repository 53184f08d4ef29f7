#!/usr/bin/env bash
# Sets up a fresh machine: a virtual environment in .venv with the Python requirements,
# the Thrift compiler (needed only to regenerate gen-py/ and by its test), headless
# Chromium with its driver (needed only by the dashboard's browser test) and Node.js with
# npm (needed only by the Node.js client example's tests) and PostgreSQL's server programs
# (needed only by the tests of the PostgreSQL run store, which start their own server).
# Usage: scripts/setup.sh            (idempotent; re-run after pulling)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
# pip runs again only when a requirements file changed since the last install (seconds
# saved at every test run)
wanted=$(cat requirements*.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.requirements-installed 2>/dev/null)" != "$wanted" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements-dev.txt
  echo "$wanted" > .venv/.requirements-installed
fi
# apt_install <what needs them> <packages>: installs them as root where apt-get is, or
# says how to. They are needed only by some tests, which fail without them under CI.
apt_install() {
  local needed_by=$1
  shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $*"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "note: $* not installed; only needed $needed_by" \
         "(Debian/Ubuntu: sudo apt-get install $*)" >&2
  fi
}
command -v thrift >/dev/null 2>&1 ||
  apt_install "to regenerate gen-py/ and by its test" thrift-compiler
# Selenium uses /usr/bin/chromedriver and never downloads a driver.
{ [ -x /usr/bin/chromedriver ] && [ -x /usr/bin/chromium ]; } ||
  apt_install "by the dashboard's browser test" chromium chromium-driver
{ command -v node && command -v npm; } >/dev/null 2>&1 ||
  apt_install "by the tests of the Node.js client example" nodejs npm
# The PostgreSQL tests start their own throwaway server (devtools/postgres_cluster.py).
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null ||
  apt_install "by the tests of the PostgreSQL run store" postgresql
# matplotlib builds its font cache (running fc-list) the first time it is imported: once
# here, not inside the first test that plots, which must start no process.
.venv/bin/python -c "import matplotlib.font_manager" 2>/dev/null || true
echo "set up: activate with 'source .venv/bin/activate'"
