// sort_chunks family, generic CUDA backend (sm_80 and later).
//
// Forward: one block of kTableThreads builds the per-chunk tables from split_sizes and
// sorted_index on the device (two block-wide prefix sums over the S chunks, no host sync):
//   in_off[c] (c = 0..S), shift[c] = out_off[pos[c]] - in_off[c] (shift[S] = 0).
// Then the row kernel gives each warp one row at a time: the row's chunk is a binary search in
// in_off (the same address in every lane, so one broadcast load per step, L1-resident), lane 0
// writes row_id_map[r] = r + shift[c], and the warp copies the row with the widest access the
// row size, strides and base addresses allow (16 bytes for bf16 rows of 4096), kUnroll accesses
// in flight per lane. The backward and sort_chunks_by_map read the map once per row instead.
//
// Bad indices never cause an access out of bounds and are reported into the device's bad-input
// record (src/cuda/device_errors.cuh): the table kernel checks split_sizes (>= 0, sum <= N) and
// sorted_index (a permutation of 0..S-1) and on any violation makes the tables the identity
// (out = inp, row_id_map[r] = r); map entries outside [0, N) are skipped (scatter) or give zero
// rows (gather); a scatter through a map that is not a permutation marks the rows it writes in a
// bitmap, and a second kernel zero-fills the rows nothing was written to.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "fusedops/core/registry.h"
#include "fusedops/ops/sort_chunks.h"
#include "src/cuda/check.cuh"
#include "src/cuda/device_errors.cuh"
#include "src/ops/sort_chunks/sort_chunks_common.h"

