#!/usr/bin/env bash
# The GPU evidence run, for a CUDA machine with no network whose Python/PyTorch may differ from
# the development machine's:
#   tools/gpu_check.sh OUTDIR [--skip-sanitizer] [--python-sanitizer] [--report-args "..."]
# It builds fusedops from this tree in one CMake build (C++ tests and the Python extension, for
# the GPU it finds), runs the C++ and Python test suites, the C++ suite again under
# compute-sanitizer memcheck (with --python-sanitizer also a reduced Python set, slow), and the
# operator report, writing logs and JSON into OUTDIR. Peer libraries
# (liger-kernel, flash-linear-attention) are installed from wheels in .whl/ when present, and
# GoogleTest is built from .gpu/googletest when the machine has none installed.
set -uo pipefail
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"; shift
SANITIZER=1
PY_SANITIZER=0
REPORT_ARGS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-sanitizer) SANITIZER=0 ;;
    --python-sanitizer) PY_SANITIZER=1 ;;
    --report-args) REPORT_ARGS="$2"; shift ;;
  esac
  shift
done
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
WORK="${WORK:-/tmp/fusedops-gpu}"
mkdir -p "$WORK"
status=0
step() { echo; echo "== $* ($(date +%T))"; }
fail() { echo "FAILED: $*"; status=1; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/machine.txt"
"$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/machine.txt"
ARCH="$("$PY" -c 'import torch; p = torch.cuda.get_device_capability(); print(f"{p[0]}{p[1]}" + ("a" if p[0] == 9 else ""))')"
echo "building for sm_$ARCH" | tee -a "$OUT/machine.txt"
(git rev-parse HEAD 2>/dev/null || cat "$ROOT/.commit" 2>/dev/null) | tee -a "$OUT/machine.txt"

if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
  step "peer wheels"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$ROOT"/.whl/*.whl || fail "wheel install"
fi

step "C++ build"
GTEST_ARG=()
[ -d "$ROOT/.gpu/googletest" ] && GTEST_ARG=(-DFUSEDOPS_GTEST_SOURCE_DIR="$ROOT/.gpu/googletest")
cmake -S "$ROOT" -B "$WORK/build" -G Ninja -DFUSEDOPS_CUDA=ON -DFUSEDOPS_CUDA_ARCHS="$ARCH" \
  -DFUSEDOPS_BUILD_TESTS=ON -DFUSEDOPS_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$PY")" \
  "${GTEST_ARG[@]}" >"$OUT/cmake.log" 2>&1 || { cat "$OUT/cmake.log"; fail cmake; }
cmake --build "$WORK/build" -j "$(nproc)" >"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; fail build; }

step "C++ tests"
"$WORK/build/fusedops_tests" --gtest_output="json:$OUT/gtest.json" >"$OUT/gtest.log" 2>&1 || fail "C++ tests"
tail -4 "$OUT/gtest.log"

step "Python package (the extension from the same build)"
rm -rf "$WORK/py" && mkdir -p "$WORK/py" && cp -r "$ROOT/python/fusedops" "$WORK/py/" &&
  cp "$WORK"/build/_C*.so "$WORK/py/fusedops/" || fail "python package"
export FUSEDOPS_COMMIT="${FUSEDOPS_COMMIT:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || cat "$ROOT/.commit" 2>/dev/null || echo unknown)}"
export PYTHONPATH="$WORK/py:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

step "Python tests"
"$PY" -m pytest tests/python -q -p no:cacheprovider >"$OUT/pytest.log" 2>&1 || fail "Python tests"
tail -6 "$OUT/pytest.log"

if [ "$SANITIZER" = 1 ]; then
  step "compute-sanitizer memcheck (C++ CUDA tests)"
  compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 \
    "$WORK/build/fusedops_tests" >"$OUT/memcheck.log" 2>&1 || fail "memcheck"
  tail -4 "$OUT/memcheck.log"
fi
if [ "$PY_SANITIZER" = 1 ]; then
  step "compute-sanitizer memcheck (reduced Python CUDA tests)"
  compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 \
    "$PY" -m pytest tests/python -q -p no:cacheprovider -k "cuda and not compile and not opcheck" -x \
    >"$OUT/memcheck_py.log" 2>&1 || fail "memcheck (python)"
  tail -4 "$OUT/memcheck_py.log"
fi

step "operator report"
# shellcheck disable=SC2086
"$PY" bench/report.py --device cuda --json "$OUT/report.json" --plot "$OUT/report.png" $REPORT_ARGS \
  2>&1 | tee "$OUT/report.log" || fail "report"

echo
[ $status = 0 ] && echo "gpu_check: all steps passed" || echo "gpu_check: some steps FAILED"
exit $status
