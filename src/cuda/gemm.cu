#include "src/cuda/gemm.h"

#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "src/cuda/check.cuh"

#define FUSEDOPS_CUBLAS_CHECK(op, call)                                                          \
  do {                                                                                           \
    cublasStatus_t fusedops_st_ = (call);                                                        \
    if (fusedops_st_ != CUBLAS_STATUS_SUCCESS)                                                   \
      FUSEDOPS_FAIL(kRuntime, op, "cuBLASLt error ", static_cast<int>(fusedops_st_), " in ", #call); \
  } while (0)

namespace fusedops::cuda {
namespace {

cudaDataType_t to_cuda(const char* op, DType t) {
  switch (t) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat16: return CUDA_R_16F;
    default: FUSEDOPS_FAIL(kType, op, "GEMM operands must be float32, bfloat16 or float16, got ", dtype_name(t));
  }
}

cublasLtHandle_t handle_for(const char* op, int device) {
  static std::mutex mu;
  static std::vector<cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(handles.size())) handles.resize(device + 1, nullptr);
  if (!handles[device]) FUSEDOPS_CUBLAS_CHECK(op, cublasLtCreate(&handles[device]));
  return handles[device];
}

// RAII wrappers so an exception in the middle frees the descriptors.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() { if (l) cublasLtMatrixLayoutDestroy(l); }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() { if (p) cublasLtMatmulPreferenceDestroy(p); }
};

using AlgoKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int, int, int64_t, int64_t,
                           int64_t, bool, size_t>;

}  // namespace

size_t gemm_workspace_bytes() { return size_t(32) << 20; }

void gemm(const char* op, const GemmArgs& a, void* workspace, size_t workspace_bytes, void* stream,
          int device) {
  if (a.M <= 0 || a.N <= 0) return;
  DeviceGuard guard(op, device);
  cublasLtHandle_t handle = handle_for(op, device);
  const cudaDataType_t ab = to_cuda(op, a.ab_type), c = to_cuda(op, a.c_type);
  FUSEDOPS_REQUIRE(a.c_type == DType::kFloat32 || a.c_type == a.ab_type, kType, op,
                   "GEMM output must be float32 or the operand type");

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: pass B as the first operand.
  MatmulDesc desc;
  FUSEDOPS_CUBLAS_CHECK(op, cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opb = a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opa = a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  FUSEDOPS_CUBLAS_CHECK(op, cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof(opb)));
  FUSEDOPS_CUBLAS_CHECK(op, cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof(opa)));
  // Column-major shapes: first operand B^T as stored is [N,K] (or [K,N] if transposed) with ld ldb.
  Layout lb, la, lc;
  FUSEDOPS_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&lb.l, ab, a.trans_b ? a.K : a.N, a.trans_b ? a.N : a.K, a.ldb));
  FUSEDOPS_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&la.l, ab, a.trans_a ? a.M : a.K, a.trans_a ? a.K : a.M, a.lda));
  FUSEDOPS_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&lc.l, c, a.N, a.M, a.ldc));

  static std::mutex mu;
  static std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
  const AlgoKey key{device, a.trans_a, a.trans_b, a.M, a.N, a.K, int(ab), int(c), a.lda, a.ldb,
                    a.ldc, a.beta != 0.0f, workspace_bytes};
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = algos.find(key);
    if (it == algos.end()) {
      Preference pref;
      FUSEDOPS_CUBLAS_CHECK(op, cublasLtMatmulPreferenceCreate(&pref.p));
      FUSEDOPS_CUBLAS_CHECK(op, cublasLtMatmulPreferenceSetAttribute(
                                    pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                    &workspace_bytes, sizeof(workspace_bytes)));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      FUSEDOPS_CUBLAS_CHECK(op, cublasLtMatmulAlgoGetHeuristic(handle, desc.d, lb.l, la.l, lc.l, lc.l,
                                                              pref.p, 1, &result, &found));
      FUSEDOPS_REQUIRE(found > 0, kRuntime, op, "cuBLASLt found no algorithm for a ", a.M, "x", a.N,
                       "x", a.K, " GEMM");
      it = algos.emplace(key, result.algo).first;
    }
    algo = it->second;
  }
  FUSEDOPS_CUBLAS_CHECK(op, cublasLtMatmul(handle, desc.d, &a.alpha, a.B, lb.l, a.A, la.l, &a.beta,
                                           a.C, lc.l, a.C, lc.l, &algo, workspace, workspace_bytes,
                                           static_cast<cudaStream_t>(stream)));
}

}  // namespace fusedops::cuda
