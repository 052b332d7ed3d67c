// Correctly rounded reciprocals without a branch per value (CUDA device code).
#pragma once

namespace fusedops::cuda {

// RN(1/d) for N values: the hardware reciprocal refined by one Newton step, which is exactly
// the fast path of __frcp_rn (bitwise the same result) for d with a biased exponent in [1, 252];
// any other d (0, denormal, huge, inf, NaN) sends the batch through __frcp_rn. __frcp_rn itself
// puts a branch and a reconvergence point around every reciprocal, which serialises independent
// reciprocals (Sinkhorn steps) and costs issue slots in element-wise sigmoids; here the rare
// branch is taken once per batch.
template <int N>
__device__ __forceinline__ void rcp_rn(const float (&d)[N], float (&inv)[N]) {
  bool fast = true;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d[i]));
    inv[i] = fmaf(r, fmaf(-d[i], r, 1.0f), r);
    fast = fast && ((__float_as_uint(d[i]) + 0x01800000u) & 0x7f800000u) > 0x01ffffffu;
  }
  if (!fast) {
#pragma unroll
    for (int i = 0; i < N; ++i) inv[i] = __frcp_rn(d[i]);
  }
}

}  // namespace fusedops::cuda
