// fused_cross_entropy_loss, float64 reference: plain loops, the executable form of docs/specs/ops.md 1.3-1.4.
#include <algorithm>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/cross_entropy.h"
#include "src/core/ref_util.h"
#include "src/ops/cross_entropy/ce_common.h"
#include "src/ops/cross_entropy/ce_ref.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "fused_cross_entropy_loss";

const std::vector<DType> kAllFloat = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                      DType::kFloat64};

int64_t label_at(const TensorView& labels, int64_t i) {
  return labels.dtype() == DType::kInt64 ? labels.data_as<const int64_t>()[i]
                                         : labels.data_as<const int32_t>()[i];
}

void fwd(const Context& ctx, const CrossEntropyFwdArgs& a) {
  const CrossEntropyOptions& o = a.options;
  const int64_t N = a.logits.rows(), V = a.logits.size(-1);
  int64_t valid = 0;
  for (int64_t i = 0; i < N; ++i) valid += label_at(a.labels, i) != o.ignore_index;
  const double norm = o.reduction == LossReduction::kMean ? std::max<int64_t>(1, valid) : 1.0;
  double loss_sum = 0, z_sum = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t y = label_at(a.labels, i);
    const double w = a.loss_weight.defined() ? ref::load(a.loss_weight, i) : 1.0;
    ce::RefRow row;
    std::vector<double> grad(a.grad_logits.defined() ? V : 0, 0.0);
    if (y != o.ignore_index)
      row = ce::ref_row(ref::load_row(a.logits, i), y, o, w / norm,
                        a.grad_logits.defined() ? &grad : nullptr);
    const double row_loss = row.loss, row_z = row.z;
    if (a.grad_logits.defined()) ref::store_row(a.grad_logits, i, grad);
    if (a.grad_loss_weight.defined()) ref::store(a.grad_loss_weight, i, row_loss / norm);
    if (o.reduction == LossReduction::kNone) {
      ref::store(a.loss, i, w * row_loss);
      if (a.z_loss.defined()) ref::store(a.z_loss, i, row_z);
    } else {
      loss_sum += w * row_loss / norm;
      z_sum += row_z / norm;
    }
  }
  if (o.reduction != LossReduction::kNone) {
    ref::store(a.loss, 0, loss_sum);
    if (a.z_loss.defined()) ref::store(a.z_loss, 0, z_sum);
  }
}

void bwd(const Context&, const CrossEntropyBwdArgs& a) {
  const bool per_row = a.reduction == LossReduction::kNone;
  auto factor = [&](int64_t i) { return ref::load(a.grad_loss, per_row ? i : 0); };
  if (a.saved_grad_logits.defined()) {
    const int64_t N = a.saved_grad_logits.rows();
    for (int64_t i = 0; i < N; ++i) {
      std::vector<double> row = ref::load_row(a.saved_grad_logits, i);
      const double g = factor(i);
      for (double& v : row) v *= g;
      ref::store_row(a.grad_logits, i, row);
    }
  }
  if (a.saved_grad_loss_weight.defined()) {
    for (int64_t i = 0; i < a.saved_grad_loss_weight.numel(); ++i)
      ref::store(a.grad_loss_weight, i, factor(i) * ref::load(a.saved_grad_loss_weight, i));
  }
}

}  // namespace

void register_fused_cross_entropy_loss_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX, kAllFloat, kPriorityRef};
  r.add<CrossEntropyFwdArgs>(kOp, Direction::kForward, spec, nullptr, fwd);
  r.add<CrossEntropyBwdArgs>(kOp, Direction::kBackward, spec, nullptr, bwd);
}

}  // namespace fusedops
