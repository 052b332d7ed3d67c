// Gated delta rule, CUDA backend cuda_sm80 (sm_80 and later): the family's own forward-direction
// operators (kkt, solve, w/u, the fused prepare step, fwd_o, the gate, the per-token recurrence)
// and the top level. Chunk-parallel operators run one CTA of 256 threads per (chunk, head) with the
// operands staged in shared memory as fp32 and products by la_sm80.cuh's mm (tf32 tensor cores for
// 16-bit inputs, FFMA for fp32). The shared sub-operators (cumsum, the state recurrence, the beta
// sigmoid) and the fused state-and-output kernel the top level runs are in
// src/ops/linear_attention/ (linear_attention_fwd_sm80.cu). Math and storage dtypes as in
// gated_delta_rule_ref_fwd.cpp.
#include <cmath>

#include "fusedops/core/registry.h"
#include "fusedops/core/trace.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "src/cuda/check.cuh"
#include "src/ops/gated_delta_rule/gdn_backends.h"
#include "src/ops/gated_delta_rule/gdn_cuda.cuh"

namespace fusedops::gdn::sm80 {
namespace {

// ---------------------------------------------------------------------------------------------
// chunk_scaled_dot_kkt_fwd: CTA per (chunk, q/k head); the Gram matrix K K^T once, then A for each
// value head of the group.

__global__ void __launch_bounds__(kThreads) kkt_kernel(Tok k, Tok beta, Tok g, Tok A, Layout L, int K, int G) {
  __shared__ float Ks[kMaxBT * kLd];
  __shared__ float Gm[kMaxBT * kLd];
  __shared__ float bs[kMaxBT], gs[kMaxBT];
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hk = blockIdx.y, len = c.len, BT = L.BT;
  if (len == 0) return;
  fill(Gm, kMaxBT * kLd, 0.0f);
  for (int y0 = 0; y0 < K; y0 += 64) {
    __syncthreads();
    load_tile(Ks, kLd, kMaxBT, 64, k, c.b, c.t0, hk, len, y0, K);
    __syncthreads();
    mm(L.tc, len, len, 64, Ks, kLd, 1, Ks, 1, kLd, [&](int m, int n, float v) { Gm[m * kLd + n] += v; });
  }
  for (int gi = 0; gi < G; ++gi) {
    const int hv = hk * G + gi;
    __syncthreads();
    if (threadIdx.x < kMaxBT) {
      const int i = threadIdx.x;
      bs[i] = i < len ? beta.ld(c.b, c.t0 + i, hv, 0) : 0.0f;
      gs[i] = (i < len && g.p) ? g.ld(c.b, c.t0 + i, hv, 0) : 0.0f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < len * BT; e += blockDim.x) {
      const int i = e / BT, j = e - i * BT;
      float v = 0.0f;
      if (j < i) {
        v = bs[i] * Gm[i * kLd + j];
        if (g.p) v *= expf(gs[i] - gs[j]);
      }
      A.st_(c.b, c.t0 + i, hv, j, v);
    }
  }
}

void kkt(const Context& ctx, const ChunkScaledDotKktArgs& a) {
  const char* op = "chunk_scaled_dot_kkt";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.k.size(0), T = a.k.size(1), H = a.k.size(2), K = a.k.size(3), HV = a.beta.size(2);
  const Layout L = layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, a.chunk_indices, a.k.dtype());
  const int64_t NT = a.cu_seqlens.defined() ? a.chunk_indices.size(0) : B * L.nt;
  if (NT == 0 || H == 0) return;
  trace_kernel("kkt_kernel");
  kkt_kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kThreads, 0, stream_of(ctx)>>>(
      tok_of(a.k), tok_of(a.beta), tok_of(a.g), tok_of(a.A), L, static_cast<int>(K),
      static_cast<int>(HV / H));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// solve_tril: CTA of 256 threads per (chunk, head); X = (I + L)^{-1} in fp32 by 16x16 blocks.

__global__ void __launch_bounds__(kThreads) solve_kernel(Tok A, Tok Ai, Layout L) {
  __shared__ float Ls[kMaxBT * kLd];
  __shared__ float X[kMaxBT * kLd];
  __shared__ float Tb[kMaxBT * kLdT16];
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int h = blockIdx.y, len = c.len, BT = L.BT;
  if (len == 0) return;
  load_tri(Ls, A, c.b, c.t0, h, len, BT, true);
  __syncthreads();
  solve_blocked(Ls, kLd, X, Tb, BT / 16);
  for (int e = threadIdx.x; e < len * BT; e += blockDim.x) {
    const int i = e / BT, jj = e - i * BT;
    Ai.st_(c.b, c.t0 + i, h, jj, jj <= i ? X[i * kLd + jj] : 0.0f);
  }
}

void solve(const Context& ctx, const SolveTrilArgs& a) {
  const char* op = "solve_tril";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.A.size(0), T = a.A.size(1), H = a.A.size(2), BT = a.A.size(3);
  const Layout L = layout_of(B, T, BT, a.cu_seqlens, a.chunk_indices, a.chunk_indices, a.A.dtype());
  const int64_t NT = a.cu_seqlens.defined() ? a.chunk_indices.size(0) : B * L.nt;
  if (NT == 0 || H == 0) return;
  trace_kernel("solve_kernel");
  solve_kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kThreads, 0, stream_of(ctx)>>>(
      tok_of(a.A), tok_of(a.Ai), L);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// recompute_w_u_fwd: CTA per (chunk, value head): U = A diag(beta) V, W = A diag(beta e^g) K,
// 64-column tiles of V and K.

__global__ void __launch_bounds__(kThreads) wu_kernel(Tok k, Tok v, Tok beta, Tok A, Tok g, Tok w, Tok u,
                                                      Layout L, int K, int V, int G) {
  __shared__ float Am[kMaxBT * kLd];
  __shared__ float Ts[kMaxBT * kLd];
  __shared__ float cb[kMaxBT], ce[kMaxBT];
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hv = blockIdx.y, hk = hv / G, len = c.len;
  if (len == 0) return;
  load_tri(Am, A, c.b, c.t0, hv, len, L.BT, false);
  if (threadIdx.x < kMaxBT) {
    const int i = threadIdx.x;
    const float b = i < len ? beta.ld(c.b, c.t0 + i, hv, 0) : 0.0f;
    cb[i] = b;
    ce[i] = (i < len && g.p) ? b * expf(g.ld(c.b, c.t0 + i, hv, 0)) : b;
  }
  for (int x0 = 0; x0 < V; x0 += 64) {
    __syncthreads();
    load_tile(Ts, kLd, kMaxBT, 64, v, c.b, c.t0, hv, len, x0, V, cb);
    __syncthreads();
    mm(L.tc, len, min(64, V - x0), len, Am, kLd, 1, Ts, kLd, 1,
       [&](int m, int n, float val) { u.st_(c.b, c.t0 + m, hv, x0 + n, val); });
  }
  for (int y0 = 0; y0 < K; y0 += 64) {
    __syncthreads();
    load_tile(Ts, kLd, kMaxBT, 64, k, c.b, c.t0, hk, len, y0, K, ce);
    __syncthreads();
    mm(L.tc, len, min(64, K - y0), len, Am, kLd, 1, Ts, kLd, 1,
       [&](int m, int n, float val) { w.st_(c.b, c.t0 + m, hv, y0 + n, val); });
  }
}

// recompute_w_u_fwd on 16-bit tensor cores (K = V = 128, k, v, A all bf16 or all fp16, 16-byte
// aligned rows): K, V, A arrive by cp.async; the diagonal
// scales go into two 16-bit copies of A's lower triangle, A diag(beta) and A diag(beta e^g)
// (flash-linear-attention rounds the scaled K and V instead), and U, W are m16n8k16 products with
// fp32 register accumulators (warp tiling of gdn_tc_sm80.cuh; A's row block m0 takes k < m0 + 16).
constexpr size_t kWuSmem = 2 * (2 * static_cast<size_t>(mma16::kTok) + 3 * kMaxBT * mma16::kLdA) + 4 * 2 * kMaxBT;

// The W, U products of one chunk on m16n8k16 (256 threads, after a barrier that made a's source,
// cb, ce, Ks and Vs visible): the two scaled 16-bit copies Au = A diag(beta), Aw = A diag(beta e^g)
// of A's entries (a(i, j, a0, a1) gives those at (i, j) and (i, j + 1), j even, as floats: 0 above
// the diagonal and in rows past the chunk; a warp's calls cover one row), then U = Au V,
// W = Aw K with fp32 register accumulators (A's row block m0 takes k < m0 + 16). With `staged`
// (w and u 16-bit of the inputs' type with 16-byte aligned rows: tok16_ok) U goes through Vs and W
// through Ks once their last readers are done, and out by 16-byte row stores; otherwise from the
// accumulators by 4-byte pair stores in any output dtype. Ks and Vs are clobbered when staged.
template <bool BF, class GetA>
__device__ __forceinline__ void wu_products(GetA&& a, uint16_t* Au, uint16_t* Aw, const float* cb, const float* ce,
                                            uint16_t* Ks, uint16_t* Vs, const Tok& w, const Tok& u,
                                            const ChunkPos& c, int hv, bool staged) {
  using namespace mma16;
  const int tid = threadIdx.x;
  for (int e = tid; e < kMaxBT * kMaxBT / 2; e += kThreads) {
    const int i = e >> 5, j = (e & 31) << 1;
    float a0, a1;
    a(i, j, a0, a1);
    *reinterpret_cast<uint32_t*>(Au + i * kLdA + j) = pack2<BF>(a0 * cb[j], a1 * cb[j + 1]);
    *reinterpret_cast<uint32_t*>(Aw + i * kLdA + j) = pack2<BF>(a0 * ce[j], a1 * ce[j + 1]);
  }
  __syncthreads();
  const int warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const int wm = 16 * (warp & 3), wn = 64 * (warp >> 2);
  const int r0 = wm + (lane >> 2);
  float acc[8][4];
  // U = Au V
  mma16::zero(acc);
  mm_xs<BF, 8>(acc, Au, kLdA, Vs, kLdT, wm, wn, 0, wm + 16, lane);
  if (staged) {
    __syncthreads();  // every warp is done reading Vs
    stage_rows16<BF>(acc, Vs, kLdT, r0, wn, tq);
  } else {
    store_rows2(acc, u, c.b, c.t0, hv, r0, wn, tq, c.len);
  }
  // W = Aw K
  mma16::zero(acc);
  mm_xs<BF, 8>(acc, Aw, kLdA, Ks, kLdT, wm, wn, 0, wm + 16, lane);
  if (staged) {
    __syncthreads();  // every warp is done reading Ks; U is staged
    stage_rows16<BF>(acc, Ks, kLdT, r0, wn, tq);
    store_rows16(Vs, kLdT, u, c.b, c.t0, hv, c.len, kD / 8);
    __syncthreads();  // W is staged
    store_rows16(Ks, kLdT, w, c.b, c.t0, hv, c.len, kD / 8);
  } else {
    store_rows2(acc, w, c.b, c.t0, hv, r0, wn, tq, c.len);
  }
}

template <bool BF>
__global__ void __launch_bounds__(kThreads, 2) wu_mma_kernel(Tok k, Tok v, Tok beta, Tok A, Tok g, Tok w, Tok u,
                                                             Layout L, int G, bool staged) {
  using namespace mma16;
  extern __shared__ float smem[];
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Vs = Ks + kTok;
  uint16_t* As = Vs + kTok;
  uint16_t* Au = As + kMaxBT * kLdA;
  uint16_t* Aw = Au + kMaxBT * kLdA;
  float* cb = reinterpret_cast<float*>(Aw + kMaxBT * kLdA);
  float* ce = cb + kMaxBT;
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hv = blockIdx.y, hk = hv / G, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  load_rows(Ks, kLdT, k, c.b, c.t0, hk, len, kD / 8);
  load_rows(Vs, kLdT, v, c.b, c.t0, hv, len, kD / 8);
  load_rows(As, kLdA, A, c.b, c.t0, hv, len, kMaxBT / 8);
  cp_async_commit();
  if (tid < kMaxBT) {
    const float b = tid < len ? beta.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
    cb[tid] = b;
    ce[tid] = (tid < len && g.p) ? b * exp_fast(g.ld(c.b, c.t0 + tid, hv, 0)) : b;
  }
  cp_async_wait<0>();
  __syncthreads();
  wu_products<BF>(
      [&](int i, int j, float& a0, float& a1) {
        const uint32_t x = ld32(As + i * kLdA + j);
        a0 = j <= i ? h2f<BF>(static_cast<uint16_t>(x)) : 0.0f;
        a1 = j + 1 <= i ? h2f<BF>(static_cast<uint16_t>(x >> 16)) : 0.0f;
      },
      Au, Aw, cb, ce, Ks, Vs, w, u, c, hv, staged);
}

bool wu_mma_ok(const Context& ctx, const RecomputeWUFwdArgs& a) {
  using namespace mma16;
  const DType dt = a.k.dtype();
  if (a.A.size(3) != kMaxBT || a.k.size(3) != kD || a.v.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, kWuSmem, "recompute_w_u")) return false;
  return tok16_ok(a.k, dt) && tok16_ok(a.v, dt) && tok16_ok(a.A, dt) && out2_ok(a.w) && out2_ok(a.u);
}

void wu_fwd(const Context& ctx, const RecomputeWUFwdArgs& a) {
  const char* op = "recompute_w_u";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.k.size(0), T = a.k.size(1), H = a.k.size(2), K = a.k.size(3);
  const int64_t HV = a.v.size(2), V = a.v.size(3), BT = a.A.size(3);
  const Layout L = layout_of(B, T, BT, a.cu_seqlens, a.chunk_indices, a.chunk_indices, a.k.dtype());
  const int64_t NT = a.cu_seqlens.defined() ? a.chunk_indices.size(0) : B * L.nt;
  if (NT == 0 || HV == 0) return;
  if (wu_mma_ok(ctx, a)) {
    auto kernel = a.k.dtype() == DType::kBFloat16 ? wu_mma_kernel<true> : wu_mma_kernel<false>;
    allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kWuSmem);
    trace_kernel("wu_mma_kernel");
    kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, kWuSmem, stream_of(ctx)>>>(
        tok_of(a.k), tok_of(a.v), tok_of(a.beta), tok_of(a.A), tok_of(a.g), tok_of(a.w), tok_of(a.u), L,
        static_cast<int>(HV / H), mma16::staged_out_ok(a.w, a.u, a.k.dtype()));
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  trace_kernel("wu_kernel");
  wu_kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, 0, stream_of(ctx)>>>(
      tok_of(a.k), tok_of(a.v), tok_of(a.beta), tok_of(a.A), tok_of(a.g), tok_of(a.w), tok_of(a.u), L,
      static_cast<int>(K), static_cast<int>(V), static_cast<int>(HV / H));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// The top level's steps F2-F4 in one kernel (K = V = 128, chunk 64, 16-bit k and v; wu_mma_kernel's
// conditions): CTA per (chunk, value head). K and V arrive
// by cp.async; the Gram matrix K K^T on m16n8k16 gives L = diag(beta) (Gamma . K K^T) below the
// diagonal in fp32 shared memory; solve_blocked inverts I + L; A = (I + L)^{-1} goes out in k's
// dtype (saved for the backward) and, rounded to it as the unfused path reads it, feeds the W, U
// products. Only k, v, beta, g are read and A, W, U written: the fp32 L and its inverse never
// leave the chip. The Gram matrix is recomputed per value head of a group (a 64x64x128 product).
namespace prep {
constexpr int kLdL = kLd;  // fp32 [64][69] tiles
// Ks, Vs (16-bit tokens) | L (fp32), Tb (fp32 [64][17]) -- reused for Au, Aw -- | X (fp32) | cb, ce, gs
constexpr size_t kOffL = 2 * 2 * static_cast<size_t>(mma16::kTok);
constexpr size_t kOffX = kOffL + 4 * static_cast<size_t>(kMaxBT) * (kLdL + kLdT16);
constexpr size_t kSmem = kOffX + 4 * static_cast<size_t>(kMaxBT) * kLdL + 4 * 3 * kMaxBT;
static_assert(4 * kMaxBT * (kLdL + kLdT16) >= 2 * 2 * kMaxBT * mma16::kLdA, "Au, Aw must fit over L and Tb");
}  // namespace prep

template <bool BF>
__global__ void __launch_bounds__(kThreads, 2) prep_fwd_mma_kernel(Tok k, Tok v, Tok beta, Tok g, Tok A, Tok w,
                                                                   Tok u, Layout L, int G, bool staged) {
  using namespace mma16;
  extern __shared__ float smem[];
  char* base = reinterpret_cast<char*>(smem);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(base);
  uint16_t* Vs = Ks + kTok;
  float* Ls = reinterpret_cast<float*>(base + prep::kOffL);
  float* Tb = Ls + kMaxBT * prep::kLdL;
  uint16_t* Au = reinterpret_cast<uint16_t*>(Ls);
  uint16_t* Aw = Au + kMaxBT * kLdA;
  float* X = reinterpret_cast<float*>(base + prep::kOffX);
  float* cb = X + kMaxBT * prep::kLdL;
  float* ce = cb + kMaxBT;
  float* gs = ce + kMaxBT;
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hv = blockIdx.y, hk = hv / G, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  load_rows(Ks, kLdT, k, c.b, c.t0, hk, len, kD / 8);
  load_rows(Vs, kLdT, v, c.b, c.t0, hv, len, kD / 8);
  cp_async_commit();
  if (tid < kMaxBT) {
    const float b = tid < len ? beta.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
    const float gl = (tid < len && g.p) ? g.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
    cb[tid] = b;
    gs[tid] = gl;
    ce[tid] = (tid < len && g.p) ? b * exp_fast(gl) : b;
  }
  cp_async_wait<0>();
  __syncthreads();
  // L (chunk_scaled_dot_kkt's value): beta_i e^{g_i - g_j} k_i.k_j below the diagonal (gs = 0 without g).
  causal_qk<BF>(Ks, Ks, gs, len, tid & 31,
                [&](int r, int col, float x) { Ls[r * prep::kLdL + col] = col < r ? cb[r] * x : 0.0f; });
  __syncthreads();
  solve_blocked(Ls, prep::kLdL, X, Tb, kMaxBT / 16);
  // A out (rows < len, zeros above the diagonal) as each pair of X is read for Au, Aw.
  wu_products<BF>(
      [&](int i, int j, float& a0, float& a1) {
        const float x0 = X[i * prep::kLdL + j], x1 = X[i * prep::kLdL + j + 1];
        if (i < len) st2(A.p, A.code, A.off(c.b, c.t0 + i, hv) + j, j <= i ? x0 : 0.0f, j + 1 <= i ? x1 : 0.0f);
        a0 = (i < len && j <= i) ? h2f<BF>(f2h<BF>(x0)) : 0.0f;
        a1 = (i < len && j + 1 <= i) ? h2f<BF>(f2h<BF>(x1)) : 0.0f;
      },
      Au, Aw, cb, ce, Ks, Vs, w, u, c, hv, staged);
}

// Whether prep_fwd_mma_kernel takes these arguments (wu.A the output).
bool prep_fused_ok(const Context& ctx, const RecomputeWUFwdArgs& a, int64_t chunk_size) {
  using namespace mma16;
  const DType dt = a.k.dtype();
  if (chunk_size != kMaxBT || a.A.size(3) != kMaxBT || a.k.size(3) != kD || a.v.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, prep::kSmem, "chunk_gated_delta_rule")) return false;
  return tok16_ok(a.k, dt) && tok16_ok(a.v, dt) && a.A.dtype() == dt && out2_ok(a.A) && out2_ok(a.w) &&
         out2_ok(a.u);
}

bool prep_fused(const Context& ctx, const RecomputeWUFwdArgs& a, int64_t chunk_size) {
  if (!prep_fused_ok(ctx, a, chunk_size)) return false;
  const char* op = "chunk_gated_delta_rule";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.k.size(0), T = a.k.size(1), H = a.k.size(2), HV = a.v.size(2);
  const Layout L = layout_of(B, T, chunk_size, a.cu_seqlens, a.chunk_indices, a.chunk_indices, a.k.dtype());
  const int64_t NT = a.cu_seqlens.defined() ? a.chunk_indices.size(0) : B * L.nt;
  if (NT == 0 || HV == 0) return true;
  auto kernel = a.k.dtype() == DType::kBFloat16 ? prep_fwd_mma_kernel<true> : prep_fwd_mma_kernel<false>;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, prep::kSmem);
  trace_kernel("prep_fwd_mma_kernel");
  kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, prep::kSmem, stream_of(ctx)>>>(
      tok_of(a.k), tok_of(a.v), tok_of(a.beta), tok_of(a.g), tok_of(a.A), tok_of(a.w), tok_of(a.u), L,
      static_cast<int>(HV / H), mma16::staged_out_ok(a.w, a.u, a.k.dtype()));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  return true;
}

// ---------------------------------------------------------------------------------------------
// chunk_fwd_o: CTA per (chunk, value head). P = M>= . Gamma . Q K^T once; per 64-column V tile
// O = diag(e^g) Q S (64-row K slices) + P Vnew, times scale. Shared memory: Qa, Kb, P, O [64][69].

constexpr size_t kFwdOSmem = sizeof(float) * (4 * kMaxBT * kLd + 2 * kMaxBT);

__global__ void __launch_bounds__(kThreads, 3) fwd_o_kernel(Tok q, Tok k, Tok v, Mat h, Tok g, Tok o, Layout L,
                                                         int K, int V, int HV, int G, float scale) {
  extern __shared__ float smem[];
  float* Qa = smem;
  float* Kb = Qa + kMaxBT * kLd;
  float* P = Kb + kMaxBT * kLd;
  float* O = P + kMaxBT * kLd;
  float* gl = O + kMaxBT * kLd;
  float* eg = gl + kMaxBT;  // e^g per row
  const int64_t chunk = blockIdx.x;
  const ChunkPos c = chunk_pos(L, chunk);
  const int hv = blockIdx.y, hk = hv / G, len = c.len;
  if (len == 0) return;
  if (threadIdx.x < kMaxBT) {
    const float gv = (g.p && threadIdx.x < len) ? g.ld(c.b, c.t0 + threadIdx.x, hv, 0) : 0.0f;
    gl[threadIdx.x] = gv;
    eg[threadIdx.x] = expf(gv);
  }
  fill(P, kMaxBT * kLd, 0.0f);
  for (int y0 = 0; y0 < K; y0 += 64) {
    __syncthreads();
    load_tile(Qa, kLd, kMaxBT, 64, q, c.b, c.t0, hk, len, y0, K);
    load_tile(Kb, kLd, kMaxBT, 64, k, c.b, c.t0, hk, len, y0, K);
    __syncthreads();
    mm(L.tc, len, len, 64, Qa, kLd, 1, Kb, 1, kLd, [&](int m, int n, float val) { P[m * kLd + n] += val; });
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kMaxBT * kMaxBT; e += blockDim.x) {
    const int i = e / kMaxBT, j = e - i * kMaxBT;
    P[i * kLd + j] = (i < len && j <= i) ? P[i * kLd + j] * expf(gl[i] - gl[j]) : 0.0f;
  }
  const int64_t sidx = chunk * HV + hv;
  for (int x0 = 0; x0 < V; x0 += 64) {
    const int vt = min(64, V - x0);
    __syncthreads();
    fill(O, kMaxBT * kLd, 0.0f);
    for (int y0 = 0; y0 < K; y0 += 64) {
      __syncthreads();
      load_tile(Qa, kLd, kMaxBT, 64, q, c.b, c.t0, hk, len, y0, K, eg);
      load_state(Kb, kLd, 64, 64, h, sidx, K, V, y0, x0);
      __syncthreads();
      mm(L.tc, len, vt, min(64, K - y0), Qa, kLd, 1, Kb, kLd, 1,
         [&](int m, int n, float val) { O[m * kLd + n] += val; });
    }
    __syncthreads();
    load_tile(Kb, kLd, kMaxBT, 64, v, c.b, c.t0, hv, len, x0, V);
    __syncthreads();
    mm(L.tc, len, vt, len, P, kLd, 1, Kb, kLd, 1, [&](int m, int n, float val) { O[m * kLd + n] += val; });
    __syncthreads();
    store_tile(O, kLd, len, vt, o, c.b, c.t0, hv, x0, scale);
  }
}

// chunk_fwd_o on 16-bit tensor cores (K = V = 128, chunk 64, q, k, v, h all bf16 or all fp16,
// 16-byte aligned rows): Q K Vnew h by cp.async, P = M>= .
// Gamma . Q K^T rounded to the input type, O = diag(e^g) Q h + P Vnew on m16n8k16 with fp32
// register accumulators, times scale (warp tiling of gdn_tc_sm80.cuh). 94 KiB: two CTAs per SM.
constexpr size_t kFwdOMmaSmem =
    2 * (3 * static_cast<size_t>(mma16::kTok) + mma16::kSt + kMaxBT * mma16::kLdS) + 4 * kMaxBT;

template <bool BF>
__global__ void __launch_bounds__(kThreads, 2) fwd_o_mma_kernel(Tok q, Tok k, Tok v, Mat h, Tok g, Tok o, Layout L,
                                                                int HV, int G, float scale) {
  using namespace mma16;
  extern __shared__ float smem[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Ks = Qs + kTok;
  uint16_t* Vs = Ks + kTok;
  uint16_t* Hs = Vs + kTok;
  uint16_t* Ps = Hs + kSt;
  float* gl = reinterpret_cast<float*>(Ps + kMaxBT * kLdS);
  const int64_t chunk = blockIdx.x;
  const ChunkPos c = chunk_pos(L, chunk);
  const int hv = blockIdx.y, hk = hv / G, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  load_rows(Qs, kLdT, q, c.b, c.t0, hk, len, kD / 8);
  load_rows(Ks, kLdT, k, c.b, c.t0, hk, len, kD / 8);
  load_rows(Vs, kLdT, v, c.b, c.t0, hv, len, kD / 8);
  load_state16(Hs, h, chunk * HV + hv);
  cp_async_commit();
  if (tid < kMaxBT) gl[tid] = (g.p && tid < len) ? g.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
  cp_async_wait<0>();
  __syncthreads();
  const int warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const int wm = 16 * (warp & 3), wn = 64 * (warp >> 2);
  const int r0 = wm + (lane >> 2), r1 = r0 + 8;
  causal_qk<BF>(Qs, Ks, gl, len, lane, [&](int r, int col, float p) { Ps[r * kLdS + col] = f2h<BF>(p); });
  float acc[8][4];
  mma16::zero(acc);
  mm_xs<BF, 8>(acc, Qs, kLdT, Hs, kLdT, wm, wn, 0, kD, lane);
  scale_rows(acc, exp_fast(gl[r0]), exp_fast(gl[r1]));
  __syncthreads();  // P
  mm_xs<BF, 8>(acc, Ps, kLdS, Vs, kLdT, wm, wn, 0, wm + 16, lane);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = wn + 8 * j + 2 * tq;
    if (r0 < len) st2(o.p, o.code, o.off(c.b, c.t0 + r0, hv) + col, scale * acc[j][0], scale * acc[j][1]);
    if (r1 < len) st2(o.p, o.code, o.off(c.b, c.t0 + r1, hv) + col, scale * acc[j][2], scale * acc[j][3]);
  }
}

bool fwd_o_mma_ok(const Context& ctx, const ChunkFwdOArgs& a) {
  using namespace mma16;
  const DType dt = a.q.dtype();
  if (a.chunk_size != kMaxBT || a.q.size(3) != kD || a.v.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, kFwdOMmaSmem, "chunk_fwd_o")) return false;
  return tok16_ok(a.q, dt) && tok16_ok(a.k, dt) && tok16_ok(a.v, dt) && state16_ok(a.h, dt) && out2_ok(a.o);
}

