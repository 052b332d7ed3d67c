#include "src/ops/linear_attention/la_top.h"

#include <cmath>
#include <string>
#include <utility>

namespace fusedops::la {
namespace {


template <class Args>
Dims dims_common(const Args& a) {
  Dims d{};
  d.B = a.q.size(0);
  d.T = a.q.size(1);
  d.H = a.q.size(2);
  d.K = a.q.size(3);
  d.HV = a.v.size(2);
  d.V = a.v.size(3);
  d.varlen = a.cu_seqlens.defined();
  d.N = d.varlen ? a.cu_seqlens.size(0) - 1 : d.B;
  d.NT = d.varlen ? a.chunk_indices.size(0) : ceil_div(d.T, a.chunk_size);
  d.BT = a.chunk_size;
  d.qdt = a.q.dtype();
  d.vdt = a.v.dtype();
  d.ddt = a.v.dtype();
  d.acc = a.q.dtype() == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  return d;
}

// "16, 32 or 64".
std::string alternatives(const std::vector<int64_t>& xs) {
  std::string s;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) s += i + 1 == xs.size() ? " or " : ", ";
    s += std::to_string(xs[i]);
  }
  return s;
}

// Inputs, flags, varlen indices and the saved tensors; `backward` reads the saved tensors as
// inputs (the forward writes them).
template <class Args>
Dims check_shared(const Check& c, const Args& a, GateForm form, const std::vector<int64_t>& chunk_sizes,
                  bool backward) {
  const QKV s = check_qkv(c, a);
  const int64_t B = s.B, T = s.T, H = s.H, K = s.K, HV = s.HV, V = s.V;
  c.base().dtype_in(a.q, "q", {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64});
  c.base().same_dtype(a.k, "k", a.q, "q").same_dtype(a.v, "v", a.q, "q");
  c.head_dims(K, V);
  const std::vector<int64_t> gate =
      form == GateForm::kScalar ? std::vector<int64_t>{B, T, HV} : std::vector<int64_t>{B, T, HV, K};
  c.input(a.g, "g", gate);
  c.input(a.beta, "beta", {B, T, HV});
  bool size_ok = false;
  for (int64_t bt : chunk_sizes) size_ok = size_ok || a.chunk_size == bt;
  c.value(size_ok, "chunk_size must be " + alternatives(chunk_sizes) + ", got " + std::to_string(a.chunk_size));
  c.value(!a.allow_neg_eigval || a.use_beta_sigmoid_in_kernel,
          "allow_neg_eigval requires use_beta_sigmoid_in_kernel");
  c.value(std::isfinite(a.scale), "scale must be finite");
  const int64_t N = c.seqlens(a.cu_seqlens, B, T);
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, B, T, a.chunk_size);
  c.chunk_offsets(a.cu_seqlens, a.chunk_offsets, B, T, a.chunk_size);
  c.opt_state(a.initial_state, "initial_state", {N, HV, K, V});
  auto saved = [&](const TensorView& t, const char* name, const std::vector<int64_t>& shape) {
    if (backward) c.input(t, name, shape);
    else c.output(t, name, shape);
  };
  if (a.use_qk_l2norm_in_kernel) {
    c.base().rows_addressable(a.q, "q").rows_addressable(a.k, "k");
    for (auto [t, name] : {std::pair{&a.q_normed, "q_normed"}, std::pair{&a.k_normed, "k_normed"}}) {
      saved(*t, name, {B, T, H, K});
      c.base().same_dtype(*t, name, a.q, "q");
      c.base().rows_addressable(*t, name);
    }
    for (auto [t, name] : {std::pair{&a.q_rstd, "q_rstd"}, std::pair{&a.k_rstd, "k_rstd"}}) {
      c.output(*t, name, {B, T, H});
      c.base().dtype_in(*t, name, {DType::kFloat32, DType::kFloat64});
    }
  }
  saved(a.g_cumsum, "g_cumsum", gate);
  if (a.use_beta_sigmoid_in_kernel) saved(a.beta_sigmoid, "beta_sigmoid", {B, T, HV});
  return dims_common(a);
}

}  // namespace

Dims dims_of(const LinearAttentionFwdArgs& a) { return dims_common(a); }

Dims dims_of(const LinearAttentionBwdArgs& a) {
  Dims d = dims_common(a);
  if (a.dout.defined()) d.ddt = a.dout.dtype();
  return d;
}

bool dims_readable(const TensorView& q, const TensorView& v, const TensorView& cu, const TensorView& ci) {
  if (!q.defined() || !v.defined() || q.ndim() != 4 || v.ndim() != 4) return false;
  return !cu.defined() || (ci.defined() && ci.ndim() == 2);
}

