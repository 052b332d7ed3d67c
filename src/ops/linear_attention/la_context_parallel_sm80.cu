// Context-parallel folds and the identity / zero fill, generic CUDA backend (sm_80 and later).
// The folds are tiny ([K,K] x [K,V] per value head and rank): one CTA per (value head, 32-column
// tile of V) keeps its tile of the state in shared memory and applies the ranks' affine maps in
// order, each thread holding up to 32 rows of one column in registers; the sums over the key
// channels run in a fixed order (deterministic). fp32 summaries only.
#include "fusedops/core/registry.h"
#include "fusedops/core/trace.h"
#include "fusedops/ops/context_parallel.h"
#include "src/cuda/check.cuh"
#include "src/cuda/vec.cuh"
#include "src/ops/linear_attention/la_context_parallel.h"

namespace fusedops {
namespace {

constexpr const char* kOpFold = "la_cp_fold";
constexpr const char* kOpFill = "la_cp_fill";
constexpr int kCols = 32;     // state columns per CTA (one warp's lanes)
constexpr int kThreads = 256;  // 8 warps: warp w owns rows w, w + 8, ...
constexpr int kRowsPerThread = 256 / (kThreads / kCols);  // K <= 256

// X (in shared memory, [K][kCols]) <- add + A X, with A(i,k) = m[i*K+k] or m[k*K+i] (transposed).
// Row i is handled by warp i % 8, column c by lane c (columns >= vt are computed and not stored).
template <bool kTransposed, class TAdd>
__device__ void affine_step(float* X, const float* m, const TAdd* add, int64_t add_ld, int K, int vt) {
  const int lane = threadIdx.x % kCols, warp = threadIdx.x / kCols;
  float acc[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = warp + r * (kThreads / kCols);
    acc[r] = (i < K && lane < vt) ? cuda::to_f(add[i * add_ld + lane]) : 0.0f;
  }
  for (int k = 0; k < K; ++k) {
    const float xk = X[k * kCols + lane];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = warp + r * (kThreads / kCols);
      if (i < K) acc[r] = fmaf(kTransposed ? m[k * K + i] : m[i * K + k], xk, acc[r]);
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = warp + r * (kThreads / kCols);
    if (i < K) X[i * kCols + lane] = acc[r];
  }
  __syncthreads();
}

template <class TH>
__global__ void __launch_bounds__(kThreads) fold_fwd_kernel(const float* sum, const TH* h0, float* out, int lo,
                                                            int hi, int HV, int K, int V) {
  extern __shared__ float X[];  // [K][kCols]
  const int h = blockIdx.x, c0 = blockIdx.y * kCols, vt = min(kCols, V - c0);
  const int64_t KV = static_cast<int64_t>(K) * V, size = HV * (static_cast<int64_t>(K) * K + KV);
  for (int e = threadIdx.x; e < K * kCols; e += kThreads) {
    const int i = e / kCols, c = e % kCols;
    X[e] = (h0 && c < vt) ? cuda::to_f(h0[h * KV + i * V + c0 + c]) : 0.0f;
  }
  __syncthreads();
  for (int j = lo; j < hi; ++j) {
    const float* base = sum + j * size;
    affine_step<false>(X, base + static_cast<int64_t>(h) * K * K, base + HV * static_cast<int64_t>(K) * K + h * KV + c0,
                       V, K, vt);
  }
  for (int e = threadIdx.x; e < K * kCols; e += kThreads) {
    const int i = e / kCols, c = e % kCols;
    if (c < vt) out[h * KV + i * V + c0 + c] = X[e];
  }
}

__global__ void __launch_bounds__(kThreads) fold_bwd_kernel(const float* sum, const float* L, float* out, int lo,
                                                            int hi, int HV, int K, int V) {
  extern __shared__ float X[];  // [K][kCols]
  const int h = blockIdx.x, c0 = blockIdx.y * kCols, vt = min(kCols, V - c0);
  const int64_t KV = static_cast<int64_t>(K) * V, size = HV * (static_cast<int64_t>(K) * K + KV);
  for (int e = threadIdx.x; e < K * kCols; e += kThreads) X[e] = 0.0f;
  __syncthreads();
  for (int j = hi - 1; j >= lo; --j)
    affine_step<true>(X, sum + j * size + static_cast<int64_t>(h) * K * K, L + j * HV * KV + h * KV + c0, V, K, vt);
  for (int e = threadIdx.x; e < K * kCols; e += kThreads) {
    const int i = e / kCols, c = e % kCols;
    if (c < vt) out[h * KV + i * V + c0 + c] = X[e];
  }
}

template <class T>
__global__ void fill_kernel(T* out, int64_t n, int64_t R, int64_t C, float diag) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t in_mat = e % (R * C);
    out[e] = cuda::from_f<T>(in_mat / C == in_mat % C ? diag : 0.0f);
  }
}

