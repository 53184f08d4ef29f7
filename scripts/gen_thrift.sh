#!/usr/bin/env bash
# Regenerates gen-py/ from thrift/*.thrift. gen-py/ is committed; never edit it by hand.
# Usage: scripts/gen_thrift.sh [OUT_DIR]   (default: gen-py next to this script's parent)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-"$root/gen-py"}
command -v thrift >/dev/null || { echo "thrift compiler not found: apt-get install -y thrift-compiler" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
for f in "$root"/thrift/*.thrift; do
  thrift -r --gen py -out "$out" "$f"
done
