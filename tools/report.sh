#!/usr/bin/env bash
# The README's main command: sets up what is missing, builds the Python extension, and runs the
# operator report on the default device (CUDA when present, else CPU). Extra arguments go to
# bench/report.py (e.g. --quick, --ops l2norm, --json out.json, --plot out.png).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
source tools/setup.sh
mkdir -p build
python -m pip install -q --no-build-isolation -e .
python bench/report.py "$@"