namespace fusedops {
namespace {

using namespace sort_chunks;

constexpr int kTableThreads = 1024;
constexpr int kRowThreads = 256;
constexpr int kWarpsPerBlock = kRowThreads / 32;
constexpr int kMapThreads = 256;

// The conditions the kernels report (device_error_code), registered once per op name.
struct Codes {
  uint32_t negative_size, sum_past_rows, index_range, index_missing, map_range, map_duplicate;
};
const Codes& codes_of(const char* op) {
  static const auto make = [](const char* o) {
    return Codes{
        device_error_code(o, "split_sizes[{index}] = {value} is negative"),
        device_error_code(o, "the sum of split_sizes ({value}) exceeds the number of rows ({index})"),
        device_error_code(o, "sorted_index[{index}] = {value} is outside 0..S-1"),
        device_error_code(o, "sorted_index is not a permutation of 0..S-1: chunk {index} is missing"),
        device_error_code(o, "row_id_map[{index}] = {value} is outside [0, N)"),
        device_error_code(o, "row_id_map is not a permutation: row {value} is the target of more "
                             "than one entry (again at row_id_map[{index}])")};
  };
  static const Codes idx = make(kOpIdx), map = make(kOpMap), by_map = make(kOpByMap);
  const std::string_view name(op);
  return name == kOpMap ? map : name == kOpByMap ? by_map : idx;
}

struct TableParams {
  const void* split_sizes;
  const void* sorted_index;
  bool sizes_i64, index_i64;
  int64_t S;
  int64_t N;        // rows
  int64_t* in_off;  // [S+1]
  int64_t* shift;   // [S+1]
  DeviceErrorRecord* record;
  Codes codes;
};

enum Mode : int { kFused = 0, kScatter = 1, kGather = 2 };

struct MoveParams {
  const uint8_t* src;  // input rows
  uint8_t* dst;        // output rows
  int64_t N;
  int64_t row_units;         // accesses per row
  int64_t src_stride_units;  // input row stride in accesses
  int64_t dst_stride_units;
  const uint8_t* probs;  // optional [N] input, any stride
  uint8_t* probs_out;    // contiguous
  int probs_es;          // bytes per element of probs
  int64_t probs_stride;  // elements
  int32_t* map_out;      // kFused: written
  const int32_t* map_in;  // kScatter / kGather: read
  const int64_t* in_off;  // kFused: [S+1]
  const int64_t* shift;   // kFused: [S+1]
  int64_t S;
  int mode;
  unsigned* written;  // kScatter: bitmap of the destination rows written, [ceil(N/32)], zeroed
  DeviceErrorRecord* record;
  uint32_t map_range_code, map_duplicate_code;
};

__device__ __forceinline__ int64_t load_index(const void* p, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

// Inclusive prefix sum of v over the block (blockDim.x a multiple of 32, at most 1024); the
// block's total goes to *total. Every thread of the block must call it.
__device__ int64_t block_inclusive_scan(int64_t v, int64_t* warp_sums, int64_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int64_t w = lane < warps ? warp_sums[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    if (lane < warps) warp_sums[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v += warp_sums[warp - 1];
  *total = warp_sums[warps - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return v;
}

// One block. Negative sizes count as 0 and out-of-range sorted_index entries are skipped while
// the tables are built; any violation (a negative size, a sum past N, sorted_index not a
// permutation of 0..S-1) is reported and then turns the tables into the identity (shift 0).
__global__ void __launch_bounds__(kTableThreads) chunk_tables_kernel(TableParams p) {
  __shared__ int64_t warp_sums[32];
  constexpr int64_t kUnnamed = INT64_MIN;  // shift of a chunk sorted_index has not named (yet)
  const int64_t S = p.S;
  int64_t carry = 0, total = 0;
  bool bad = false;
  for (int64_t base = 0; base < S; base += blockDim.x) {
    const int64_t c = base + threadIdx.x;
    int64_t v = c < S ? load_index(p.split_sizes, p.sizes_i64, c) : 0;
    if (v < 0) {
      cuda::report_bad_input(p.record, p.codes.negative_size, c, v);
      bad = true;
      v = 0;
    }
    const int64_t incl = block_inclusive_scan(v, warp_sums, &total);
    if (c < S) p.in_off[c] = carry + incl - v;
    carry += total;
  }
  if (threadIdx.x == 0) {
    p.in_off[S] = carry;
    if (carry > p.N) {
      cuda::report_bad_input(p.record, p.codes.sum_past_rows, p.N, carry);
      bad = true;
    }
  }
  for (int64_t c = threadIdx.x; c < S; c += blockDim.x) p.shift[c] = kUnnamed;
  if (threadIdx.x == 0) p.shift[S] = 0;
  __syncthreads();  // in_off and the cleared shift are visible to the whole block
  carry = 0;
  for (int64_t base = 0; base < S; base += blockDim.x) {
    const int64_t j = base + threadIdx.x;
    const int64_t c = j < S ? load_index(p.sorted_index, p.index_i64, j) : -1;
    const bool ok = c >= 0 && c < S;
    if (j < S && !ok) {
      cuda::report_bad_input(p.record, p.codes.index_range, j, c);
      bad = true;
    }
    int64_t v = ok ? load_index(p.split_sizes, p.sizes_i64, c) : 0;
    v = v > 0 ? v : 0;
    const int64_t incl = block_inclusive_scan(v, warp_sums, &total);
    if (ok) p.shift[c] = carry + incl - v - p.in_off[c];
    carry += total;
  }
  __syncthreads();
  // S entries in range that name every chunk are a permutation; a chunk left unnamed means that
  // another was named twice (or an entry was out of range, reported above).
  for (int64_t c = threadIdx.x; c < S; c += blockDim.x) {
    if (p.shift[c] == kUnnamed) {
      cuda::report_bad_input(p.record, p.codes.index_missing, c, c);
      bad = true;
    }
  }
  if (__syncthreads_or(bad)) {
    for (int64_t c = threadIdx.x; c <= S; c += blockDim.x) p.shift[c] = 0;
  }
}

// Destination of input row r in the forward: r + shift[c] for the chunk c holding r (the last
// c with in_off[c] <= r; rows past the chunks get c = S, shift 0).
__device__ __forceinline__ int64_t forward_row(int64_t r, const int64_t* __restrict__ in_off,
                                               const int64_t* __restrict__ shift, int64_t S) {
  if (S == 0) return r;
  int64_t lo = 0, hi = S + 1;  // first k with in_off[k] > r
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (__ldg(in_off + mid) <= r) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 ? r + __ldg(shift + lo - 1) : r;
}

__global__ void __launch_bounds__(kMapThreads) chunk_map_kernel(const int64_t* __restrict__ in_off,
                                                                const int64_t* __restrict__ shift,
                                                                int64_t S, int64_t N,
                                                                int32_t* __restrict__ map) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r < N) map[r] = static_cast<int32_t>(forward_row(r, in_off, shift, S));
}

template <class Unit>
__device__ __forceinline__ Unit load_stream(const Unit* p) {
  return __ldcs(p);
}
template <class Unit>
__device__ __forceinline__ void store_stream(Unit* p, const Unit& v) {
  __stcs(p, v);
}

__device__ __forceinline__ void copy_elem(const MoveParams& p, int64_t d, int64_t s) {
  const uint8_t* src = p.probs + s * p.probs_stride * p.probs_es;
  uint8_t* dst = p.probs_out + d * p.probs_es;
  switch (p.probs_es) {
    case 1: *dst = *src; break;
    case 2: *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src); break;
    case 4: *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src); break;
    default: *reinterpret_cast<uint64_t*>(dst) = *reinterpret_cast<const uint64_t*>(src); break;
  }
}

__device__ __forceinline__ void zero_elem(const MoveParams& p, int64_t d) {
  for (int b = 0; b < p.probs_es; ++b) p.probs_out[d * p.probs_es + b] = 0;
}

// One warp per row, grid-stride over rows. Map entries outside [0, N) are reported; the row is
// then skipped (scatter) or written as zeros (gather). A scatter marks each destination in
// p.written and reports a destination marked twice (zero_unwritten_kernel then fills the rows no
// entry reached).
template <class Unit, int kUnroll>
__global__ void __launch_bounds__(kRowThreads) move_rows_kernel(MoveParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const Unit* __restrict__ src = reinterpret_cast<const Unit*>(p.src);
  Unit* __restrict__ dst = reinterpret_cast<Unit*>(p.dst);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); r < p.N;
       r += warps) {
    int64_t s = r, d = r;
    if (p.mode == kFused) {
      d = forward_row(r, p.in_off, p.shift, p.S);
      if (lane == 0) p.map_out[r] = static_cast<int32_t>(d);
    } else {
      const int64_t m = __ldg(p.map_in + r);
      if (m < 0 || m >= p.N) {
        if (lane == 0) cuda::report_bad_input(p.record, p.map_range_code, r, m);
      } else if (p.mode == kScatter && lane == 0) {
        const unsigned bit = 1u << (m & 31);
        if (atomicOr(p.written + (m >> 5), bit) & bit) cuda::report_bad_input(p.record, p.map_duplicate_code, r, m);
      }
      if (p.mode == kScatter) d = m;
      else s = m;
    }
    if (d < 0 || d >= p.N) continue;
    Unit* drow = dst + d * p.dst_stride_units;
    if (s < 0 || s >= p.N) {
      for (int64_t i = lane; i < p.row_units; i += 32) drow[i] = Unit{};
      if (p.probs && lane == 0) zero_elem(p, d);
      continue;
    }
    const Unit* srow = src + s * p.src_stride_units;
    for (int64_t base = 0; base < p.row_units; base += 32 * kUnroll) {
      Unit v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t i = base + k * 32 + lane;
        if (i < p.row_units) v[k] = load_stream(srow + i);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t i = base + k * 32 + lane;
        if (i < p.row_units) store_stream(drow + i, v[k]);
      }
    }
    if (p.probs && lane == 0) copy_elem(p, d, s);
  }
}

