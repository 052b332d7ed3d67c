// sort_chunks family: argument checks, content checks (CPU always, CUDA with debug checks), then
// dispatch.
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/sort_chunks.h"
#include "src/ops/sort_chunks/sort_chunks_common.h"

namespace fusedops {
namespace sort_chunks {

ChunkTables build_tables(const std::vector<int64_t>& sizes, const std::vector<int64_t>& order) {
  const int64_t S = static_cast<int64_t>(sizes.size());
  ChunkTables t;
  t.in_off.assign(S + 1, 0);
  t.shift.assign(S + 1, 0);
  for (int64_t c = 0; c < S; ++c) t.in_off[c + 1] = t.in_off[c] + std::max<int64_t>(sizes[c], 0);
  int64_t out_off = 0;
  for (int64_t j = 0; j < S && j < static_cast<int64_t>(order.size()); ++j) {
    const int64_t c = order[j];
    if (c < 0 || c >= S) continue;
    t.shift[c] = out_off - t.in_off[c];
    out_off += std::max<int64_t>(sizes[c], 0);
  }
  return t;
}

std::vector<int64_t> read_host_indices(const TensorView& t) {
  const int64_t n = t.numel();
  std::vector<int64_t> out(n);
  const int64_t stride = t.ndim() == 1 ? t.stride(0) : 1;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = t.dtype() == DType::kInt32 ? static_cast<int64_t>(t.data_as<const int32_t>()[i * stride])
                                        : t.data_as<const int64_t>()[i * stride];
  }
  return out;
}

void validate_chunks(const char* op, const std::vector<int64_t>& sizes,
                     const std::vector<int64_t>& order, int64_t N) {
  const int64_t S = static_cast<int64_t>(sizes.size());
  int64_t total = 0;
  for (int64_t c = 0; c < S; ++c) {
    FUSEDOPS_REQUIRE(sizes[c] >= 0, kValue, op, "split_sizes must be >= 0, got split_sizes[", c,
                     "] = ", sizes[c]);
    total += sizes[c];
  }
  FUSEDOPS_REQUIRE(total <= N, kValue, op, "the sum of split_sizes (", total,
                   ") must not exceed the number of rows of inp (", N, ")");
  std::vector<char> seen(S, 0);
  for (int64_t j = 0; j < S; ++j) {
    const int64_t c = order[j];
    FUSEDOPS_REQUIRE(c >= 0 && c < S, kValue, op, "sorted_index must be a permutation of 0..",
                     S - 1, ", got sorted_index[", j, "] = ", c);
    FUSEDOPS_REQUIRE(!seen[c], kValue, op, "sorted_index must be a permutation of 0..", S - 1,
                     ", got ", c, " twice");
    seen[c] = 1;
  }
}

void validate_row_map(const char* op, const std::vector<int64_t>& map, int64_t N) {
  std::vector<char> seen(N, 0);
  for (int64_t r = 0; r < static_cast<int64_t>(map.size()); ++r) {
    const int64_t d = map[r];
    FUSEDOPS_REQUIRE(d >= 0 && d < N, kValue, op, "row_id_map must be a permutation of 0..", N - 1,
                     ", got row_id_map[", r, "] = ", d);
    FUSEDOPS_REQUIRE(!seen[d], kValue, op, "row_id_map must be a permutation of 0..", N - 1,
                     ", got ", d, " twice");
    seen[d] = 1;
  }
}

}  // namespace sort_chunks

