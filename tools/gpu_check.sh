#!/usr/bin/env bash
# The GPU evidence run, for a CUDA machine with no network whose Python/PyTorch may differ from
# the development machine's:
#   tools/gpu_check.sh OUTDIR [--skip-sanitizer] [--python-sanitizer] [--skip-report]
#                             [--pytest-args "..."] [--report-args "..."] [--demo-args "..."]
# It builds fusedops from this tree in one CMake build (C++ tests and the Python extension, for
# the GPU it finds), runs the C++ tests (one process per test suite, so a fault in one cannot
# poison the others) and the Python tests (one process per file), the C++ suite again under
# compute-sanitizer memcheck (with --python-sanitizer also a reduced Python set, slow), and the
# operator report. OUTDIR receives few files: summary.txt, report.json, report.png and
# logs.tgz (every log and the per-suite test results).
# Peer libraries (liger-kernel, flash-linear-attention) are installed from wheels in .whl/ when
# present, and GoogleTest is built from .gpu/googletest when the machine has none installed.
set -uo pipefail
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"; shift
SANITIZER=1
PY_SANITIZER=0
REPORT_ARGS=""
REPORT=1
PYTEST_ARGS=""
DEMO_ARGS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-sanitizer) SANITIZER=0 ;;
    --python-sanitizer) PY_SANITIZER=1 ;;
    --report-args) REPORT_ARGS="$2"; shift ;;
    --pytest-args) PYTEST_ARGS="$2"; shift ;;
    --skip-report) REPORT=0 ;;
    --demo-args) DEMO_ARGS="$2"; shift ;;
  esac
  shift
done
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
WORK="${WORK:-/tmp/fusedops-gpu}"
LOGS="$WORK/logs"
rm -rf "$LOGS" && mkdir -p "$LOGS"
status=0
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
step() { echo; echo "== $* ($(date +%T))"; }
fail() { note "FAILED: $*"; status=1; }
finish() { tar czf "$OUT/logs.tgz" -C "$WORK" logs 2>/dev/null; }
trap finish EXIT

step "machine"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  "$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
} | tee -a "$SUMMARY"
ARCH="$("$PY" -c 'import torch; p = torch.cuda.get_device_capability(); print(f"{p[0]}{p[1]}" + ("a" if p[0] == 9 else ""))')"
if [ -z "${FUSEDOPS_COMMIT:-}" ]; then
  if [ -f "$ROOT/.commit" ]; then FUSEDOPS_COMMIT="$(cat "$ROOT/.commit")"
  else FUSEDOPS_COMMIT="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"; fi
fi
export FUSEDOPS_COMMIT
note "commit $FUSEDOPS_COMMIT, building for sm_$ARCH"

if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
  step "peer wheels"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$ROOT"/.whl/*.whl \
    >"$LOGS/wheels.log" 2>&1 || fail "wheel install"
fi

# oneDNN (the CPU GEMMs; required by the build): its two PyPI wheels (onednn-cpu-gomp,
# onednn-devel-cpu-gomp) from .whl/ into a prefix that CMake is pointed at.
DNNL_ARG=()
if compgen -G "$ROOT/.whl/onednn*gomp*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --prefix "$WORK/dnnl" "$ROOT"/.whl/onednn*gomp*.whl \
    >"$LOGS/onednn.log" 2>&1 || fail "oneDNN wheel install"
  DNNL_ARG=(-Ddnnl_ROOT="$WORK/dnnl")
fi

step "build (library, C++ tests, Python extension)"
GTEST_ARG=()
[ -d "$ROOT/.gpu/googletest" ] && GTEST_ARG=(-DFUSEDOPS_GTEST_SOURCE_DIR="$ROOT/.gpu/googletest")
cmake -S "$ROOT" -B "$WORK/build" -G Ninja -DFUSEDOPS_CUDA=ON -DFUSEDOPS_CUDA_ARCHS="$ARCH" \
  -DFUSEDOPS_BUILD_TESTS=ON -DFUSEDOPS_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$PY")" \
  "${GTEST_ARG[@]}" "${DNNL_ARG[@]}" >"$LOGS/cmake.log" 2>&1 || { tail -30 "$LOGS/cmake.log"; fail cmake; }