void fwd_o(const Context& ctx, const ChunkFwdOArgs& a) {
  const char* op = "chunk_fwd_o";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3);
  const int64_t HV = a.v.size(2), V = a.v.size(3);
  const Layout L = layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, TensorView(), a.q.dtype());
  const int64_t NT = a.cu_seqlens.defined() ? a.chunk_indices.size(0) : B * L.nt;
  if (NT == 0 || HV == 0) return;
  if (fwd_o_mma_ok(ctx, a)) {
    auto kernel = a.q.dtype() == DType::kBFloat16 ? fwd_o_mma_kernel<true> : fwd_o_mma_kernel<false>;
    allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kFwdOMmaSmem);
    trace_kernel("fwd_o_mma_kernel");
    kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, kFwdOMmaSmem, stream_of(ctx)>>>(
        tok_of(a.q), tok_of(a.k), tok_of(a.v), mat_of(a.h), tok_of(a.g), tok_of(a.o), L, static_cast<int>(HV),
        static_cast<int>(HV / H), static_cast<float>(a.scale));
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  auto kernel = fwd_o_kernel;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kFwdOSmem);
  trace_kernel("fwd_o_kernel");
  kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, kFwdOSmem, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.v), mat_of(a.h), tok_of(a.g), tok_of(a.o), L,
      static_cast<int>(K), static_cast<int>(V), static_cast<int>(HV), static_cast<int>(HV / H),
      static_cast<float>(a.scale));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

