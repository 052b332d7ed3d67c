#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer (CPU code; any report fails the run):
#   1. every C++ GoogleTest suite, built with -fsanitize=address,undefined in build/asan;
#   2. the Python extension built the same way (the same build, its library shared) and the
#      pytest files of the operators that take indices, offsets or labels, run with the sanitizer
#      runtime preloaded into the (uninstrumented) Python interpreter: tools/sanitize_pytest.py.
# Options through the environment:
#   FUSEDOPS_SANITIZE_FILTER  GoogleTest filter for part 1 (default: every test)
#   FUSEDOPS_SANITIZE_PYTHON  0 skips part 2; a list of pytest paths replaces its default files
# Every test runs at its ordinary shapes (the C++ suite takes about 4 minutes under ASan on two
# busy cores; nothing needed shrinking).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
mkdir -p build
JOBS="$(nproc)"
start=$SECONDS

echo "== ASan + UBSan: C++ tests"
PYTHON="$(command -v python3)"
[ -n "${VIRTUAL_ENV:-}" ] && PYTHON="$VIRTUAL_ENV/bin/python"
[ -x "$ROOT/.venv/bin/python" ] && [ -z "${VIRTUAL_ENV:-}" ] && PYTHON="$ROOT/.venv/bin/python"
# One build for both parts: the sanitized core library links into the tests and the extension.
cmake -S . -B build/asan -G Ninja -DFUSEDOPS_CUDA=OFF -DFUSEDOPS_SANITIZE=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSEDOPS_BUILD_TESTS=ON -DFUSEDOPS_BUILD_PYTHON=ON \
  -DPython_EXECUTABLE="$PYTHON" >build/configure-asan.log 2>&1 ||
  { cat build/configure-asan.log; exit 1; }
cmake --build build/asan -j "$JOBS" --target fusedops_tests
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
build/asan/fusedops_tests --gtest_filter="${FUSEDOPS_SANITIZE_FILTER:-*}" --gtest_brief=1
echo "(C++ under the sanitizers: $((SECONDS - start)) s)"

py_files="${FUSEDOPS_SANITIZE_PYTHON:-}"
if [ "$py_files" = "0" ]; then
  exit 0
fi
if [ -z "$py_files" ]; then
  py_files="tests/python/ops/test_sort_chunks_by_idx.py tests/python/ops/test_cross_entropy.py
    tests/python/ops/test_chunk_loss.py tests/python/ops/test_causal_conv1d.py
    tests/python/ops/test_clipped_swiglu.py tests/python/test_invalid_inputs.py
    tests/python/test_linear_attention_invalid_inputs.py tests/python/test_la_cp_and_gate_invalid_inputs.py
    tests/python/property/test_linear_attention_properties.py"
fi
py_start=$SECONDS
echo "== ASan + UBSan: the Python extension and the tests of the index-taking operators"
cmake --build build/asan -j "$JOBS" --target _C
module="$(ls build/asan/_C*.so | head -n 1)"
# The interpreter is not instrumented: the ASan runtime must be loaded first, and with it the
# C++ runtime (ASan's __cxa_throw interceptor finds the real one only if libstdc++ is loaded when
# ASan starts; the interpreter itself does not link it). Leaks of the interpreter and of torch are
# not ours (leak checking stays on for the C++ tests above); torch's own libraries use operator
# new/delete pairs ASan cannot see both halves of.
preload="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)"
# shellcheck disable=SC2086
LD_PRELOAD="$preload" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:alloc_dealloc_mismatch=0:detect_odr_violation=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_NUM_THREADS="$JOBS" \
  "$PYTHON" tools/sanitize_pytest.py "$module" -q -x --capture=sys -p no:cacheprovider $py_files
echo "(Python under the sanitizers: $((SECONDS - py_start)) s)"
