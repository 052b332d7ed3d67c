// mHC family (docs/specs/ops.md sections 3 and 9): Sinkhorn normalisation of small matrices, the fused
// hc_split_sinkhorn of DeepSeek-V4 / MindSpeed, and the stream-mixing ops mhc_pre_bmm and
// mhc_post. Every op is per token (per matrix); all math is fp32 in the CPU and CUDA backends
// and float64 in the reference.
#pragma once

#include <cstdint>
#include <string>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

// ---------------------------------------------------------------------------------------------
// Sinkhorn (docs/specs/ops.md 3.2 - 3.3)

// The three iteration schedules of docs/specs/ops.md 3.2 (rows normalised along the last axis, columns
// along the second-to-last; T = num_iters):
//   kMindSpeed: K = exp(L - rowmax(L)); T times: K /= rowsum(K)+eps, then K /= colsum(K)+eps.
//   kDeepSeek:  K = softmax_row(L) + eps; K /= colsum(K)+eps; T-1 times: row, then column step.
//   kLog:       f = g = 0; T times: f_j = -LSE_k(L_jk + g_k), g_k = -LSE_j(L_jk + f_j);
//               P = exp(f_j + L_jk + g_k). eps is not used.
enum class SinkhornVariant : int32_t { kMindSpeed = 0, kDeepSeek = 1, kLog = 2 };

const char* sinkhorn_variant_name(SinkhornVariant variant);
// "mindspeed" | "deepseek" | "log"; anything else throws a kValue Error naming the choices.
SinkhornVariant parse_sinkhorn_variant(const std::string& name, const char* op = "sinkhorn");

// Largest matrix size n (= hc_mult) the Sinkhorn ops take.
inline constexpr int kSinkhornMaxN = 16;

// Forward: out = sinkhorn(logits) for every [n, n] matrix of logits [..., n, n].
//   logits: [..., n, n], n <= 16, fp32/bf16/fp16 (ref: also fp64), contiguous; math in fp32.
//   out:    [..., n, n] contiguous, dtype of logits.
//   num_iters >= 1, eps >= 0 (finite). Nothing is saved: the backward recomputes from logits.
struct SinkhornFwdArgs {
  TensorView logits;
  TensorView out;
  int num_iters = 20;
  double eps = 1e-6;
  SinkhornVariant variant = SinkhornVariant::kMindSpeed;
};

// Backward: the exact derivative of the unrolled iteration (docs/specs/ops.md 3.3), with rowmax treated
// as a constant (mindspeed). The forward is recomputed inside the backward.
//   logits: as in the forward. dout: [..., n, n] dtype of logits, contiguous.
//   dlogits: [..., n, n] contiguous, dtype of logits, overwritten.
struct SinkhornBwdArgs {
  TensorView logits;
  TensorView dout;
  TensorView dlogits;
  int num_iters = 20;
  double eps = 1e-6;
  SinkhornVariant variant = SinkhornVariant::kMindSpeed;
};

void sinkhorn_fwd(const Context& ctx, const SinkhornFwdArgs& args);
void sinkhorn_bwd(const Context& ctx, const SinkhornBwdArgs& args);
void sinkhorn_fwd_ref(const Context& ctx, const SinkhornFwdArgs& args);
void sinkhorn_bwd_ref(const Context& ctx, const SinkhornBwdArgs& args);

// ---------------------------------------------------------------------------------------------
// hc_split_sinkhorn (docs/specs/ops.md 3.4)

// Forward, per row of mixes [..., (2+n)n] laid out [pre(n) | post(n) | res(n*n, row-major)]:
//   pre  = sigmoid(a0 * m_pre  + b_pre) + eps
//   post = 2 * sigmoid(a1 * m_post + b_post)
//   comb = sinkhorn(a2 * m_res + b_res, sinkhorn_iters, eps, variant)      ([n, n])
// with (a0, a1, a2) = hc_scale and b = hc_base.
//   mixes:    [..., (2+n)n] fp32/bf16/fp16 (ref: also fp64); last dim stride 1, leading dims
//             collapsible to one row stride.
//   hc_scale: [3] fp32 (ref: also fp64), contiguous. hc_base: [(2+n)n], dtype of hc_scale.
//   pre, post: [..., n]; comb: [..., n, n]; contiguous, dtype of mixes.
//   hc_mult = n in [1, 16]. Nothing is saved: the backward recomputes from mixes.
struct HcSplitSinkhornFwdArgs {
  TensorView mixes;
  TensorView hc_scale;
  TensorView hc_base;
  TensorView pre;
  TensorView post;
  TensorView comb;
  int hc_mult = 4;
  int sinkhorn_iters = 20;
  double eps = 1e-6;
  SinkhornVariant variant = SinkhornVariant::kMindSpeed;
};

// Backward (docs/specs/ops.md 3.4), with u = a0*m_pre + b_pre, s' = sigmoid(u)(1 - sigmoid(u)):
//   dm_pre = g_pre s' a0,  da0 = sum_rows,i g_pre s' m_pre,  db_pre = sum_rows g_pre s';
//   post: the same with a factor 2; res: dZ = sinkhorn_bwd(g_comb), dm_res = a2 dZ,
//   da2 = sum dZ * m_res, db_res = sum_rows dZ.
//   dpre, dpost, dcomb: gradients of the outputs (dtype of mixes), each optional (undefined =
//     zero). Each token's n (dcomb: n x n) values contiguous and the tokens at one stride, e.g.
//     column slices of one [tokens, (2+n)n] gradient (mhc::token_stride).
//   dmixes: [..., (2+n)n] contiguous, dtype of mixes, overwritten.
//   dhc_scale [3], dhc_base [(2+n)n]: dtype of hc_scale, overwritten. They are reduced over the
//     rows in two fixed-order stages (partial sums of hc_split_sinkhorn_partial_rows(n) rows,
//     then the partials in order), so they are bitwise reproducible.
//   workspace: fp32, contiguous, at least hc_split_sinkhorn_bwd_workspace_size(args) bytes.
struct HcSplitSinkhornBwdArgs {
  TensorView mixes;
  TensorView hc_scale;
  TensorView hc_base;
  TensorView dpre;
  TensorView dpost;
  TensorView dcomb;
  TensorView dmixes;
  TensorView dhc_scale;
  TensorView dhc_base;
  TensorView workspace;
  int hc_mult = 4;
  int sinkhorn_iters = 20;
  double eps = 1e-6;
  SinkhornVariant variant = SinkhornVariant::kMindSpeed;
};

