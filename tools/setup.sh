#!/usr/bin/env bash
# Installs what a fresh Debian machine with the C++/CUDA toolchain lacks for building and testing
# fusedops: Debian packages (only when missing) and a virtual environment in .venv (or $VENV)
# with the pinned Python packages. Idempotent; sourced by tools/test.sh and tools/report.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
# (The CPU GEMMs' oneDNN comes from PyPI with the Python packages below: tools/requirements-dev.txt.)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  python3 -m venv "$VENV"
fi
stamp="$VENV/.fusedops-requirements"
if ! cmp -s "$ROOT/tools/requirements-dev.txt" "$stamp" 2>/dev/null; then
  echo "setup: installing Python packages (torch is large: a few minutes the first time)"
  # --no-cache-dir: torch's wheels with their CUDA libraries take ~5 GB installed; a pip cache
  # would hold a second copy of them, and CI machines have failed with a full disk.
  "$VENV/bin/python" -m pip install -q --no-cache-dir --upgrade pip
  "$VENV/bin/python" -m pip install -q --no-cache-dir -r "$ROOT/tools/requirements-dev.txt"
  cp "$ROOT/tools/requirements-dev.txt" "$stamp"
fi
export PATH="$VENV/bin:$PATH"
