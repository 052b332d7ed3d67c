// Pieces shared by the sort_chunks backends: op names, the host-side chunk tables and the
// host-side content checks.
#pragma once

#include <cstdint>
#include <vector>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops::sort_chunks {

inline constexpr const char* kOpIdx = "sort_chunks_by_idx";
inline constexpr const char* kOpMap = "make_chunk_sort_map";
inline constexpr const char* kOpByMap = "sort_chunks_by_map";

// Every dtype a backend of this family takes (the op copies bytes).
inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> d = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                       DType::kFloat64, DType::kInt32,   DType::kInt64,
                                       DType::kBool,    DType::kUInt8};
  return d;
}

// The per-chunk tables of the forward, built on the host (CPU backends):
//   in_off[c] for c in 0..S (in_off[S] = sum of the sizes),
//   shift[c] = out_off[pos[c]] - in_off[c] for c in 0..S-1 and shift[S] = 0, so that a row r of
//   chunk c goes to r + shift[c] and rows past the chunks stay where they are.
// Invalid contents (negative sizes, non-permutations) give some tables without failing: sizes
// below 0 count as 0, entries of sorted_index outside 0..S-1 are skipped, a chunk that
// sorted_index does not name keeps shift 0. Callers must bound-check the rows they derive.
struct ChunkTables {
  std::vector<int64_t> in_off;
  std::vector<int64_t> shift;
};
ChunkTables build_tables(const std::vector<int64_t>& sizes, const std::vector<int64_t>& order);

// Contents of a 1-D int32/int64 CPU tensor as int64 (any stride).
std::vector<int64_t> read_host_indices(const TensorView& t);

// Split sizes >= 0 with sum <= N, sorted_index a permutation of 0..S-1.
void validate_chunks(const char* op, const std::vector<int64_t>& sizes,
                     const std::vector<int64_t>& order, int64_t N);
// Every entry of a row map in [0, N) and no entry twice.
void validate_row_map(const char* op, const std::vector<int64_t>& map, int64_t N);

}  // namespace fusedops::sort_chunks