// After a scatter: zeros in every row (and probs element) that no map entry was written to.
// Nothing to do, one word read per 32 rows, unless the map was not a permutation.
template <class Unit>
__global__ void __launch_bounds__(kRowThreads) zero_unwritten_kernel(MoveParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int64_t words = (p.N + 31) / 32;
  Unit* __restrict__ dst = reinterpret_cast<Unit*>(p.dst);
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
       w < words; w += warps) {
    const unsigned bits = p.written[w];
    const int64_t left = p.N - w * 32;
    const int rows = left < 32 ? static_cast<int>(left) : 32;
    for (int b = 0; b < rows; ++b) {
      if (bits & (1u << b)) continue;
      const int64_t d = w * 32 + b;
      Unit* drow = dst + d * p.dst_stride_units;
      for (int64_t i = lane; i < p.row_units; i += 32) drow[i] = Unit{};
      if (p.probs && lane == 0) zero_elem(p, d);
    }
  }
}

// The widest access (16, 8, 4, 2 or 1 bytes) that divides every address and byte count.
int access_bytes(std::initializer_list<uint64_t> quantities) {
  for (int w = 16; w > 1; w >>= 1) {
    bool ok = true;
    for (uint64_t q : quantities) ok = ok && q % static_cast<uint64_t>(w) == 0;
    if (ok) return w;
  }
  return 1;
}

