#include "python/src/bind.h"

namespace fusedops::py {

void bind_sort_chunks(nb::module_& m) {
  m.def("sort_chunks_by_idx_workspace_size", &sort_chunks_by_idx_workspace_size,
        nb::arg("num_splits"));
  m.def("sort_chunks_by_idx_fwd",
        [](const Context& ctx, const Array& inp, const Array& split_sizes,
           const Array& sorted_index, const OptArray& probs, const Array& out,
           const OptArray& probs_out, const Array& row_id_map, const OptArray& workspace) {
          sort_chunks_by_idx_fwd(ctx, {view(inp), view(split_sizes), view(sorted_index),
                                       view(probs), view(out), view(probs_out), view(row_id_map),
                                       view(workspace)});
        },
        nb::arg("ctx"), nb::arg("inp"), nb::arg("split_sizes"), nb::arg("sorted_index"),
        nb::arg("probs").none(), nb::arg("out"), nb::arg("probs_out").none(),
        nb::arg("row_id_map"), nb::arg("workspace").none(), release_gil());
  m.def("sort_chunks_by_idx_bwd",
        [](const Context& ctx, const Array& d_out, const OptArray& d_probs_out,
           const Array& row_id_map, const Array& d_inp, const OptArray& d_probs) {
          sort_chunks_by_idx_bwd(ctx, {view(d_out), view(d_probs_out), view(row_id_map),
                                       view(d_inp), view(d_probs)});
        },
        nb::arg("ctx"), nb::arg("d_out"), nb::arg("d_probs_out").none(), nb::arg("row_id_map"),
        nb::arg("d_inp"), nb::arg("d_probs").none(), release_gil());
  m.def("make_chunk_sort_map",
        [](const Context& ctx, const Array& split_sizes, const Array& sorted_index,
           const Array& row_id_map, const OptArray& workspace) {
          make_chunk_sort_map(ctx, {view(split_sizes), view(sorted_index), view(row_id_map),
                                    view(workspace)});
        },
        nb::arg("ctx"), nb::arg("split_sizes"), nb::arg("sorted_index"), nb::arg("row_id_map"),
        nb::arg("workspace").none(), release_gil());
  m.def("sort_chunks_by_map_workspace_size", &sort_chunks_by_map_workspace_size,
        nb::arg("num_rows"), nb::arg("is_forward"));
  m.def("sort_chunks_by_map",
        [](const Context& ctx, const Array& inp, const Array& row_id_map, const OptArray& probs,
           const Array& out, const OptArray& probs_out, bool is_forward,
           const OptArray& workspace) {
          sort_chunks_by_map(ctx, {view(inp), view(row_id_map), view(probs), view(out),
                                   view(probs_out), is_forward, view(workspace)});
        },
        nb::arg("ctx"), nb::arg("inp"), nb::arg("row_id_map"), nb::arg("probs").none(),
        nb::arg("out"), nb::arg("probs_out").none(), nb::arg("is_forward"),
        nb::arg("workspace").none(), release_gil());
}

}  // namespace fusedops::py
