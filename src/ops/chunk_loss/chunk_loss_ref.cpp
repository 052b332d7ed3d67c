// chunk_loss, float64 reference: plain loops over rows (no chunking: chunks change only the
// order of the float32 sums of the other backends), the executable form of docs/specs/ops.md 10.3.
#include <algorithm>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/chunk_loss.h"
#include "src/core/ref_util.h"
#include "src/ops/cross_entropy/ce_common.h"
#include "src/ops/cross_entropy/ce_ref.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "chunk_loss";

const std::vector<DType> kAllFloat = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                      DType::kFloat64};

int64_t label_at(const TensorView& labels, int64_t i) {
  return labels.dtype() == DType::kInt64 ? labels.data_as<const int64_t>()[i]
                                         : labels.data_as<const int32_t>()[i];
}

void fwd(const Context& ctx, const ChunkLossFwdArgs& a) {
  const CrossEntropyOptions& o = a.options;
  const int64_t N = a.hidden.rows(), H = a.hidden.size(-1), V = a.weight.size(0);
  int64_t valid = 0;
  for (int64_t i = 0; i < N; ++i) valid += label_at(a.labels, i) != o.ignore_index;
  const double mean_div = o.reduction == LossReduction::kMean ? std::max<int64_t>(1, valid) : 1.0;
  const int64_t per_sample = a.alpha_per_sample.defined() ? a.hidden.size(1) : 1;

  std::vector<double> W(V * H);
  for (int64_t v = 0; v < V; ++v)
    for (int64_t h = 0; h < H; ++h) W[v * H + h] = ref::load(a.weight, v * H + h);
  std::vector<double> dW(a.grad_weight.defined() ? V * H : 0, 0.0);
  const bool want_grad = a.grad_hidden.defined() || a.grad_weight.defined();
  double loss = 0, z_loss = 0;
  std::vector<double> z(V), grad;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t y = label_at(a.labels, i);
    const std::vector<double> h = ref::load_row(a.hidden, i);
    std::vector<double> dh(H, 0.0);
    double norm_inv = 0, row_loss = 0;
    if (y != o.ignore_index) {
      const double alpha = a.alpha_per_sample.defined() ? ref::load(a.alpha_per_sample, i / per_sample) : a.alpha;
      norm_inv = 1.0 / (mean_div * alpha);
      const double w = a.loss_weight.defined() ? ref::load(a.loss_weight, i) : 1.0;
      for (int64_t v = 0; v < V; ++v) {
        double s = 0;
        for (int64_t k = 0; k < H; ++k) s += h[k] * W[v * H + k];
        z[v] = s;
      }
      const ce::RefRow r = ce::ref_row(z, y, o, w * norm_inv, want_grad ? &grad : nullptr);
      row_loss = r.loss;
      loss += w * norm_inv * r.loss;
      z_loss += norm_inv * r.z;
      if (want_grad) {
        for (int64_t v = 0; v < V; ++v) {
          const double g = grad[v];
          for (int64_t k = 0; k < H; ++k) dh[k] += g * W[v * H + k];
          if (!dW.empty())
            for (int64_t k = 0; k < H; ++k) dW[v * H + k] += g * h[k];
        }
      }
    }
    if (a.grad_hidden.defined())
      for (int64_t k = 0; k < H; ++k) ref::store(a.grad_hidden, i * H + k, dh[k]);
    if (a.grad_loss_weight.defined()) ref::store(a.grad_loss_weight, i, norm_inv * row_loss);
  }
  ref::store(a.loss, 0, loss);
  if (a.z_loss.defined()) ref::store(a.z_loss, 0, z_loss);
  if (a.grad_weight.defined()) {
    for (int64_t j = 0; j < V * H; ++j)
      ref::store(a.grad_weight, j, dW[j] + (a.accumulate_grad_weight ? ref::load(a.grad_weight, j) : 0.0));
  }
}

void scale(const TensorView& in, const TensorView& out, double g) {
  for (int64_t j = 0; j < in.numel(); ++j) ref::store(out, j, g * ref::load(in, j));
}

void bwd(const Context&, const ChunkLossBwdArgs& a) {
  const double g = ref::load(a.grad_loss, 0);
  if (a.saved_grad_hidden.defined()) scale(a.saved_grad_hidden, a.grad_hidden, g);
  if (a.saved_grad_weight.defined()) scale(a.saved_grad_weight, a.grad_weight, g);
  if (a.saved_grad_loss_weight.defined()) scale(a.saved_grad_loss_weight, a.grad_loss_weight, g);
}

}  // namespace

void register_chunk_loss_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX, kAllFloat, kPriorityRef};
  r.add<ChunkLossFwdArgs>(kOp, Direction::kForward, spec, nullptr, fwd);
  r.add<ChunkLossBwdArgs>(kOp, Direction::kBackward, spec, nullptr, bwd);
}

}  // namespace fusedops
