#!/bin/bash
# Runs the cuda_sm80 and cuda_sm90 GDN kernels on the CPU (one std::thread per CUDA thread,
# std::barrier for __syncthreads, NaN-poisoned dynamic shared memory, wgmma through emu_wgmma.h)
# under the family's C++ tests, registered as CPU backends of those names. A test aid for machines
# without a GPU; not part of the build.
# Usage: build.sh BUILD_DIR (a CPU build with libfusedops.a, e.g. build/dev-NAME) [gtest filter]
set -e
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
HERE=$ROOT/src/ops/gated_delta_rule/cpu_emulation
B=$1; OUT=${EMU_OUT:-/tmp/gdn_cpu_emulation}
mkdir -p $OUT/shadow/src/cuda $OUT/shadow/src/ops/gated_delta_rule
cp $HERE/emu_core.h $OUT/shadow/
cp $HERE/emu_mma.h $OUT/shadow/src/ops/gated_delta_rule/gdn_mma_sm80.cuh
cp $HERE/emu_wgmma.h $OUT/shadow/src/ops/gated_delta_rule/gdn_wgmma_sm90.cuh
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
python3 $HERE/prep.py $ROOT/src/ops/gated_delta_rule $OUT/shadow/src/ops/gated_delta_rule
CXX="g++ -std=c++20 -O1 -w -I $OUT/shadow -I $ROOT/include -I $ROOT"
for f in fwd_sm80 bwd_sm80 fwd_sm90 bwd_sm90 bwd_dqkwg_sm90; do
  $CXX -c $OUT/shadow/src/ops/gated_delta_rule/gated_delta_rule_$f.cpp -o $OUT/emu_$f.o
done
$CXX -c $HERE/emu_register.cpp -o $OUT/emu_register.o
$CXX -O2 -c $ROOT/tests/cpp/ops/test_gated_delta_rule.cpp -o $OUT/test_gdn.o
BLAS=$(grep -o "BLAS_openblas_LIBRARY:FILEPATH=.*" $B/CMakeCache.txt | cut -d= -f2)
g++ -o $OUT/emu_tests $OUT/test_gdn.o $OUT/emu_register.o $OUT/emu_fwd_sm80.o $OUT/emu_bwd_sm80.o $OUT/emu_fwd_sm90.o $OUT/emu_bwd_sm90.o $OUT/emu_bwd_dqkwg_sm90.o $B/libfusedops.a \
  -lgtest_main -lgtest -fopenmp -lpthread $BLAS
$OUT/emu_tests --gtest_filter="${2:-GatedDeltaRule*:ChunkGatedDeltaRule*:FusedRecurrentGatedDeltaRule*}"
