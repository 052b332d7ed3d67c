#include "python/src/bind.h"

namespace fusedops::py {

namespace {

// The arguments the workspace / chunk queries read.
ChunkLossFwdArgs query_args(const Array& hidden, const Array& weight, const OptArray& grad_hidden,
                            const OptArray& grad_weight, bool accumulate_grad_weight,
                            int64_t chunk_size, int64_t memory_budget) {
  ChunkLossFwdArgs a;
  a.hidden = view(hidden);
  a.weight = view(weight);
  a.grad_hidden = view(grad_hidden);
  a.grad_weight = view(grad_weight);
  a.accumulate_grad_weight = accumulate_grad_weight;
  a.chunk_size = chunk_size;
  a.memory_budget = memory_budget;
  return a;
}

}  // namespace

void bind_chunk_loss(nb::module_& m) {
  m.def("chunk_loss_workspace_size",
        [](const Context& ctx, const Array& hidden, const Array& weight, const OptArray& grad_hidden,
           const OptArray& grad_weight, bool accumulate_grad_weight, int64_t chunk_size,
           int64_t memory_budget) {
          return chunk_loss_workspace_size(ctx, query_args(hidden, weight, grad_hidden, grad_weight,
                                                           accumulate_grad_weight, chunk_size, memory_budget));
        },
        nb::arg("ctx"), nb::arg("hidden"), nb::arg("weight"), nb::arg("grad_hidden").none(),
        nb::arg("grad_weight").none(), nb::arg("accumulate_grad_weight"), nb::arg("chunk_size"),
        nb::arg("memory_budget"));
  m.def("chunk_loss_chunk_rows",
        [](const Context& ctx, const Array& hidden, const Array& weight, const OptArray& grad_hidden,
           const OptArray& grad_weight, bool accumulate_grad_weight, int64_t chunk_size,
           int64_t memory_budget) {
          return chunk_loss_chunk_rows(ctx, query_args(hidden, weight, grad_hidden, grad_weight,
                                                       accumulate_grad_weight, chunk_size, memory_budget));
        },
        nb::arg("ctx"), nb::arg("hidden"), nb::arg("weight"), nb::arg("grad_hidden").none(),
        nb::arg("grad_weight").none(), nb::arg("accumulate_grad_weight"), nb::arg("chunk_size"),
        nb::arg("memory_budget"));
  m.def("chunk_loss_fwd",
        [](const Context& ctx, const Array& hidden, const Array& weight, const OptArray& bias,
           const Array& labels, const OptArray& loss_weight, double alpha, const OptArray& alpha_per_sample,
           const Array& loss, const OptArray& z_loss, const OptArray& grad_hidden,
           const OptArray& grad_weight, bool accumulate_grad_weight, const OptArray& grad_loss_weight,
           int64_t chunk_size, int64_t memory_budget, const OptArray& workspace, int64_t ignore_index,
           const std::string& reduction, double label_smoothing, double logit_scale,
           std::optional<double> logit_softcapping, double lse_square_scale) {
          ChunkLossFwdArgs a;
          a.hidden = view(hidden);
          a.weight = view(weight);
          a.bias = view(bias);
          a.labels = view(labels);
          a.loss_weight = view(loss_weight);
          a.alpha = alpha;
          a.alpha_per_sample = view(alpha_per_sample);
          a.loss = view(loss);
          a.z_loss = view(z_loss);
          a.grad_hidden = view(grad_hidden);
          a.grad_weight = view(grad_weight);
          a.accumulate_grad_weight = accumulate_grad_weight;
          a.grad_loss_weight = view(grad_loss_weight);
          a.chunk_size = chunk_size;
          a.memory_budget = memory_budget;
          a.workspace = view(workspace);
          a.options.ignore_index = ignore_index;
          a.options.reduction = parse_loss_reduction(reduction, "chunk_loss");
          a.options.label_smoothing = label_smoothing;
          a.options.logit_scale = logit_scale;
          a.options.logit_softcapping = logit_softcapping;
          a.options.lse_square_scale = lse_square_scale;
          chunk_loss_fwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("hidden"), nb::arg("weight"), nb::arg("bias").none(), nb::arg("labels"),
        nb::arg("loss_weight").none(), nb::arg("alpha"), nb::arg("alpha_per_sample").none(),
        nb::arg("loss"), nb::arg("z_loss").none(), nb::arg("grad_hidden").none(),
        nb::arg("grad_weight").none(), nb::arg("accumulate_grad_weight"),
        nb::arg("grad_loss_weight").none(), nb::arg("chunk_size"), nb::arg("memory_budget"),
        nb::arg("workspace").none(), nb::arg("ignore_index"), nb::arg("reduction"),
        nb::arg("label_smoothing"), nb::arg("logit_scale"), nb::arg("logit_softcapping").none(),
        nb::arg("lse_square_scale"), release_gil());
  m.def("chunk_loss_bwd",
        [](const Context& ctx, const Array& grad_loss, const OptArray& saved_grad_hidden,
           const OptArray& grad_hidden, const OptArray& saved_grad_weight, const OptArray& grad_weight,
           const OptArray& saved_grad_loss_weight, const OptArray& grad_loss_weight) {
          chunk_loss_bwd(ctx, {view(grad_loss), view(saved_grad_hidden), view(grad_hidden),
                               view(saved_grad_weight), view(grad_weight), view(saved_grad_loss_weight),
                               view(grad_loss_weight)});
        },
        nb::arg("ctx"), nb::arg("grad_loss"), nb::arg("saved_grad_hidden").none(),
        nb::arg("grad_hidden").none(), nb::arg("saved_grad_weight").none(),
        nb::arg("grad_weight").none(), nb::arg("saved_grad_loss_weight").none(),
        nb::arg("grad_loss_weight").none(), release_gil());
}

}  // namespace fusedops::py
