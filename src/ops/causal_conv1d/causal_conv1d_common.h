// causal_conv1d: the problem geometry shared by the API checks and every backend (host code).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"
#include "fusedops/ops/causal_conv1d.h"

namespace fusedops::conv1d {

// x viewed as [B, T, D] with element strides (batch, time); channels are dense.
struct Geometry {
  int64_t B = 0, T = 0, D = 0, W = 0;
  int64_t N = 0;  // sequences: B, or cu_seqlens.size(0) - 1
  bool varlen = false;
};

// Product of the dims after T (1 for a rank-2 view; callers check rank >= 3 first).
inline int64_t channels_of(const TensorView& x) {
  int64_t d = 1;
  for (int i = 2; i < x.ndim(); ++i) d *= x.size(i);
  return d;
}

// Element stride between consecutive time steps / batches of a [B, T, D...] view whose channel
// dims are dense. A dim of size 1 has no meaningful stride: any value works, report a dense one.
inline int64_t time_stride(const TensorView& t) {
  return t.size(1) == 1 ? channels_of(t) : t.stride(1);
}
inline int64_t batch_stride(const TensorView& t) {
  return t.size(0) == 1 ? t.size(1) * channels_of(t) : t.stride(0);
}

inline Geometry geometry(const TensorView& x, const TensorView& weight, const TensorView& cu) {
  Geometry g;
  g.B = x.size(0);
  g.T = x.size(1);
  g.D = channels_of(x);
  g.W = weight.size(0);
  g.varlen = cu.defined();
  g.N = g.varlen ? cu.size(0) - 1 : g.B;
  return g;
}

// cu_seqlens[i] of a host tensor (int32 or int64), as int64.
inline int64_t host_offset(const TensorView& cu, int64_t i) {
  const int64_t s = cu.stride(0);
  return cu.dtype() == DType::kInt32 ? static_cast<int64_t>(cu.data_as<const int32_t>()[i * s])
                                     : cu.data_as<const int64_t>()[i * s];
}

// [begin, end) of sequence n in x's time axis (batch n when not varlen).
struct Span {
  int64_t batch, begin, end;
};
inline Span host_span(const Geometry& g, const TensorView& cu, int64_t n) {
  if (!g.varlen) return {n, 0, g.T};
  return {0, host_offset(cu, n), host_offset(cu, n + 1)};
}

// CUDA backward tiling, shared with the workspace query: a block owns kCudaBwdRows consecutive
// time steps of one batch (or of the packed varlen axis) and writes one fp32 partial row per
// reduced quantity (W weights + 1 bias).
inline constexpr int64_t kCudaBwdRows = 256;
inline int64_t cuda_bwd_tiles(const Geometry& g) {
  const int64_t per = (g.T + kCudaBwdRows - 1) / kCudaBwdRows;
  return g.varlen ? per : g.B * per;
}
inline int64_t cuda_bwd_partial_rows(const Geometry& g, bool dweight, bool dbias) {
  return (dweight ? g.W : 0) + (dbias ? 1 : 0);
}

}  // namespace fusedops::conv1d