namespace {

using namespace sort_chunks;

// Contiguous, or empty (torch gives zero-size tensors strides that is_contiguous rejects).
void contiguous_or_empty(const ArgCheck& c, const TensorView& t, const char* name) {
  if (t.numel() > 0) c.contiguous(t, name);
}

void check_indices(const ArgCheck& c, const Context& ctx, const TensorView& split_sizes,
                   const TensorView& sorted_index) {
  c.rank(split_sizes, "split_sizes", 1)
      .dtype_in(split_sizes, "split_sizes", {DType::kInt32, DType::kInt64})
      .on_device(split_sizes, "split_sizes", ctx);
  contiguous_or_empty(c, split_sizes, "split_sizes");
  c.rank(sorted_index, "sorted_index", 1)
      .dtype_in(sorted_index, "sorted_index", {DType::kInt32, DType::kInt64})
      .on_device(sorted_index, "sorted_index", ctx);
  contiguous_or_empty(c, sorted_index, "sorted_index");
  c.value(split_sizes.numel() == sorted_index.numel(),
          "split_sizes and sorted_index must have the same number of elements, got " +
              std::to_string(split_sizes.numel()) + " and " +
              std::to_string(sorted_index.numel()));
}

void check_rows(const ArgCheck& c, const Context& ctx, const TensorView& t, const char* name) {
  c.rank(t, name, 2).on_device(t, name, ctx);
  // An empty tensor addresses nothing (torch gives some of them zero strides).
  if (t.numel() > 0) c.rows_addressable(t, name);
  c.value(t.size(0) <= INT_MAX, std::string(name) + " has " + std::to_string(t.size(0)) +
                                    " rows; row_id_map is int32, so at most 2^31-1 are supported");
}

void check_map(const ArgCheck& c, const Context& ctx, const TensorView& map, int64_t N,
               const char* what) {
  c.shape(map, "row_id_map", {N}, what).dtype_in(map, "row_id_map", {DType::kInt32})
      .on_device(map, "row_id_map", ctx);
  contiguous_or_empty(c, map, "row_id_map");
}

// probs [N] (any stride) and its output [N] contiguous, of probs' dtype; both or neither.
void check_probs(const ArgCheck& c, const Context& ctx, const TensorView& probs, const char* pname,
                 const TensorView& probs_out, const char* oname, int64_t N, const char* what) {
  if (!probs.defined()) {
    c.value(!probs_out.defined(), std::string(oname) + " must not be given without " + pname);
    return;
  }
  c.shape(probs, pname, {N}, what).on_device(probs, pname, ctx);
  c.defined(probs_out, oname);
  c.shape(probs_out, oname, {N}, what).same_dtype(probs_out, oname, probs, pname)
      .on_device(probs_out, oname, ctx);
  contiguous_or_empty(c, probs_out, oname);
}

void check_workspace(const ArgCheck& c, const Context& ctx, const TensorView& ws, int64_t S) {
  if (ctx.device.kind != DeviceKind::kCUDA || S == 0) return;
  c.workspace(ws, ctx, static_cast<int64_t>(sort_chunks_by_idx_workspace_size(S)),
              "sort_chunks_by_idx_workspace_size", 8);
}

void check_fwd(const Context& ctx, const SortChunksFwdArgs& a) {
  ArgCheck c(kOpIdx);
  check_rows(c, ctx, a.inp, "inp");
  const int64_t N = a.inp.size(0);
  check_indices(c, ctx, a.split_sizes, a.sorted_index);
  check_probs(c, ctx, a.probs, "probs", a.probs_out, "probs_out", N, "[N], N = rows of inp");
  c.same_shape(a.out, "out", a.inp, "inp").same_dtype(a.out, "out", a.inp, "inp")
      .on_device(a.out, "out", ctx);
  contiguous_or_empty(c, a.out, "out");
  check_map(c, ctx, a.row_id_map, N, "[N], N = rows of inp");
  check_workspace(c, ctx, a.workspace, a.split_sizes.numel());
}

void check_bwd(const Context& ctx, const SortChunksBwdArgs& a) {
  ArgCheck c(kOpIdx);
  check_rows(c, ctx, a.d_out, "d_out");
  const int64_t N = a.d_out.size(0);
  check_map(c, ctx, a.row_id_map, N, "[N], N = rows of d_out");
  check_probs(c, ctx, a.d_probs_out, "d_probs_out", a.d_probs, "d_probs", N,
              "[N], N = rows of d_out");
  c.same_shape(a.d_inp, "d_inp", a.d_out, "d_out").same_dtype(a.d_inp, "d_inp", a.d_out, "d_out")
      .on_device(a.d_inp, "d_inp", ctx);
  contiguous_or_empty(c, a.d_inp, "d_inp");
}

void check_map_args(const Context& ctx, const ChunkSortMapArgs& a) {
  ArgCheck c(kOpMap);
  check_indices(c, ctx, a.split_sizes, a.sorted_index);
  c.rank(a.row_id_map, "row_id_map", 1);
  check_map(c, ctx, a.row_id_map, a.row_id_map.size(0), nullptr);
  c.value(a.row_id_map.size(0) <= INT_MAX, "row_id_map has " +
                                               std::to_string(a.row_id_map.size(0)) +
                                               " rows; at most 2^31-1 are supported");
  check_workspace(c, ctx, a.workspace, a.split_sizes.numel());
}

void check_by_map(const Context& ctx, const SortChunksByMapArgs& a) {
  ArgCheck c(kOpByMap);
  check_rows(c, ctx, a.inp, "inp");
  const int64_t N = a.inp.size(0);
  check_map(c, ctx, a.row_id_map, N, "[N], N = rows of inp");
  check_probs(c, ctx, a.probs, "probs", a.probs_out, "probs_out", N, "[N], N = rows of inp");
  c.same_shape(a.out, "out", a.inp, "inp").same_dtype(a.out, "out", a.inp, "inp")
      .on_device(a.out, "out", ctx);
  contiguous_or_empty(c, a.out, "out");
}

// The contents are read where that is free (the CPU) or asked for (debug checks, a sync on CUDA).
bool read_contents(const Context& ctx) {
  return ctx.device.kind == DeviceKind::kCPU || debug_checks(ctx);
}

void validate_indices(const char* op, const Context& ctx, const TensorView& split_sizes,
                      const TensorView& sorted_index, int64_t N) {
  if (!read_contents(ctx)) return;
  validate_chunks(op, read_index_values(op, ctx, split_sizes),
                  read_index_values(op, ctx, sorted_index), N);
}

void validate_map(const char* op, const Context& ctx, const TensorView& map, int64_t N) {
  if (!read_contents(ctx)) return;
  validate_row_map(op, read_index_values(op, ctx, map), N);
}

}  // namespace

