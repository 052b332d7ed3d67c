// Large GEMMs on CUDA through cuBLASLt, in row-major terms:
//
//   C[M,N] = alpha * op(A) @ op(B) + beta * C     op(A): [M,K], op(B): [K,N]
//
// A and B are fp32, bf16 or fp16 (the same type); C is fp32 or the type of A/B. Accumulation is
// fp32 (CUBLAS_COMPUTE_32F). The caller provides the workspace (gemm_workspace_bytes()), so no
// call allocates, and the stream, so calls are CUDA-graph capturable. cuBLASLt handles (one per
// device) and algorithm choices (per problem) are cached.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusedops/core/dtype.h"

namespace fusedops::cuda {

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  DType ab_type = DType::kBFloat16;
  DType c_type = DType::kFloat32;
  float alpha = 1.0f, beta = 0.0f;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  void* C = nullptr;
  int64_t ldc = 0;
};

// Workspace cuBLASLt may use (32 MiB, what NVIDIA recommends for Hopper).
size_t gemm_workspace_bytes();

// Runs the GEMM on `stream` (a cudaStream_t) of `device`. `op` names the caller in errors.
void gemm(const char* op, const GemmArgs& args, void* workspace, size_t workspace_bytes,
          void* stream, int device);

}  // namespace fusedops::cuda