dim3 fold_grid(int64_t HV, int64_t V) {
  return dim3(static_cast<unsigned>(HV), static_cast<unsigned>((V + kCols - 1) / kCols));
}

size_t fold_smem(int64_t K) { return sizeof(float) * static_cast<size_t>(K) * kCols; }

void fold_fwd(const Context& ctx, const LaCpFoldFwdArgs& a) {
  cuda::DeviceGuard guard(kOpFold, ctx.device.index);
  const int HV = static_cast<int>(a.state.size(0)), K = static_cast<int>(a.state.size(1)),
            V = static_cast<int>(a.state.size(2));
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const size_t smem = fold_smem(K);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    trace_kernel("fold_fwd_kernel");
    fold_fwd_kernel<T><<<fold_grid(HV, V), kThreads, smem, stream>>>(
        a.summaries.data_as<const float>(), a.h0.defined() ? a.h0.data_as<const T>() : nullptr,
        a.state.data_as<float>(), static_cast<int>(a.lo), static_cast<int>(a.hi), HV, K, V);
  };
  if (a.h0.defined()) cuda::visit_dtype(a.h0.dtype(), launch);
  else launch(float{});
  FUSEDOPS_CUDA_LAUNCH_CHECK(kOpFold);
}

void fold_bwd(const Context& ctx, const LaCpFoldBwdArgs& a) {
  cuda::DeviceGuard guard(kOpFold, ctx.device.index);
  const int HV = static_cast<int>(a.dstate.size(0)), K = static_cast<int>(a.dstate.size(1)),
            V = static_cast<int>(a.dstate.size(2));
  trace_kernel("fold_bwd_kernel");
  fold_bwd_kernel<<<fold_grid(HV, V), kThreads, fold_smem(K), static_cast<cudaStream_t>(ctx.stream)>>>(
      a.summaries.data_as<const float>(), a.dh0s.data_as<const float>(), a.dstate.data_as<float>(),
      static_cast<int>(a.lo), static_cast<int>(a.hi), HV, K, V);
  FUSEDOPS_CUDA_LAUNCH_CHECK(kOpFold);
}

void fill(const Context& ctx, const la_cp::FillArgs& a) {
  cuda::DeviceGuard guard(kOpFill, ctx.device.index);
  const int64_t n = a.out.numel();
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
  cuda::visit_dtype(a.out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    trace_kernel("fill_kernel");
    fill_kernel<T><<<blocks, 256, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
        a.out.data_as<T>(), n, a.out.size(-2), a.out.size(-1), static_cast<float>(a.diag));
  });
  FUSEDOPS_CUDA_LAUNCH_CHECK(kOpFill);
}

bool fold_fwd_ok(const LaCpFoldFwdArgs& a) {
  return a.state.size(1) <= 256 && (!a.h0.defined() || a.h0.dtype() != DType::kFloat64);
}
bool fold_bwd_ok(const LaCpFoldBwdArgs& a) { return a.dstate.size(1) <= 256; }

}  // namespace

void register_context_parallel_cuda_sm80(Registry& r) {
  const BackendSpec fold{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX, {DType::kFloat32}, kPriorityCudaSm80};
  r.add<LaCpFoldFwdArgs>(kOpFold, Direction::kForward, fold, fold_fwd_ok, fold_fwd);
  r.add<LaCpFoldBwdArgs>(kOpFold, Direction::kBackward, fold, fold_bwd_ok, fold_bwd);
  r.add<la_cp::FillArgs>(kOpFill, Direction::kForward,
                         {"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                          {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80},
                         nullptr, fill);
}

}  // namespace fusedops