size_t sort_chunks_by_idx_workspace_size(int64_t num_splits) {
  // int64 in_off[S+1] and shift[S+1].
  return num_splits > 0 ? static_cast<size_t>(2 * (num_splits + 1)) * sizeof(int64_t) : 0;
}

size_t sort_chunks_by_map_workspace_size(int64_t num_rows, bool is_forward) {
  // One bit per destination row, in 32-bit words.
  return is_forward && num_rows > 0 ? static_cast<size_t>((num_rows + 31) / 32) * 4 : 0;
}

void sort_chunks_by_idx_fwd(const Context& ctx, const SortChunksFwdArgs& args) {
  check_fwd(ctx, args);
  const int64_t N = args.inp.size(0);
  validate_indices(kOpIdx, ctx, args.split_sizes, args.sorted_index, N);
  if (N == 0) return;
  dispatch(kOpIdx, Direction::kForward, ctx, args.inp.dtype(), args);
}

void sort_chunks_by_idx_bwd(const Context& ctx, const SortChunksBwdArgs& args) {
  check_bwd(ctx, args);
  const int64_t N = args.d_out.size(0);
  if (N == 0) return;
  validate_map(kOpIdx, ctx, args.row_id_map, N);
  dispatch(kOpIdx, Direction::kBackward, ctx, args.d_out.dtype(), args);
}

void make_chunk_sort_map(const Context& ctx, const ChunkSortMapArgs& args) {
  check_map_args(ctx, args);
  const int64_t N = args.row_id_map.size(0);
  validate_indices(kOpMap, ctx, args.split_sizes, args.sorted_index, N);
  if (N == 0) return;
  dispatch(kOpMap, Direction::kForward, ctx, args.split_sizes.dtype(), args);
}

void sort_chunks_by_map(const Context& ctx, const SortChunksByMapArgs& args) {
  check_by_map(ctx, args);
  const int64_t N = args.inp.size(0);
  if (N == 0) return;
  validate_map(kOpByMap, ctx, args.row_id_map, N);
  dispatch(kOpByMap, Direction::kForward, ctx, args.inp.dtype(), args);
}

void sort_chunks_by_idx_fwd_ref(const Context& ctx, const SortChunksFwdArgs& args) {
  sort_chunks_by_idx_fwd(with_backend(ctx, "ref"), args);
}

void sort_chunks_by_idx_bwd_ref(const Context& ctx, const SortChunksBwdArgs& args) {
  sort_chunks_by_idx_bwd(with_backend(ctx, "ref"), args);
}

}  // namespace fusedops