(cd "$ROOT" && tools/touch_changed.sh "$WORK/build")
cmake --build "$WORK/build" -j "$(nproc)" >"$LOGS/build.log" 2>&1 ||
  { grep -B2 -A8 "error" "$LOGS/build.log" | head -60; fail build; exit 1; }
rm -rf "$WORK/py" && mkdir -p "$WORK/py" && cp -r "$ROOT/python/fusedops" "$WORK/py/" &&
  cp "$WORK"/build/_C*.so "$WORK/py/fusedops/" || fail "python package"
export PYTHONPATH="$WORK/py:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

step "C++ tests (one process per suite)"
TESTS="$WORK/build/fusedops_tests"
mkdir -p "$LOGS/gtest"
for suite in $("$TESTS" --gtest_list_tests | grep -E '^[A-Za-z0-9_]+\.$' | tr -d '.'); do
  if "$TESTS" --gtest_filter="$suite.*" --gtest_output="json:$LOGS/gtest/$suite.json" >"$LOGS/gtest/$suite.log" 2>&1; then
    note "gtest $suite: $(grep -E '^\[  PASSED  \]' "$LOGS/gtest/$suite.log" | head -1)"
  else
    fail "gtest $suite"; tail -25 "$LOGS/gtest/$suite.log"
  fi
done

step "Python tests (one process per file)"
mkdir -p "$LOGS/pytest"
for f in $(find tests/python -name 'test_*.py' | sort); do
  name="$(basename "$f" .py)"
  # shellcheck disable=SC2086
  if "$PY" -m pytest "$f" -q -p no:cacheprovider $PYTEST_ARGS >"$LOGS/pytest/$name.log" 2>&1; then
    note "pytest $name: $(tail -1 "$LOGS/pytest/$name.log")"
  else
    fail "pytest $name: $(tail -1 "$LOGS/pytest/$name.log")"; grep -E "^(FAILED|ERROR)" "$LOGS/pytest/$name.log" | head -15
    # A crash: faulthandler's Python stack says which test and which call.
    grep -A14 "Fatal Python error" "$LOGS/pytest/$name.log" | head -16 | tee -a "$SUMMARY"
  fi
done

if [ "$SANITIZER" = 1 ]; then
  step "compute-sanitizer memcheck (C++ tests)"
  if compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 "$TESTS" \
      >"$LOGS/memcheck.log" 2>&1; then
    note "memcheck: $(grep -E 'ERROR SUMMARY' "$LOGS/memcheck.log" | tail -1)"
  else
    fail "memcheck: $(grep -E 'ERROR SUMMARY' "$LOGS/memcheck.log" | tail -1)"; grep -B2 -A12 "Invalid\|FAILED" "$LOGS/memcheck.log" | head -40
  fi
fi
if [ "$PY_SANITIZER" = 1 ]; then
  step "compute-sanitizer memcheck (reduced Python CUDA tests)"
  compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 \
    "$PY" -m pytest tests/python -q -p no:cacheprovider -k "cuda and not compile and not opcheck" -x \
    >"$LOGS/memcheck_py.log" 2>&1 || fail "memcheck (python)"
  note "memcheck python: $(grep -E 'ERROR SUMMARY' "$LOGS/memcheck_py.log" | tail -1)"
fi

if [ "$REPORT" = 1 ]; then
  step "operator report"
  # shellcheck disable=SC2086
  "$PY" bench/report.py --device cuda --json "$OUT/report.json" --plot "$OUT/report.png" $REPORT_ARGS \
    2>&1 | tee "$LOGS/report.log" || fail "report"
fi

if [ -n "$DEMO_ARGS" ]; then
  step "end to end: examples/train_hybrid.py $DEMO_ARGS"
  # shellcheck disable=SC2086
  "$PY" examples/train_hybrid.py $DEMO_ARGS --json "$OUT/train_hybrid.json" --plot "$OUT/train_hybrid.png" \
    2>&1 | tee "$LOGS/train_hybrid.log" || fail "train_hybrid"
  tail -25 "$LOGS/train_hybrid.log" >>"$SUMMARY"
fi

echo
[ $status = 0 ] && note "gpu_check: all steps passed" || note "gpu_check: some steps FAILED"
exit $status
