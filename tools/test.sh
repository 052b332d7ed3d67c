#!/usr/bin/env bash
# The README's test command: sets up what is missing, builds, and runs every test.
#   C++:    GoogleTest suite through ctest (CUDA sources compile when nvcc exists; CUDA tests
#           skip, with the reason, when no GPU is visible).
#   Python: the extension (pip install -e .) and the pytest suite; ruff over the Python code.
# Options through the environment: FUSEDOPS_CUDA=AUTO|ON|OFF, FUSEDOPS_CUDA_ARCHS, VENV.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
source tools/setup.sh

mkdir -p build
JOBS="$(nproc)"
echo "== C++ build and tests"
cmake -S . -B build/test -G Ninja -DFUSEDOPS_BUILD_TESTS=ON >build/configure-test.log 2>&1 ||
  { cat build/configure-test.log; exit 1; }
grep -E "^-- fusedops" build/configure-test.log || true
cmake --build build/test -j "$JOBS"
ctest --test-dir build/test --output-on-failure -j "$JOBS"

echo "== Python extension and tests"
# Without a GPU the C++ build above has already compiled every CUDA source; the extension is then
# built CPU-only, which halves the build time on CPU-only machines such as CI.
if [ -z "${FUSEDOPS_CUDA:-}" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  export FUSEDOPS_CUDA=OFF
  echo "(no GPU visible: the Python extension is built without CUDA)"
fi
python -m pip install -q --no-build-isolation -e .
python -m pytest tests/python -q

echo "== ruff"
ruff check python bench tests tools
