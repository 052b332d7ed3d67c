#!/usr/bin/env bash
# The C++-only path of docs/install.md, as a C++ user takes it: configures and builds the library
# alone (no Python extension, no tests, no CUDA), installs it into an empty prefix, then builds
# examples/cpp/quickstart.cpp and a matmul_add check (oneDNN's GEMM, against a loop in double) as
# a separate project that finds it with find_package(fusedops) (tests/cpp_package) and runs them.
# oneDNN comes from the .venv of tools/setup.sh, passed as dnnl_ROOT to both projects, as
# docs/install.md says.
#
#   tools/test_cpp_package.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
source tools/setup.sh >/dev/null
dnnl_root="$(python -c 'import sys; print(sys.prefix)')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
build="build/cpp-package"
cmake -S . -B "$build" -G Ninja -DFUSEDOPS_CUDA=OFF -DFUSEDOPS_BUILD_PYTHON=OFF -DFUSEDOPS_BUILD_TESTS=OFF \
  -Ddnnl_ROOT="$dnnl_root" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$build"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S tests/cpp_package -B "$work/consumer" -G Ninja -Dfusedops_ROOT="$work/prefix" \
  -Ddnnl_ROOT="$dnnl_root" >"$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; exit 1; }
cmake --build "$work/consumer"
"$work/consumer/quickstart"
"$work/consumer/matmul_add_check"
echo "installed fusedops found by a separate CMake project, which built and ran examples/cpp/quickstart.cpp and matmul_add_check"