bool state_out_fused(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const ChunkFwdOArgs& b) {
  return la::sm80::state_out_fused(ctx, a, b.q, TensorView(), b.o, b.chunk_size, b.scale);
}

// ---------------------------------------------------------------------------------------------
// gdn_gate (forward): elementwise over [rows, D] with a row stride.

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void gate_fwd_kernel(const void* g, int gc, int64_t rs, const void* A, int ac, const void* bias,
                                int bc, void* y, int yc, int64_t rows, int64_t D) {
  const int64_t n = rows * D;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / D, d = e - r * D;
    const float x = ldf(g, gc, r * rs + d) + (bias ? ldf(bias, bc, d) : 0.0f);
    stf(y, yc, e, -expf(ldf(A, ac, d)) * softplus_f(x));
  }
}

void gate_fwd(const Context& ctx, const GdnGateFwdArgs& a) {
  const char* op = "gdn_gate";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t D = a.g.size(-1), rows = a.g.rows(), n = rows * D;
  if (n == 0) return;
  trace_kernel("gate_fwd_kernel");
  gate_fwd_kernel<<<elem_blocks(n), kThreads, 0, stream_of(ctx)>>>(
      a.g.data(), code_of(a.g.dtype()), a.g.row_stride(), a.A_log.data(), code_of(a.A_log.dtype()),
      a.dt_bias.defined() && a.dt_bias.numel() ? a.dt_bias.data() : nullptr,
      a.dt_bias.defined() && a.dt_bias.numel() ? code_of(a.dt_bias.dtype()) : kF32, a.y.data(),
      code_of(a.y.dtype()), rows, D);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// fused_recurrent_gated_delta_rule (forward): the shared recurrent kernel in GDN's gate form.
void recurrent_fwd(const Context& ctx, const FusedRecurrentGatedDeltaRuleFwdArgs& a) {
  la::sm80::recurrent_fwd(ctx, a, false);
}

void top_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a) {
  compose_fwd(with_backend(ctx, "cuda_sm80"), a, prep_fused, state_out_fused);
}

