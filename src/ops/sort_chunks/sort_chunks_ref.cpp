// sort_chunks family, reference: plain loops over the definition of docs/specs/ops.md section 6.3, one
// row at a time. The executable spec that the faster backends are tested against.
#include <cstring>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/sort_chunks.h"
#include "src/ops/sort_chunks/sort_chunks_common.h"

namespace fusedops {
namespace {

using namespace sort_chunks;

// Address of element (row, col) of a 2-D view, or of element i of a 1-D view.
const uint8_t* at(const TensorView& t, int64_t row, int64_t col = 0) {
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype()));
  const int64_t off = row * t.stride(0) + (t.ndim() > 1 ? col * t.stride(1) : 0);
  return static_cast<const uint8_t*>(t.data()) + off * es;
}
uint8_t* at_mut(const TensorView& t, int64_t row, int64_t col = 0) {
  return const_cast<uint8_t*>(at(t, row, col));
}

// dst row <- src row (element by element, so any strides work), or zeros when src < 0.
void copy_row(const TensorView& dst, int64_t d, const TensorView& src, int64_t s) {
  const size_t es = dtype_size(src.dtype());
  const int64_t cols = src.ndim() > 1 ? src.size(1) : 1;
  for (int64_t k = 0; k < cols; ++k) {
    if (s >= 0) std::memcpy(at_mut(dst, d, k), at(src, s, k), es);
    else std::memset(at_mut(dst, d, k), 0, es);
  }
}

// row_id_map[r] following section 6.3 term by term.
std::vector<int64_t> row_map(const TensorView& split_sizes, const TensorView& sorted_index,
                             int64_t N) {
  const std::vector<int64_t> split = read_host_indices(split_sizes);
  const std::vector<int64_t> order = read_host_indices(sorted_index);
  const int64_t S = static_cast<int64_t>(split.size());
  std::vector<int64_t> in_off(S, 0), pos(S, -1), out_off(S, 0);
  for (int64_t c = 1; c < S; ++c) in_off[c] = in_off[c - 1] + split[c - 1];
  for (int64_t j = 0; j < S; ++j)
    if (order[j] >= 0 && order[j] < S) pos[order[j]] = j;
  for (int64_t j = 1; j < S; ++j) {
    const int64_t prev = order[j - 1];
    out_off[j] = out_off[j - 1] + (prev >= 0 && prev < S ? split[prev] : 0);
  }
  std::vector<int64_t> map(N);
  for (int64_t r = 0; r < N; ++r) {
    map[r] = r;  // rows past the chunks (and, for invalid input, rows no chunk places)
    for (int64_t c = 0; c < S; ++c) {
      if (r >= in_off[c] && r < in_off[c] + split[c]) {
        if (pos[c] >= 0) map[r] = out_off[pos[c]] + (r - in_off[c]);
        break;
      }
    }
  }
  return map;
}

void write_map(const TensorView& row_id_map, const std::vector<int64_t>& map) {
  for (size_t r = 0; r < map.size(); ++r)
    row_id_map.data_as<int32_t>()[r] = static_cast<int32_t>(map[r]);
}

// Forward (scatter) or backward (gather) through `map`; rows whose target is out of range are
// skipped (scatter) or zero-filled (gather) so that invalid maps stay in bounds.
void move_rows(const TensorView& inp, const TensorView& probs, const TensorView& out,
               const TensorView& probs_out, const std::vector<int64_t>& map, bool scatter) {
  const int64_t N = inp.size(0);
  for (int64_t r = 0; r < N; ++r) {
    const int64_t m = map[r];
    const bool ok = m >= 0 && m < N;
    if (scatter) {
      if (!ok) continue;
      copy_row(out, m, inp, r);
      if (probs.defined()) copy_row(probs_out, m, probs, r);
    } else {
      copy_row(out, r, inp, ok ? m : -1);
      if (probs.defined()) copy_row(probs_out, r, probs, ok ? m : -1);
    }
  }
}

std::vector<int64_t> saved_map(const TensorView& row_id_map) {
  std::vector<int64_t> map(row_id_map.numel());
  for (size_t r = 0; r < map.size(); ++r) map[r] = row_id_map.data_as<const int32_t>()[r];
  return map;
}

void fwd(const Context&, const SortChunksFwdArgs& a) {
  const std::vector<int64_t> map = row_map(a.split_sizes, a.sorted_index, a.inp.size(0));
  write_map(a.row_id_map, map);
  move_rows(a.inp, a.probs, a.out, a.probs_out, map, true);
}

void bwd(const Context&, const SortChunksBwdArgs& a) {
  move_rows(a.d_out, a.d_probs_out, a.d_inp, a.d_probs, saved_map(a.row_id_map), false);
}

void make_map(const Context&, const ChunkSortMapArgs& a) {
  write_map(a.row_id_map, row_map(a.split_sizes, a.sorted_index, a.row_id_map.size(0)));
}

void by_map(const Context&, const SortChunksByMapArgs& a) {
  move_rows(a.inp, a.probs, a.out, a.probs_out, saved_map(a.row_id_map), a.is_forward);
}

}  // namespace

void register_sort_chunks_by_idx_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX, all_dtypes(), kPriorityRef};
  r.add<SortChunksFwdArgs>(kOpIdx, Direction::kForward, spec, nullptr, fwd);
  r.add<SortChunksBwdArgs>(kOpIdx, Direction::kBackward, spec, nullptr, bwd);
  r.add<ChunkSortMapArgs>(kOpMap, Direction::kForward, spec, nullptr, make_map);
  r.add<SortChunksByMapArgs>(kOpByMap, Direction::kForward, spec, nullptr, by_map);
}

}  // namespace fusedops
