// Correctly rounded reciprocals without a branch per value, and the special function unit's
// approximate 2^x, 1/x and sigmoid (CUDA device code).
#pragma once

namespace fusedops::cuda {

// 2^x (ex2.approx.ftz: relative error about 2^-22, results under 2^-126 flushed to zero) and
// 1/x (rcp.approx.ftz: within 1 ulp), one MUFU instruction each.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// e = e^-z and s = sigmoid(z) = 1 / (1 + e) in four instructions (two MUFU), a few ulp from the
// correctly rounded values: for 16-bit outputs, whose rounding is 2^-9 relative. z = -inf .. -88
// gives e = inf, s = 0; large z gives e = 0, s = 1.
__device__ __forceinline__ void sigmoid_approx(float z, float& e, float& s) {
  e = ex2_approx(-1.4426950408889634f * z);
  s = rcp_approx(1.0f + e);
}
// Whether an element-wise kernel whose storage type is T takes the approximate sigmoid: 16-bit
// storage, whose rounding hides a few ulp; fp32 keeps the exact form.
template <class T>
constexpr bool kFastSigmoid = sizeof(T) == 2;
// e = e^-z and s = sigmoid(z): sigmoid_approx when `fast`, else expf and the correctly rounded
// reciprocal __frcp_rn.
__device__ __forceinline__ void sigmoid_exp(float z, float& e, float& s, bool fast) {
  if (fast) {
    sigmoid_approx(z, e, s);
  } else {
    e = expf(-z);
    s = __frcp_rn(1.0f + e);
  }
}

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
