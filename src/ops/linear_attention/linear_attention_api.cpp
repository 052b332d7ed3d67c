// The shared sub-operators of linear_attention.h (chunk_local_cumsum, the state recurrence and its
// backward, beta_sigmoid): argument checks, then dispatch to the selected backend. The varlen
// index helpers are in la_check.cpp.
#include <cmath>
#include <string>

#include "fusedops/core/registry.h"
#include "fusedops/ops/linear_attention.h"
#include "src/ops/linear_attention/la_check.h"

namespace fusedops {
namespace {

using la::Check;

bool is_pow2(int64_t x) { return x >= 1 && (x & (x - 1)) == 0; }

void check(const Context& ctx, const ChunkLocalCumsumArgs& a) {
  Check c("chunk_local_cumsum", ctx);
  c.base().defined(a.g, "g");
  c.value(a.g.ndim() == 3 || a.g.ndim() == 4,
          "g must have rank 3 ([B,T,H], scalar gate) or 4 ([B,T,H,S], vector gate), got rank " +
              std::to_string(a.g.ndim()) + " with shape " + a.g.shape_string());
  c.input(a.g, "g", shape_vector(a.g));
  c.value(is_pow2(a.chunk_size), "chunk_size must be a power of 2, got " + std::to_string(a.chunk_size));
  c.output(a.out, "out", shape_vector(a.g));
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, a.g.size(0), a.g.size(1), a.chunk_size);
  c.value(std::isfinite(a.scale), "scale must be finite");
}

void check_gates(const Check& c, const TensorView& g, const TensorView& gk, int64_t B, int64_t T,
                 int64_t HV, int64_t K) {
  c.value(!(g.defined() && gk.defined()), "give at most one of g (scalar gate) and gk (per-channel gate)");
  c.opt_input(g, "g", {B, T, HV});
  c.opt_input(gk, "gk", {B, T, HV, K});
}

void check(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a) {
  Check c("chunk_gated_delta_rule_fwd_h", ctx);
  auto ks = c.rank4(a.k, "k");
  const int64_t B = ks[0], T = ks[1], Hk = ks[2], K = ks[3];
  c.input(a.k, "k", ks);
  auto us = c.rank4(a.u, "u");
  const int64_t HV = us[2], V = us[3];
  c.input(a.u, "u", {B, T, HV, V});
  c.groups(HV, Hk, "u", "k");
  c.input(a.w, "w", {B, T, HV, K});
  c.head_dims(K, V);
  check_gates(c, a.g, a.gk, B, T, HV, K);
  c.chunk_size(a.chunk_size);
  const int64_t N = c.seqlens(a.cu_seqlens, B, T);
  const int64_t NT = c.snapshots(a.h, "h", T, a.chunk_size, a.cu_seqlens,
                                 c.chunk_offsets(a.cu_seqlens, a.chunk_offsets, B, T, a.chunk_size));
  c.output(a.h, "h", {a.cu_seqlens.defined() ? 1 : B, NT, HV, K, V});
  c.opt_state(a.h0, "h0", {N, HV, K, V});
  c.opt_output(a.v_new, "v_new", {B, T, HV, V});
  c.opt_output(a.ht, "ht", {N, HV, K, V});
}

void check(const Context& ctx, const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  Check c("chunk_gated_delta_rule_bwd_dhu", ctx);
  auto ks = c.rank4(a.k, "k");
  const int64_t B = ks[0], T = ks[1], Hk = ks[2], K = ks[3];
  c.input(a.k, "k", ks);
  c.input(a.q, "q", ks);
  auto ds = c.rank4(a.dout, "dout");
  const int64_t HV = ds[2], V = ds[3];
  c.input(a.dout, "dout", {B, T, HV, V});
  c.groups(HV, Hk, "dout", "q and k");
  c.input(a.dv, "dv", {B, T, HV, V});
  c.input(a.w, "w", {B, T, HV, K});
  c.head_dims(K, V);
  check_gates(c, a.g, a.gk, B, T, HV, K);
  c.chunk_size(a.chunk_size);
  const int64_t N = c.seqlens(a.cu_seqlens, B, T);
  const int64_t NT = c.snapshots(a.dh, "dh", T, a.chunk_size, a.cu_seqlens,
                                 c.chunk_offsets(a.cu_seqlens, a.chunk_offsets, B, T, a.chunk_size));
  c.output(a.dh, "dh", {a.cu_seqlens.defined() ? 1 : B, NT, HV, K, V});
  c.opt_state(a.dht, "dht", {N, HV, K, V});
  c.opt_output(a.dh0, "dh0", {N, HV, K, V});
  c.output(a.dv2, "dv2", {B, T, HV, V});
  c.value(std::isfinite(a.scale), "scale must be finite");
}

void check(const Context& ctx, const BetaSigmoidFwdArgs& a) {
  Check c("beta_sigmoid", ctx);
  c.base().min_rank(a.x, "x", 1);
  c.base().rows_addressable(a.x, "x");
  c.input(a.x, "x", shape_vector(a.x));
  c.output(a.y, "y", shape_vector(a.x));
}

void check(const Context& ctx, const BetaSigmoidBwdArgs& a) {
  Check c("beta_sigmoid", ctx);
  c.base().min_rank(a.x, "x", 1);
  c.base().rows_addressable(a.x, "x");
  c.input(a.x, "x", shape_vector(a.x));
  c.base().rows_addressable(a.dy, "dy");
  c.input(a.dy, "dy", shape_vector(a.x));
  c.output(a.dx, "dx", shape_vector(a.x));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points. Zero-size calls return after the checks; the state operators still run when
// there are sequences (a length-0 sequence has ht = h0 and dh0 = dht).

void chunk_local_cumsum(const Context& ctx, const ChunkLocalCumsumArgs& a) {
  check(ctx, a);
  if (a.g.numel() == 0) return;
  dispatch("chunk_local_cumsum", Direction::kForward, ctx, a.g.dtype(), a);
}

void chunk_gated_delta_rule_fwd_h(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a) {
  check(ctx, a);
  if (a.h.numel() == 0 && (!a.ht.defined() || a.ht.numel() == 0)) return;
  dispatch("chunk_gated_delta_rule_fwd_h", Direction::kForward, ctx, a.k.dtype(), a);
}

void chunk_gated_delta_rule_bwd_dhu(const Context& ctx, const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  check(ctx, a);
  if (a.dh.numel() == 0 && (!a.dh0.defined() || a.dh0.numel() == 0)) return;
  dispatch("chunk_gated_delta_rule_bwd_dhu", Direction::kBackward, ctx, a.k.dtype(), a);
}

void beta_sigmoid_fwd(const Context& ctx, const BetaSigmoidFwdArgs& a) {
  check(ctx, a);
  if (a.x.numel() == 0) return;
  dispatch("beta_sigmoid", Direction::kForward, ctx, a.x.dtype(), a);
}

void beta_sigmoid_bwd(const Context& ctx, const BetaSigmoidBwdArgs& a) {
  check(ctx, a);
  if (a.x.numel() == 0) return;
  dispatch("beta_sigmoid", Direction::kBackward, ctx, a.x.dtype(), a);
}

void chunk_local_cumsum_ref(const Context& ctx, const ChunkLocalCumsumArgs& a) {
  chunk_local_cumsum(with_backend(ctx, "ref"), a);
}
void chunk_gated_delta_rule_fwd_h_ref(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a) {
  chunk_gated_delta_rule_fwd_h(with_backend(ctx, "ref"), a);
}
void chunk_gated_delta_rule_bwd_dhu_ref(const Context& ctx,
                                        const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  chunk_gated_delta_rule_bwd_dhu(with_backend(ctx, "ref"), a);
}
void beta_sigmoid_fwd_ref(const Context& ctx, const BetaSigmoidFwdArgs& a) {
  beta_sigmoid_fwd(with_backend(ctx, "ref"), a);
}
void beta_sigmoid_bwd_ref(const Context& ctx, const BetaSigmoidBwdArgs& a) {
  beta_sigmoid_bwd(with_backend(ctx, "ref"), a);
}


}  // namespace fusedops