template <class Unit>
void launch_move_typed(const char* op, MoveParams p, int64_t row_bytes, int64_t src_stride_bytes,
                       int64_t dst_stride_bytes, int device, cudaStream_t stream) {
  p.row_units = row_bytes / static_cast<int64_t>(sizeof(Unit));
  p.src_stride_units = src_stride_bytes / static_cast<int64_t>(sizeof(Unit));
  p.dst_stride_units = dst_stride_bytes / static_cast<int64_t>(sizeof(Unit));
  // Enough warps to cover every SM with full blocks; each then strides over the rows.
  const int64_t want = (p.N + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t cap = static_cast<int64_t>(cuda::sm_count(op, device)) * (2048 / kRowThreads) * 4;
  const unsigned blocks = static_cast<unsigned>(want < cap ? want : cap);
  constexpr int kUnroll = 8;
  move_rows_kernel<Unit, kUnroll><<<blocks, kRowThreads, 0, stream>>>(p);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  if (p.mode == kScatter) {
    const int64_t words = (p.N + 31) / 32;
    const int64_t zblocks = std::min<int64_t>((words + kWarpsPerBlock - 1) / kWarpsPerBlock, cap);
    zero_unwritten_kernel<Unit><<<static_cast<unsigned>(zblocks), kRowThreads, 0, stream>>>(p);
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  }
}

// Moves the rows of `inp` into `out` in the given mode (tables or map already in p).
void launch_move(const char* op, MoveParams p, const TensorView& inp, const TensorView& out,
                 int device, cudaStream_t stream) {
  const int64_t es = static_cast<int64_t>(dtype_size(inp.dtype()));
  const int64_t row_bytes = inp.size(1) * es;
  const int64_t src_stride = inp.stride(0) * es, dst_stride = row_bytes;
  p.src = static_cast<const uint8_t*>(inp.data());
  p.dst = static_cast<uint8_t*>(out.data());
  p.N = inp.size(0);
  const int w = access_bytes({reinterpret_cast<uintptr_t>(inp.data()),
                              reinterpret_cast<uintptr_t>(out.data()),
                              static_cast<uint64_t>(row_bytes), static_cast<uint64_t>(src_stride),
                              static_cast<uint64_t>(dst_stride)});
  switch (w) {
    case 16: launch_move_typed<uint4>(op, p, row_bytes, src_stride, dst_stride, device, stream); break;
    case 8: launch_move_typed<uint2>(op, p, row_bytes, src_stride, dst_stride, device, stream); break;
    case 4: launch_move_typed<unsigned int>(op, p, row_bytes, src_stride, dst_stride, device, stream); break;
    case 2: launch_move_typed<unsigned short>(op, p, row_bytes, src_stride, dst_stride, device, stream); break;
    default: launch_move_typed<unsigned char>(op, p, row_bytes, src_stride, dst_stride, device, stream); break;
  }
}

void set_probs(MoveParams& p, const TensorView& probs, const TensorView& probs_out) {
  if (!probs.defined()) return;
  p.probs = static_cast<const uint8_t*>(probs.data());
  p.probs_out = static_cast<uint8_t*>(probs_out.data());
  p.probs_es = static_cast<int>(dtype_size(probs.dtype()));
  p.probs_stride = probs.stride(0);
}

// Builds the tables in the workspace; returns {in_off, shift} (null when S == 0).
std::pair<int64_t*, int64_t*> build_tables_on_device(const char* op, const TensorView& split_sizes,
                                                     const TensorView& sorted_index, int64_t N,
                                                     const TensorView& workspace, int device,
                                                     cudaStream_t stream) {
  const int64_t S = split_sizes.numel();
  if (S == 0) return {nullptr, nullptr};
  FUSEDOPS_REQUIRE(reinterpret_cast<uintptr_t>(workspace.data()) % 8 == 0, kValue, op,
                   "workspace must be 8-byte aligned");
  TableParams t{};
  t.split_sizes = split_sizes.data();
  t.sorted_index = sorted_index.data();
  t.sizes_i64 = split_sizes.dtype() == DType::kInt64;
  t.index_i64 = sorted_index.dtype() == DType::kInt64;
  t.S = S;
  t.N = N;
  t.in_off = static_cast<int64_t*>(workspace.data());
  t.shift = t.in_off + (S + 1);
  t.record = cuda::device_error_record(op, device);
  t.codes = codes_of(op);
  chunk_tables_kernel<<<1, kTableThreads, 0, stream>>>(t);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  return {t.in_off, t.shift};
}

void fwd(const Context& ctx, const SortChunksFwdArgs& a) {
  cuda::DeviceGuard guard(kOpIdx, ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  auto [in_off, shift] = build_tables_on_device(kOpIdx, a.split_sizes, a.sorted_index,
                                                a.inp.size(0), a.workspace, ctx.device.index, stream);
  MoveParams p{};
  p.mode = kFused;
  p.in_off = in_off;
  p.shift = shift;
  p.S = a.split_sizes.numel();
  p.map_out = a.row_id_map.data_as<int32_t>();
  set_probs(p, a.probs, a.probs_out);
  launch_move(kOpIdx, p, a.inp, a.out, ctx.device.index, stream);
}

// The map-driven modes: the map, the bad-input record and codes.
void set_map(MoveParams& p, const char* op, int mode, const TensorView& map, int device) {
  p.mode = mode;
  p.map_in = map.data_as<const int32_t>();
  p.record = cuda::device_error_record(op, device);
  p.map_range_code = codes_of(op).map_range;
  p.map_duplicate_code = codes_of(op).map_duplicate;
}

void bwd(const Context& ctx, const SortChunksBwdArgs& a) {
  cuda::DeviceGuard guard(kOpIdx, ctx.device.index);
  MoveParams p{};
  set_map(p, kOpIdx, kGather, a.row_id_map, ctx.device.index);
  set_probs(p, a.d_probs_out, a.d_probs);
  launch_move(kOpIdx, p, a.d_out, a.d_inp, ctx.device.index, static_cast<cudaStream_t>(ctx.stream));
}

void make_map(const Context& ctx, const ChunkSortMapArgs& a) {
  cuda::DeviceGuard guard(kOpMap, ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const int64_t N = a.row_id_map.size(0);
  auto [in_off, shift] = build_tables_on_device(kOpMap, a.split_sizes, a.sorted_index, N,
                                                a.workspace, ctx.device.index, stream);
  const unsigned blocks = static_cast<unsigned>((N + kMapThreads - 1) / kMapThreads);
  chunk_map_kernel<<<blocks, kMapThreads, 0, stream>>>(in_off, shift, a.split_sizes.numel(), N,
                                                       a.row_id_map.data_as<int32_t>());
  FUSEDOPS_CUDA_LAUNCH_CHECK(kOpMap);
}

void by_map(const Context& ctx, const SortChunksByMapArgs& a) {
  cuda::DeviceGuard guard(kOpByMap, ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  MoveParams p{};
  set_map(p, kOpByMap, a.is_forward ? kScatter : kGather, a.row_id_map, ctx.device.index);
  if (a.is_forward) {
    p.written = static_cast<unsigned*>(a.workspace.data());
    FUSEDOPS_CUDA_CHECK(kOpByMap, cudaMemsetAsync(p.written, 0, sort_chunks_by_map_workspace_size(
                                                                    a.inp.size(0), true), stream));
  }
  set_probs(p, a.probs, a.probs_out);
  launch_move(kOpByMap, p, a.inp, a.out, ctx.device.index, stream);
}

}  // namespace

void register_sort_chunks_by_idx_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX, all_dtypes(), kPriorityCudaSm80};
  r.add<SortChunksFwdArgs>(kOpIdx, Direction::kForward, spec, nullptr, fwd);
  r.add<SortChunksBwdArgs>(kOpIdx, Direction::kBackward, spec, nullptr, bwd);
  r.add<ChunkSortMapArgs>(kOpMap, Direction::kForward, spec, nullptr, make_map);
  r.add<SortChunksByMapArgs>(kOpByMap, Direction::kForward, spec, nullptr, by_map);
}

}  // namespace fusedops