Dims check_top(const Check& c, const LinearAttentionFwdArgs& a, GateForm form,
               const std::vector<int64_t>& chunk_sizes) {
  const Dims d = check_shared(c, a, form, chunk_sizes, false);
  c.output(a.o, "o", {d.B, d.T, d.HV, d.V});
  c.opt_output(a.final_state, "final_state", {d.N, d.HV, d.K, d.V});
  return d;
}

Dims check_top(const Check& c, const LinearAttentionBwdArgs& a, GateForm form,
               const std::vector<int64_t>& chunk_sizes) {
  Dims d = check_shared(c, a, form, chunk_sizes, true);
  c.input(a.dout, "dout", {d.B, d.T, d.HV, d.V});
  c.opt_state(a.dht, "dht", {d.N, d.HV, d.K, d.V});
  c.output(a.dq, "dq", {d.B, d.T, d.H, d.K});
  c.output(a.dk, "dk", {d.B, d.T, d.H, d.K});
  c.output(a.dv, "dv", {d.B, d.T, d.HV, d.V});
  c.output(a.dg, "dg", d.gate(form));
  c.output(a.dbeta, "dbeta", {d.B, d.T, d.HV});
  c.opt_output(a.dh0, "dh0", {d.N, d.HV, d.K, d.V});
  d.ddt = a.dout.dtype();
  return d;
}

bool no_float64(const LinearAttentionFwdArgs& a, std::initializer_list<const TensorView*> own) {
  return no_float64({&a.q, &a.k, &a.v, &a.g, &a.beta, &a.initial_state, &a.A_log, &a.dt_bias, &a.o,
                     &a.final_state, &a.q_normed, &a.k_normed, &a.q_rstd, &a.k_rstd, &a.g_cumsum,
                     &a.beta_sigmoid}) &&
         no_float64(own);
}

bool no_float64(const LinearAttentionBwdArgs& a, std::initializer_list<const TensorView*> own) {
  return no_float64({&a.q, &a.k, &a.v, &a.g, &a.beta, &a.initial_state, &a.A_log, &a.dt_bias,
                     &a.q_normed, &a.k_normed, &a.q_rstd, &a.k_rstd, &a.g_cumsum, &a.beta_sigmoid,
                     &a.dout, &a.dht, &a.dq, &a.dk, &a.dv, &a.dg, &a.dbeta, &a.dh0, &a.dA_log,
                     &a.ddt_bias}) &&
         no_float64(own);
}

bool no_float64_but_gate_cumsum(const LinearAttentionFwdArgs& a, std::initializer_list<const TensorView*> own) {
  LinearAttentionFwdArgs b = a;
  b.g_cumsum = TensorView();
  return no_float64(b, {}) && no_float64(own);
}

bool no_float64_but_gate_cumsum(const LinearAttentionBwdArgs& a, std::initializer_list<const TensorView*> own) {
  LinearAttentionBwdArgs b = a;
  b.g_cumsum = TensorView();
  return no_float64(b, {}) && no_float64(own);
}

bool no_float64(const LinearAttentionRecurrentFwdArgs& a) {
  return no_float64({&a.q, &a.k, &a.v, &a.g, &a.beta, &a.initial_state, &a.o, &a.final_state});
}

bool no_float64(const LinearAttentionRecurrentBwdArgs& a) {
  return no_float64({&a.q, &a.k, &a.v, &a.g, &a.beta, &a.initial_state, &a.dout, &a.dht, &a.dq, &a.dk,
                     &a.dv, &a.dg, &a.dbeta, &a.dh0});
}

Operands backward_operands(const LinearAttentionBwdArgs& a) {
  return {a.use_qk_l2norm_in_kernel ? a.q_normed : a.q, a.use_qk_l2norm_in_kernel ? a.k_normed : a.k,
          a.use_beta_sigmoid_in_kernel ? a.beta_sigmoid : a.beta, TensorView()};
}

OperandGrads carve_operand_grads(Carver& cv, const Dims& d, GateForm form, const LinearAttentionBwdArgs& a) {
  OperandGrads w;
  if (a.use_beta_sigmoid_in_kernel) w.dbeta = cv.take(d.acc, {d.B, d.T, d.HV});
  if (a.use_gate_in_kernel) w.dg = cv.take(d.acc, d.gate(form));
  if (a.use_qk_l2norm_in_kernel) {
    w.dq = cv.take(d.qdt, {d.B, d.T, d.H, d.K});
    w.dk = cv.take(d.qdt, {d.B, d.T, d.H, d.K});
  }
  return w;
}

OperandGrads pipeline_grads(const LinearAttentionBwdArgs& a, const OperandGrads& ws) {
  return {a.use_beta_sigmoid_in_kernel ? ws.dbeta : a.dbeta, a.use_gate_in_kernel ? ws.dg : a.dg,
          a.use_qk_l2norm_in_kernel ? ws.dq : a.dq, a.use_qk_l2norm_in_kernel ? ws.dk : a.dk};
}

}  // namespace fusedops::la
