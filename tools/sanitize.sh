#!/usr/bin/env bash
# Builds the C++ core and its tests with AddressSanitizer + UndefinedBehaviorSanitizer (CPU only)
# and runs them. Any report fails the run. FUSEDOPS_SANITIZE_FILTER (a GoogleTest filter) limits
# the tests; default: all.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
mkdir -p build
cmake -S . -B build/asan -G Ninja -DFUSEDOPS_CUDA=OFF -DFUSEDOPS_SANITIZE=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSEDOPS_BUILD_TESTS=ON >build/configure-asan.log 2>&1 ||
  { cat build/configure-asan.log; exit 1; }
cmake --build build/asan -j "$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
build/asan/fusedops_tests --gtest_filter="${FUSEDOPS_SANITIZE_FILTER:-*}" --gtest_brief=1
