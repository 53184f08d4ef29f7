#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs the demo: 4 local compute nodes, the coordinator
# and the client with the recommended configuration; prints the final validation error.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
.venv/bin/python scripts/demo.py "$@"
