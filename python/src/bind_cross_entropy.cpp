#include "python/src/bind.h"

namespace fusedops::py {

namespace {

CrossEntropyOptions options(int64_t ignore_index, const std::string& reduction, double label_smoothing,
                            double logit_scale, std::optional<double> logit_softcapping,
                            double lse_square_scale, const char* op) {
  CrossEntropyOptions o;
  o.ignore_index = ignore_index;
  o.reduction = parse_loss_reduction(reduction, op);
  o.label_smoothing = label_smoothing;
  o.logit_scale = logit_scale;
  o.logit_softcapping = logit_softcapping;
  o.lse_square_scale = lse_square_scale;
  return o;
}

}  // namespace

void bind_cross_entropy(nb::module_& m) {
  m.def("cross_entropy_workspace_size", &cross_entropy_workspace_size, nb::arg("ctx"), nb::arg("rows"),
        nb::arg("vocab"));
  m.def("fused_cross_entropy_loss_fwd",
        [](const Context& ctx, const Array& logits, const Array& labels, const OptArray& loss_weight,
           const Array& loss, const OptArray& z_loss, const OptArray& grad_logits,
           const OptArray& grad_loss_weight, const OptArray& workspace, int64_t ignore_index,
           const std::string& reduction, double label_smoothing, double logit_scale,
           std::optional<double> logit_softcapping, double lse_square_scale) {
          CrossEntropyFwdArgs a{view(logits), view(labels), view(loss_weight), view(loss), view(z_loss),
                                view(grad_logits), view(grad_loss_weight), view(workspace),
                                options(ignore_index, reduction, label_smoothing, logit_scale,
                                        logit_softcapping, lse_square_scale, "fused_cross_entropy_loss")};
          fused_cross_entropy_loss_fwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("logits"), nb::arg("labels"), nb::arg("loss_weight").none(),
        nb::arg("loss"), nb::arg("z_loss").none(), nb::arg("grad_logits").none(),
        nb::arg("grad_loss_weight").none(), nb::arg("workspace").none(), nb::arg("ignore_index"),
        nb::arg("reduction"), nb::arg("label_smoothing"), nb::arg("logit_scale"),
        nb::arg("logit_softcapping").none(), nb::arg("lse_square_scale"), release_gil());
  m.def("fused_cross_entropy_loss_bwd",
        [](const Context& ctx, const Array& grad_loss, const OptArray& saved_grad_logits,
           const OptArray& grad_logits, const OptArray& saved_grad_loss_weight,
           const OptArray& grad_loss_weight, const std::string& reduction) {
          CrossEntropyBwdArgs a{view(grad_loss), view(saved_grad_logits), view(grad_logits),
                                view(saved_grad_loss_weight), view(grad_loss_weight),
                                parse_loss_reduction(reduction, "fused_cross_entropy_loss")};
          fused_cross_entropy_loss_bwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("grad_loss"), nb::arg("saved_grad_logits").none(),
        nb::arg("grad_logits").none(), nb::arg("saved_grad_loss_weight").none(),
        nb::arg("grad_loss_weight").none(), nb::arg("reduction"), release_gil());
  // The vocabulary-parallel pieces (fusedops.distributed): only ignore_index, logit_scale and
  // logit_softcapping of the options matter to them.
  auto shard_options = [](int64_t ignore_index, double logit_scale, std::optional<double> softcap) {
    CrossEntropyOptions o;
    o.ignore_index = ignore_index;
    o.logit_scale = logit_scale;
    o.logit_softcapping = softcap;
    return o;
  };
  m.def("fused_cross_entropy_loss_shard_stats",
        [shard_options](const Context& ctx, const Array& logits, const Array& labels, const Array& stats,
                        int64_t vocab_start, int64_t ignore_index, double logit_scale,
                        std::optional<double> softcap) {
          fused_cross_entropy_loss_shard_stats(ctx, {view(logits), view(labels), view(stats), vocab_start,
                                                     shard_options(ignore_index, logit_scale, softcap)});
        },
        nb::arg("ctx"), nb::arg("logits"), nb::arg("labels"), nb::arg("stats"), nb::arg("vocab_start"),
        nb::arg("ignore_index"), nb::arg("logit_scale"), nb::arg("logit_softcapping").none(), release_gil());
  m.def("fused_cross_entropy_loss_shard_bwd",
        [shard_options](const Context& ctx, const Array& logits, const Array& labels, const Array& row_grads,
                        const Array& grad_logits, int64_t vocab_start, int64_t ignore_index, double logit_scale,
                        std::optional<double> softcap) {
          fused_cross_entropy_loss_shard_bwd(ctx, {view(logits), view(labels), view(row_grads), view(grad_logits),
                                                   vocab_start, shard_options(ignore_index, logit_scale, softcap)});
        },
        nb::arg("ctx"), nb::arg("logits"), nb::arg("labels"), nb::arg("row_grads"), nb::arg("grad_logits"),
        nb::arg("vocab_start"), nb::arg("ignore_index"), nb::arg("logit_scale"),
        nb::arg("logit_softcapping").none(), release_gil());
}

}  // namespace fusedops::py
