#!/bin/bash
# Runs the CUDA kernels of the linear-attention families (GDN and KDA, cuda_sm80 and cuda_sm90) on
# the CPU: one std::thread per CUDA thread, std::barrier for __syncthreads, NaN-poisoned dynamic
# shared memory, launch-limit checks, the 16-bit mma and wgmma layers through emu_mma.h and
# emu_wgmma.h. The kernels register as CPU backends of their own names and run under both
# families' C++ tests. A test aid for machines without a GPU; not part of the build. The per-token
# backward on thread-block clusters (linear_attention_recurrent_bwd_sm90.cu) is left out: blocks run
# here one at a time, so a cluster's blocks could not wait for each other.
# Usage: build.sh BUILD_DIR [gtest filter]. BUILD_DIR: a CPU-only build of the library, e.g.
#   cmake -S . -B build/emu-cpu -G Ninja -DFUSEDOPS_CUDA=OFF -DFUSEDOPS_BUILD_TESTS=OFF -DFUSEDOPS_BUILD_PYTHON=OFF
#   ninja -C build/emu-cpu fusedops
# (a build with CUDA has CUDA objects in libfusedops.a, which do not link here).
set -e
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
HERE=$ROOT/src/ops/linear_attention/cpu_emulation
B=$1; OUT=${EMU_OUT:-/tmp/la_cpu_emulation}
L=$ROOT/src/ops/linear_attention
G=$ROOT/src/ops/gated_delta_rule
K=$ROOT/src/ops/kda
mkdir -p $OUT/shadow/src/cuda $OUT/shadow/src/ops/linear_attention
cp $HERE/emu_core.h $OUT/shadow/
cp $HERE/emu_mma.h $OUT/shadow/src/ops/linear_attention/la_mma_sm80.cuh  # the 16-bit kernels' PTX layer
cp $HERE/emu_wgmma.h $OUT/shadow/src/ops/linear_attention/la_wgmma_sm90.cuh  # and the sm90 kernels' (wgmma)
printf '#pragma once\n#include "emu_core.h"\n' > $OUT/shadow/cuda_runtime_api.h
printf '#pragma once\n#include "emu_core.h"\n#include "src/core/half.h"\nusing __nv_bfloat16 = fusedops::bf16_t;\ninline float __bfloat162float(__nv_bfloat16 v) { return fusedops::to_float(v); }\ninline __nv_bfloat16 __float2bfloat16_rn(float v) { return fusedops::float_to_bf16(v); }\n' > $OUT/shadow/cuda_bf16.h
printf '#pragma once\n#include "emu_core.h"\n#include "src/core/half.h"\nusing __half = fusedops::fp16_t;\ninline float __half2float(__half v) { return fusedops::to_float(v); }\ninline __half __float2half_rn(float v) { return fusedops::float_to_fp16(v); }\n' > $OUT/shadow/cuda_fp16.h
cat > $OUT/shadow/src/cuda/check.cuh <<'EOH'
#pragma once
#include "emu_core.h"
#include "fusedops/core/error.h"
#define FUSEDOPS_CUDA_CHECK(op, call) do { int e_ = (call); if (e_ != 0) FUSEDOPS_FAIL(kRuntime, op, "emu error"); } while (0)
#define FUSEDOPS_CUDA_LAUNCH_CHECK(op) FUSEDOPS_CUDA_CHECK(op, cudaGetLastError())
namespace fusedops::cuda { class DeviceGuard { public: DeviceGuard(const char*, int) {} }; }
EOH
HEADERS="$L/la_sm80.cuh $L/la_tc_sm80.cuh $L/la_wg_state_sm90.cuh $G/gdn_cuda.cuh $K/kda_sm80.cuh"
SOURCES="$(ls $L/linear_attention_*_sm80.cu $L/linear_attention_sm90.cu $G/*_sm80.cu $G/*_sm90.cu $K/*_sm80.cu $K/*_sm90.cu 2>/dev/null || true)"
python3 $HERE/prep.py $OUT/shadow $HEADERS $SOURCES
CXX="g++ -std=c++20 -O1 -w -I $OUT/shadow -I $ROOT/include -I $ROOT"
OBJS=""
for f in $SOURCES; do
  rel=${f#$ROOT/}; src=$OUT/shadow/${rel%.cu}.cpp; o=$OUT/$(basename ${rel%.cu}).o
  stale=0
  for h in $src $(for x in $HEADERS; do echo $OUT/shadow/${x#$ROOT/}; done); do [ $h -nt $o ] && stale=1; done
  if [ ! -f $o ] || [ $stale = 1 ]; then $CXX -c $src -o $o; fi
  OBJS="$OBJS $o"
done
$CXX -c $HERE/emu_register.cpp -o $OUT/emu_register.o
TESTS=""
for t in test_gated_delta_rule test_kda; do
  if [ ! -f $OUT/$t.o ] || [ $ROOT/tests/cpp/ops/$t.cpp -nt $OUT/$t.o ] || [ $ROOT/tests/cpp/ops/linear_attention_harness.h -nt $OUT/$t.o ]; then
    $CXX -O2 -c $ROOT/tests/cpp/ops/$t.cpp -o $OUT/$t.o
  fi
  TESTS="$TESTS $OUT/$t.o"
done
# The library's CPU GEMMs link oneDNN: the folder of the build's dnnl CMake config, two levels up.
DNNL=$(cd "$(grep -o "^dnnl_DIR:PATH=.*" $B/CMakeCache.txt | cut -d= -f2)/../.." && pwd)
g++ -o $OUT/emu_tests $TESTS $OUT/emu_register.o $OBJS $B/libfusedops.a -lgtest_main -lgtest -fopenmp -lpthread \
  -L$DNNL -ldnnl -Wl,-rpath,$DNNL
$OUT/emu_tests --gtest_filter="${2:-GatedDeltaRule*:ChunkGatedDeltaRule*:FusedRecurrentGatedDeltaRule*:Kda*}"
