#!/usr/bin/env bash
# The README's test command: sets up what is missing, builds, and runs every test.
#   Build:  one CMake build (the library, the GoogleTest suite and the Python extension) through the
#           editable install (pip install -e ., in build/dev, the folder tools/report.sh builds in
#           too, so a report first leaves only the tests to compile). Without a visible
#           GPU it builds without CUDA (FUSEDOPS_CUDA=ON compiles the CUDA sources anyway; .ci/run
#           compiles them in a separate step); with a GPU, with CUDA, and the CUDA tests run.
#   C++:    the GoogleTest suite through ctest.
#   Python: the pytest suite; ruff over the Python code.
# Options through the environment: FUSEDOPS_CUDA=AUTO|ON|OFF, FUSEDOPS_CUDA_ARCHS, VENV.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
source tools/setup.sh

JOBS="$(nproc)"
if [ -z "${FUSEDOPS_CUDA:-}" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  export FUSEDOPS_CUDA=OFF
  echo "(no GPU visible: built without CUDA; FUSEDOPS_CUDA=ON compiles the CUDA sources too)"
fi
echo "== build: library, C++ tests and the Python extension"
BUILD=build/dev
python -m pip install -q --no-build-isolation -e . -C build-dir="$BUILD" -C cmake.define.FUSEDOPS_BUILD_TESTS=ON
[ -x "$BUILD/fusedops_tests" ] || { echo "tools/test.sh: no $BUILD/fusedops_tests after the build" >&2; exit 1; }

echo "== C++ tests"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS"

echo "== Python tests"
python -m pytest tests/python -q

echo "== ruff"
ruff check python bench tests tools