// Rows per partial sum of the parameter gradients (depends only on n).
int64_t hc_split_sinkhorn_partial_rows(int hc_mult);
// Bytes of fp32 workspace the backward needs: ceil(rows / partial_rows) * (3 + (2+n)n) floats.
int64_t hc_split_sinkhorn_bwd_workspace_size(const HcSplitSinkhornBwdArgs& args);

void hc_split_sinkhorn_fwd(const Context& ctx, const HcSplitSinkhornFwdArgs& args);
void hc_split_sinkhorn_bwd(const Context& ctx, const HcSplitSinkhornBwdArgs& args);
void hc_split_sinkhorn_fwd_ref(const Context& ctx, const HcSplitSinkhornFwdArgs& args);
void hc_split_sinkhorn_bwd_ref(const Context& ctx, const HcSplitSinkhornBwdArgs& args);

// ---------------------------------------------------------------------------------------------
// mhc_pre_bmm (docs/specs/ops.md 9.2)

// Forward: y[t, c] = sum_i h_pre[t, i] * x[t, i, c]   (fp32 accumulation), t over the tokens.
//   x:     [B, T, n, C] or [T, n, C], fp32/bf16/fp16 (ref: also fp64); last dim stride 1 and the
//          leading dims (tokens and streams) collapsible to one row stride.
//   h_pre: x's shape without C ([..., n]), fp32 (ref: also fp64), contiguous.
//   y:     [..., C] (x's shape without n), contiguous, any floating dtype (fp32 by default in
//          Python). Saved for backward: h_pre and x.
struct MhcPreBmmFwdArgs {
  TensorView h_pre;
  TensorView x;
  TensorView y;
};

// Backward:  dx[t, i, c] = h_pre[t, i] * dy[t, c]   (dtype of x)
//            dh_pre[t, i] = sum_c x[t, i, c] * dy[t, c]   (fp32; per token, no cross-token sum)
//   dy: [..., C] any floating dtype, last dim stride 1, leading dims collapsible.
//   dh_pre: [..., n] dtype of h_pre, contiguous, overwritten. dx: like x, contiguous,
//   overwritten.
struct MhcPreBmmBwdArgs {
  TensorView h_pre;
  TensorView x;
  TensorView dy;
  TensorView dh_pre;
  TensorView dx;
};

void mhc_pre_bmm_fwd(const Context& ctx, const MhcPreBmmFwdArgs& args);
void mhc_pre_bmm_bwd(const Context& ctx, const MhcPreBmmBwdArgs& args);
void mhc_pre_bmm_fwd_ref(const Context& ctx, const MhcPreBmmFwdArgs& args);
void mhc_pre_bmm_bwd_ref(const Context& ctx, const MhcPreBmmBwdArgs& args);

// ---------------------------------------------------------------------------------------------
// mhc_post (docs/specs/ops.md 9.3; torch_npu / CANN argument order)

// Forward (row j of h_res = source stream, column k = destination):
//   out[t, k, c] = h_post[t, k] * h_out[t, c] + sum_j h_res[t, j, k] * x[t, j, c]
// fp32 accumulation, output in x's dtype.
//   x:      [B, T, n, C] or [T, n, C], fp32/bf16/fp16 (ref: also fp64); rows addressable.
//   h_res:  [..., n, n] fp32 (ref: also fp64), contiguous.
//   h_out:  [..., C] dtype of x; rows addressable.
//   h_post: [..., n] dtype of h_res, contiguous.
//   out:    like x, contiguous. Saved for backward: all four inputs.
struct MhcPostFwdArgs {
  TensorView x;
  TensorView h_res;
  TensorView h_out;
  TensorView h_post;
  TensorView out;
};

// Backward (per token, fp32 accumulation):
//   dh_out[c]  = sum_k h_post[k] dy[k, c]       dh_post[k]  = sum_c h_out[c] dy[k, c]
//   dx[j, c]   = sum_k h_res[j, k] dy[k, c]     dh_res[j, k] = sum_c x[j, c] dy[k, c]
//   dy: like x (dtype of x), rows addressable. dx, dh_out: dtype of x; dh_res, dh_post: dtype of
//   h_res; all contiguous and overwritten.
struct MhcPostBwdArgs {
  TensorView x;
  TensorView h_res;
  TensorView h_out;
  TensorView h_post;
  TensorView dy;
  TensorView dx;
  TensorView dh_res;
  TensorView dh_out;
  TensorView dh_post;
};

void mhc_post_fwd(const Context& ctx, const MhcPostFwdArgs& args);
void mhc_post_bwd(const Context& ctx, const MhcPostBwdArgs& args);
void mhc_post_fwd_ref(const Context& ctx, const MhcPostFwdArgs& args);
void mhc_post_bwd_ref(const Context& ctx, const MhcPostBwdArgs& args);

}  // namespace fusedops
