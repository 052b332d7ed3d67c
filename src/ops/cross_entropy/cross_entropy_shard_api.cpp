// The vocabulary-parallel cross-entropy pieces (fused_cross_entropy_loss_shard_stats / _bwd):
// argument checks, then dispatch to the selected backend.
#include <string>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/cross_entropy.h"
#include "src/ops/cross_entropy/ce_common.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "cross_entropy_shard";

int64_t check_common(const ArgCheck& c, const Context& ctx, const TensorView& logits, const TensorView& labels,
                     const TensorView& rows4, const char* rows4_name, int64_t vocab_start,
                     const CrossEntropyOptions& o) {
  ce::check_options(kOp, o);
  c.min_rank(logits, "logits", 2).floating(logits, "logits").on_device(logits, "logits", ctx)
      .rows_addressable(logits, "logits");
  const int64_t N = logits.rows();
  c.value(logits.size(-1) >= 1, "logits must hold at least one vocabulary entry, got shape " +
                                    logits.shape_string());
  c.value(vocab_start >= 0, "vocab_start must be >= 0, got " + std::to_string(vocab_start));
  c.defined(labels, "labels").dtype_in(labels, "labels", {DType::kInt32, DType::kInt64})
      .on_device(labels, "labels", ctx);
  c.value(labels.numel() == N, "labels must have one entry per row of logits (" + std::to_string(N) +
                                   "), got shape " + labels.shape_string());
  ce::check_dense(c, labels, "labels");
  c.defined(rows4, rows4_name).dtype_in(rows4, rows4_name, {DType::kFloat32, DType::kFloat64})
      .on_device(rows4, rows4_name, ctx).shape(rows4, rows4_name, {N, 4});
  ce::check_dense(c, rows4, rows4_name);
  return N;
}

}  // namespace

void fused_cross_entropy_loss_shard_stats(const Context& ctx, const CrossEntropyShardStatsArgs& a) {
  ArgCheck c(kOp);
  const int64_t N = check_common(c, ctx, a.logits, a.labels, a.stats, "stats", a.vocab_start, a.options);
  if (N == 0) return;
  dispatch(kOp, Direction::kForward, ctx, a.logits.dtype(), a);
}

void fused_cross_entropy_loss_shard_bwd(const Context& ctx, const CrossEntropyShardBwdArgs& a) {
  ArgCheck c(kOp);
  const int64_t N = check_common(c, ctx, a.logits, a.labels, a.row_grads, "row_grads", a.vocab_start, a.options);
  c.defined(a.grad_logits, "grad_logits").same_shape(a.grad_logits, "grad_logits", a.logits, "logits")
      .same_dtype(a.grad_logits, "grad_logits", a.logits, "logits").on_device(a.grad_logits, "grad_logits", ctx);
  ce::check_dense(c, a.grad_logits, "grad_logits");
  if (a.grad_logits.data() == a.logits.data() && a.logits.numel() > 0)
    c.value(a.logits.is_contiguous(), "an in-place gradient (grad_logits == logits) needs contiguous logits");
  ce::check_in_place_or_apart(c, a.grad_logits, "grad_logits", a.logits, "logits");
  if (N == 0) return;
  dispatch(kOp, Direction::kBackward, ctx, a.logits.dtype(), a);
}

void fused_cross_entropy_loss_shard_stats_ref(const Context& ctx, const CrossEntropyShardStatsArgs& a) {
  fused_cross_entropy_loss_shard_stats(with_backend(ctx, "ref"), a);
}

void fused_cross_entropy_loss_shard_bwd_ref(const Context& ctx, const CrossEntropyShardBwdArgs& a) {
  fused_cross_entropy_loss_shard_bwd(with_backend(ctx, "ref"), a);
}

}  // namespace fusedops
