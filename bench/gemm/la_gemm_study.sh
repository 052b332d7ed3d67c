#!/bin/bash
# The linear-attention CPU GEMM before and after a change: builds bench/gemm/la_gemm_bench.cpp
# against this tree's src/ops/linear_attention/la_cpu_kernels.h and against the header at commit
# BASE (first argument), runs both (single thread) and writes the two tables to OUT (second
# argument, default stdout). Run from the repository root on an idle machine.
#   bench/gemm/la_gemm_study.sh d11eb08 bench/results/cpu/studies/la_gemm-<date>.txt
set -eu
BASE=${1:?base commit}
OUT=${2:-/dev/stdout}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/base/src/ops/linear_attention"
git show "$BASE:src/ops/linear_attention/la_cpu_kernels.h" > "$W/base/src/ops/linear_attention/la_cpu_kernels.h"
FLAGS=(-std=c++20 -O3 -DNDEBUG -march=native -fno-trapping-math -I. -Iinclude)
g++ "${FLAGS[@]}" "-DLA_HEADER=\"$W/base/src/ops/linear_attention/la_cpu_kernels.h\"" bench/gemm/la_gemm_bench.cpp -o "$W/base_bench"
g++ "${FLAGS[@]}" bench/gemm/la_gemm_bench.cpp -o "$W/this_bench"
{
  echo "la::cpu::gemm, one thread, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%F), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "## header at $BASE"
  "$W/base_bench"
  echo
  echo "## header at $(git rev-parse --short HEAD)$(git diff --quiet -- src/ops/linear_attention/la_cpu_kernels.h || echo ' + uncommitted changes')"
  "$W/this_bench"
} > "$OUT"
