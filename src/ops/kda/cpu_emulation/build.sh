#!/bin/bash
# Runs the cuda_sm80 KDA kernels and cuda_sm90's forward (with the gated_delta_rule kernels the KDA pipeline
# dispatches to) on the CPU: one std::thread per CUDA thread, std::barrier for __syncthreads,
# NaN-poisoned dynamic shared memory, launch-limit checks; registered as a CPU backend named
# cuda_sm80 and run under tests/cpp/ops/test_kda.cpp. A test aid for machines without a GPU; not
# part of the build.
# Usage: build.sh BUILD_DIR (a CPU build with libfusedops.a, e.g. build/dev-NAME) [gtest filter]
set -e
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
HERE=$ROOT/src/ops/kda/cpu_emulation
B=$1; OUT=${EMU_OUT:-/tmp/kda_cpu_emulation}
mkdir -p $OUT/shadow/src/cuda
cp $ROOT/src/ops/gated_delta_rule/cpu_emulation/emu_core.h $OUT/shadow/  # the one emulation core (GDN and KDA)
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
G=$ROOT/src/ops/gated_delta_rule
K=$ROOT/src/ops/kda
mkdir -p $OUT/shadow/src/ops/gated_delta_rule
cp $G/cpu_emulation/emu_mma.h $OUT/shadow/src/ops/gated_delta_rule/gdn_mma_sm80.cuh  # the GDN 16-bit kernels' PTX layer
cp $G/cpu_emulation/emu_wgmma.h $OUT/shadow/src/ops/gated_delta_rule/gdn_wgmma_sm90.cuh  # and the sm90 kernels' (wgmma)
python3 $HERE/prep.py $OUT/shadow $G/gdn_sm80.cuh $G/gdn_tc_sm80.cuh $G/gated_delta_rule_fwd_sm80.cu $G/gated_delta_rule_bwd_sm80.cu \
  $K/kda_sm80.cuh $K/kda_sm80.cu $K/kda_bwd_sm80.cu $G/gated_delta_rule_fwd_sm90.cu $G/gated_delta_rule_bwd_sm90.cu $G/gated_delta_rule_bwd_dqkwg_sm90.cu $K/kda_sm90.cu
CXX="g++ -std=c++20 -O1 -w -I $OUT/shadow -I $ROOT/include -I $ROOT"
OBJS=""
for f in gated_delta_rule/gated_delta_rule_fwd_sm80 gated_delta_rule/gated_delta_rule_bwd_sm80 kda/kda_sm80 kda/kda_bwd_sm80 \
         gated_delta_rule/gated_delta_rule_fwd_sm90 gated_delta_rule/gated_delta_rule_bwd_sm90 gated_delta_rule/gated_delta_rule_bwd_dqkwg_sm90 kda/kda_sm90; do
  o=$OUT/$(basename $f).o
  if [ ! -f $o ] || [ $OUT/shadow/src/ops/$f.cpp -nt $o ] || [ $OUT/shadow/src/ops/kda/kda_sm80.cuh -nt $o ] || [ $OUT/shadow/src/ops/gated_delta_rule/gdn_sm80.cuh -nt $o ] || [ $OUT/shadow/src/ops/gated_delta_rule/gdn_tc_sm80.cuh -nt $o ]; then
    $CXX -c $OUT/shadow/src/ops/$f.cpp -o $o
  fi
  OBJS="$OBJS $o"
done
$CXX -c $HERE/emu_register.cpp -o $OUT/emu_register.o
if [ ! -f $OUT/test_kda.o ] || [ $ROOT/tests/cpp/ops/test_kda.cpp -nt $OUT/test_kda.o ]; then
  $CXX -O2 -c $ROOT/tests/cpp/ops/test_kda.cpp -o $OUT/test_kda.o
fi
BLAS=$(grep -o "BLAS_openblas_LIBRARY:FILEPATH=.*" $B/CMakeCache.txt | cut -d= -f2)
g++ -o $OUT/emu_tests $OUT/test_kda.o $OUT/emu_register.o $OBJS $B/libfusedops.a \
  -lgtest_main -lgtest -fopenmp -lpthread $BLAS
$OUT/emu_tests --gtest_filter="${2:-Kda*}"
