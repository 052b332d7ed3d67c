// The vocabulary-parallel cross-entropy pieces, generic CUDA backend (sm_80 and later): one
// 256-thread block per row; the statistics in two sweeps over the row (max and sum of z, then the
// sum of exponentials), the gradient in one; block sums in a fixed order (deterministic).
#include <cstdint>

#include "fusedops/core/registry.h"
#include "fusedops/ops/cross_entropy.h"
#include "src/cuda/check.cuh"
#include "src/cuda/reduce.cuh"
#include "src/cuda/vec.cuh"
#include "src/ops/cross_entropy/ce_shard.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "cross_entropy_shard";
constexpr int kThreads = 256;

using ce::Cap;
using ce::cap_of;

__device__ __forceinline__ float zval(float x, const Cap& c, float* dzdx) {
  x *= c.scale;
  float d = c.scale;
  if (c.capped) {
    const float t = tanhf(x / c.cap);
    x = c.cap * t;
    d *= 1.0f - t * t;
  }
  if (dzdx) *dzdx = d;
  return x;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

template <class T, class L>
__global__ void __launch_bounds__(kThreads) stats_kernel(const T* logits, int64_t ld, const L* labels, float* stats,
                                                         int64_t Vs, int64_t vocab_start, int64_t ignore, Cap c) {
  __shared__ float scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  const int64_t y = static_cast<int64_t>(labels[r]);
  float* out = stats + r * 4;
  if (y == ignore) {
    if (threadIdx.x < 4) out[threadIdx.x] = 0.0f;
    return;
  }
  const T* row = logits + r * ld;
  float m = -INFINITY, sz = 0.0f;
  for (int64_t v = threadIdx.x; v < Vs; v += kThreads) {
    const float z = zval(cuda::to_f(row[v]), c, nullptr);
    m = fmaxf(m, z);
    sz += z;
  }
  m = block_max(m, scratch);
  sz = cuda::block_sum(sz, scratch);
  float se = 0.0f;
  for (int64_t v = threadIdx.x; v < Vs; v += kThreads) se += __expf(zval(cuda::to_f(row[v]), c, nullptr) - m);
  se = cuda::block_sum(se, scratch);
  if (threadIdx.x == 0) {
    const int64_t local = y - vocab_start;
    out[0] = m;
    out[1] = se;
    out[2] = local >= 0 && local < Vs ? zval(cuda::to_f(row[local]), c, nullptr) : 0.0f;
    out[3] = sz;
  }
}

template <class T, class L>
__global__ void __launch_bounds__(kThreads) bwd_kernel(const T* logits, int64_t ld, const L* labels, const float* rg,
                                                       T* grad, int64_t Vs, int64_t vocab_start, int64_t ignore,
                                                       Cap c) {
  const int64_t r = blockIdx.x;
  const int64_t y = static_cast<int64_t>(labels[r]);
  const T* row = logits + r * ld;
  T* out = grad + r * Vs;
  if (y == ignore) {
    for (int64_t v = threadIdx.x; v < Vs; v += kThreads) out[v] = cuda::from_f<T>(0.0f);
    return;
  }
  const float lse = rg[r * 4], dl = rg[r * 4 + 1], dy = rg[r * 4 + 2], ds = rg[r * 4 + 3];
  const int64_t local = y - vocab_start;
  for (int64_t v = threadIdx.x; v < Vs; v += kThreads) {
    float d;
    const float z = zval(cuda::to_f(row[v]), c, &d);
    const float g = dl * __expf(z - lse) + (v == local ? dy : 0.0f) + ds;
    out[v] = cuda::from_f<T>(d * g);  // each element is read before it is written (in place)
  }
}

// Calls launch(T, L) with the logits' storage type and the labels' index type, then checks the
// launch.
template <class Fn>
void with_types(const Context& ctx, const TensorView& logits, const TensorView& labels, Fn&& launch) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  cuda::visit_dtype(logits.dtype(), [&](auto t) {
    if (labels.dtype() == DType::kInt64) launch(t, int64_t{});
    else launch(t, int32_t{});
  });
  FUSEDOPS_CUDA_LAUNCH_CHECK(kOp);
}

void stats(const Context& ctx, const CrossEntropyShardStatsArgs& a) {
  with_types(ctx, a.logits, a.labels, [&](auto t, auto l) {
    using T = decltype(t);
    using L = decltype(l);
    stats_kernel<T, L><<<static_cast<unsigned>(a.logits.rows()), kThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
        a.logits.data_as<const T>(), a.logits.row_stride(), a.labels.data_as<const L>(), a.stats.data_as<float>(),
        a.logits.size(-1), a.vocab_start, a.options.ignore_index, cap_of(a.options));
  });
}

void bwd(const Context& ctx, const CrossEntropyShardBwdArgs& a) {
  with_types(ctx, a.logits, a.labels, [&](auto t, auto l) {
    using T = decltype(t);
    using L = decltype(l);
    bwd_kernel<T, L><<<static_cast<unsigned>(a.logits.rows()), kThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
        a.logits.data_as<const T>(), a.logits.row_stride(), a.labels.data_as<const L>(),
        a.row_grads.data_as<const float>(), a.grad_logits.data_as<T>(), a.logits.size(-1), a.vocab_start,
        a.options.ignore_index, cap_of(a.options));
  });
}

bool sup_stats(const CrossEntropyShardStatsArgs& a) {
  return a.stats.dtype() == DType::kFloat32 && a.logits.rows() <= INT32_MAX;
}
bool sup_bwd(const CrossEntropyShardBwdArgs& a) {
  return a.row_grads.dtype() == DType::kFloat32 && a.logits.rows() <= INT32_MAX;
}

}  // namespace

void register_cross_entropy_shard_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<CrossEntropyShardStatsArgs>(kOp, Direction::kForward, spec, sup_stats, stats);
  r.add<CrossEntropyShardBwdArgs>(kOp, Direction::kBackward, spec, sup_bwd, bwd);
}

}  // namespace fusedops
