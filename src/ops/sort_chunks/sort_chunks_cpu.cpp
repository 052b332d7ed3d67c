// sort_chunks family, CPU backend. The forward walks each thread's range of input rows chunk by
// chunk: a chunk segment is one block of consecutive rows on both sides, so it moves with a
// single memcpy when the rows are packed. The map-driven directions coalesce runs of
// consecutive map entries the same way (the backward of a chunk sort is again chunk-wise).
#include <algorithm>
#include <cstring>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/sort_chunks.h"
#include "src/cpu/parallel.h"
#include "src/cpu/stream_copy.h"
#include "src/ops/sort_chunks/sort_chunks_common.h"

namespace fusedops {
namespace {

using namespace sort_chunks;

// Row layout of one [N, Hd] operand in bytes.
struct Rows {
  const uint8_t* src = nullptr;  // the input
  uint8_t* dst = nullptr;        // the output (contiguous)
  int64_t N = 0;
  int64_t row_bytes = 0;
  int64_t src_stride = 0;  // bytes between input rows
  bool packed = false;     // input rows are back to back, so a run of rows is one block
  bool stream = false;     // an output far larger than the cache: streaming stores
};

Rows rows_of(const TensorView& inp, const TensorView& out) {
  Rows r;
  const int64_t es = static_cast<int64_t>(dtype_size(inp.dtype()));
  r.src = static_cast<const uint8_t*>(inp.data());
  r.dst = static_cast<uint8_t*>(out.data());
  r.N = inp.size(0);
  r.row_bytes = inp.size(1) * es;
  r.src_stride = inp.stride(0) * es;
  r.packed = r.src_stride == r.row_bytes;
  r.stream = r.N * r.row_bytes >= cpu::kStreamOutputBytes;
  return r;
}

// One [N] operand (probs) in bytes: input with any stride, output contiguous.
struct Elems {
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  int64_t es = 0;
  int64_t src_stride = 0;  // bytes
};

Elems elems_of(const TensorView& probs, const TensorView& probs_out) {
  Elems e;
  if (!probs.defined()) return e;
  e.es = static_cast<int64_t>(dtype_size(probs.dtype()));
  e.src = static_cast<const uint8_t*>(probs.data());
  e.dst = static_cast<uint8_t*>(probs_out.data());
  e.src_stride = probs.stride(0) * e.es;
  return e;
}

// Rows [s, s+n) of the input to rows [d, d+n) of the output; both ranges in bounds.
void copy_rows(const Rows& R, int64_t d, int64_t s, int64_t n) {
  if (R.row_bytes == 0 || n <= 0) return;
  auto copy = R.stream ? cpu::stream_copy : [](void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
  };
  if (R.packed) {
    copy(R.dst + d * R.row_bytes, R.src + s * R.src_stride, n * R.row_bytes);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    copy(R.dst + (d + i) * R.row_bytes, R.src + (s + i) * R.src_stride, R.row_bytes);
}

template <class T>
void copy_elems_typed(const Elems& E, int64_t d, int64_t s, int64_t n) {
  T* out = reinterpret_cast<T*>(E.dst) + d;
  for (int64_t i = 0; i < n; ++i) std::memcpy(out + i, E.src + (s + i) * E.src_stride, sizeof(T));
}

void copy_elems(const Elems& E, int64_t d, int64_t s, int64_t n) {
  if (!E.src || n <= 0) return;
  if (E.src_stride == E.es) {
    std::memcpy(E.dst + d * E.es, E.src + s * E.es, n * E.es);
    return;
  }
  switch (E.es) {
    case 1: copy_elems_typed<uint8_t>(E, d, s, n); break;
    case 2: copy_elems_typed<uint16_t>(E, d, s, n); break;
    case 4: copy_elems_typed<uint32_t>(E, d, s, n); break;
    default: copy_elems_typed<uint64_t>(E, d, s, n); break;
  }
}

void zero_row(const Rows& R, int64_t d) {
  if (R.row_bytes) std::memset(R.dst + d * R.row_bytes, 0, R.row_bytes);
}
void zero_elem(const Elems& E, int64_t d) {
  if (E.src) std::memset(E.dst + d * E.es, 0, E.es);
}

// About 256 KiB of rows per task, so that small rows do not cost a task each.
int64_t grain_rows(int64_t row_bytes) { return std::max<int64_t>(1, (256 << 10) / std::max<int64_t>(row_bytes, 1)); }

// A streamed output is mapped first when it is fresh (cpu::prefault_stream_output).
void prefault_output(const Rows& R) {
  if (R.stream) cpu::prefault_stream_output(R.dst, static_cast<size_t>(R.N * R.row_bytes));
}

// The forward over rows [r0, r1): segments of one chunk each. `R` may be null (map only).
void chunk_walk(const ChunkTables& t, int64_t N, int64_t r0, int64_t r1, int32_t* map,
                const Rows* R, const Elems* E) {
  const int64_t S = static_cast<int64_t>(t.in_off.size()) - 1;
  int64_t r = r0;
  while (r < r1) {
    // The chunk holding r: the last c with in_off[c] <= r (zero-size chunks are skipped);
    // c == S for rows past the chunks, whose shift is 0.
    const int64_t c = (std::upper_bound(t.in_off.begin(), t.in_off.end(), r) - t.in_off.begin()) - 1;
    const int64_t end = c < S ? std::min(r1, t.in_off[c + 1]) : r1;
    const int64_t shift = t.shift[c];
    const int64_t n = end - r;
    for (int64_t i = r; i < end; ++i) map[i] = static_cast<int32_t>(i + shift);
    if (R || E) {
      if (r + shift >= 0 && end + shift <= N) {
        if (R) copy_rows(*R, r + shift, r, n);
        if (E) copy_elems(*E, r + shift, r, n);
      } else {
        // Only reachable with invalid sizes (validate mode off): move the rows that land inside.
        for (int64_t i = r; i < end; ++i) {
          if (i + shift < 0 || i + shift >= N) continue;
          if (R) copy_rows(*R, i + shift, i, 1);
          if (E) copy_elems(*E, i + shift, i, 1);
        }
      }
    }
    r = end;
  }
}

ChunkTables tables_of(const TensorView& split_sizes, const TensorView& sorted_index) {
  return build_tables(read_host_indices(split_sizes), read_host_indices(sorted_index));
}

void fwd(const Context&, const SortChunksFwdArgs& a) {
  const ChunkTables t = tables_of(a.split_sizes, a.sorted_index);
  const Rows R = rows_of(a.inp, a.out);
  const Elems E = elems_of(a.probs, a.probs_out);
  int32_t* map = a.row_id_map.data_as<int32_t>();
  prefault_output(R);
  cpu::parallel_for(0, R.N, grain_rows(R.row_bytes), [&](int64_t r0, int64_t r1) {
    chunk_walk(t, R.N, r0, r1, map, &R, E.src ? &E : nullptr);
    cpu::stream_fence();
  });
}

void make_map(const Context&, const ChunkSortMapArgs& a) {
  const ChunkTables t = tables_of(a.split_sizes, a.sorted_index);
  const int64_t N = a.row_id_map.size(0);
  int32_t* map = a.row_id_map.data_as<int32_t>();
  cpu::parallel_for(0, N, 1 << 16, [&](int64_t r0, int64_t r1) {
    chunk_walk(t, N, r0, r1, map, nullptr, nullptr);
  });
}

// Through a map: scatter out[map[r]] = inp[r], or gather out[r] = inp[map[r]]; runs of
// consecutive map entries move as one block. Out-of-range entries (invalid maps) are skipped
// (scatter) or give zero rows (gather).
void move_by_map(const Rows& R, const Elems& E, const int32_t* map, bool scatter) {
  const int64_t N = R.N;
  prefault_output(R);
  cpu::parallel_for(0, N, grain_rows(R.row_bytes), [&](int64_t r0, int64_t r1) {
    int64_t r = r0;
    while (r < r1) {
      const int64_t m = map[r];
      int64_t n = 1;
      while (r + n < r1 && static_cast<int64_t>(map[r + n]) == m + n) ++n;
      if (m >= 0 && m + n <= N) {
        const int64_t d = scatter ? m : r, s = scatter ? r : m;
        copy_rows(R, d, s, n);
        copy_elems(E, d, s, n);
      } else {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t mi = m + i;
          const bool ok = mi >= 0 && mi < N;
          if (scatter) {
            if (!ok) continue;
            copy_rows(R, mi, r + i, 1);
            copy_elems(E, mi, r + i, 1);
          } else if (ok) {
            copy_rows(R, r + i, mi, 1);
            copy_elems(E, r + i, mi, 1);
          } else {
            zero_row(R, r + i);
            zero_elem(E, r + i);
          }
        }
      }
      r += n;
    }
    cpu::stream_fence();
  });
}

void bwd(const Context&, const SortChunksBwdArgs& a) {
  move_by_map(rows_of(a.d_out, a.d_inp), elems_of(a.d_probs_out, a.d_probs),
              a.row_id_map.data_as<const int32_t>(), false);
}

void by_map(const Context&, const SortChunksByMapArgs& a) {
  move_by_map(rows_of(a.inp, a.out), elems_of(a.probs, a.probs_out),
              a.row_id_map.data_as<const int32_t>(), a.is_forward);
}

}  // namespace

void register_sort_chunks_by_idx_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX, all_dtypes(), kPriorityCpu};
  r.add<SortChunksFwdArgs>(kOpIdx, Direction::kForward, spec, nullptr, fwd);
  r.add<SortChunksBwdArgs>(kOpIdx, Direction::kBackward, spec, nullptr, bwd);
  r.add<ChunkSortMapArgs>(kOpMap, Direction::kForward, spec, nullptr, make_map);
  r.add<SortChunksByMapArgs>(kOpByMap, Direction::kForward, spec, nullptr, by_map);
}

}  // namespace fusedops