// ---------------------------------------------------------------------------------------------
// supports(): no float64 anywhere, K <= 256 (state tiles; the recurrent kernel's registers).

bool sup_kkt(const ChunkScaledDotKktArgs& a) { return no_f64({&a.k, &a.beta, &a.g, &a.A}); }
bool sup_solve(const SolveTrilArgs& a) { return no_f64({&a.A, &a.Ai}); }
bool sup_wu(const RecomputeWUFwdArgs& a) { return no_f64({&a.k, &a.v, &a.beta, &a.A, &a.g, &a.w, &a.u}); }
bool sup_fwd_o(const ChunkFwdOArgs& a) { return no_f64({&a.q, &a.k, &a.v, &a.h, &a.g, &a.o}); }
bool sup_gate(const GdnGateFwdArgs& a) { return no_f64({&a.g, &a.A_log, &a.dt_bias, &a.y}); }
bool sup_recurrent(const FusedRecurrentGatedDeltaRuleFwdArgs& a) { return la::sm80::recurrent_fwd_supported(a); }
bool sup_top(const ChunkGatedDeltaRuleFwdArgs& a) {
  return la::no_float64(a, {&a.A}) &&
         a.q.size(-1) <= 256;
}

}  // namespace

bool prepare_fused_fwd(const Context& ctx, const RecomputeWUFwdArgs& a, int64_t chunk_size) {
  return prep_fused(ctx, a, chunk_size);
}
bool top_fwd_supported(const ChunkGatedDeltaRuleFwdArgs& a) { return sup_top(a); }

}  // namespace fusedops::gdn::sm80

namespace fusedops {

void register_gated_delta_rule_cuda_sm80(Registry& r) {
  using namespace gdn::sm80;
  const BackendSpec s = spec();
  r.add<ChunkScaledDotKktArgs>("chunk_scaled_dot_kkt", Direction::kForward, s, sup_kkt, kkt);
  r.add<SolveTrilArgs>("solve_tril", Direction::kForward, s, sup_solve, solve);
  r.add<RecomputeWUFwdArgs>("recompute_w_u", Direction::kForward, s, sup_wu, wu_fwd);
  r.add<ChunkFwdOArgs>("chunk_fwd_o", Direction::kForward, s, sup_fwd_o, fwd_o);
  r.add<GdnGateFwdArgs>("gdn_gate", Direction::kForward, s, sup_gate, gate_fwd);
  r.add<FusedRecurrentGatedDeltaRuleFwdArgs>("fused_recurrent_gated_delta_rule", Direction::kForward, s,
                                             sup_recurrent, recurrent_fwd);
  r.add<ChunkGatedDeltaRuleFwdArgs>("chunk_gated_delta_rule", Direction::kForward, s, sup_top, top_fwd);
  gdn::register_cuda_sm80_bwd(r);
}

}  // namespace fusedops
