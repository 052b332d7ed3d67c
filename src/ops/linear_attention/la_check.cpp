#include "src/ops/linear_attention/la_check.h"

#include <algorithm>

#include "fusedops/core/device_errors.h"
#include "fusedops/ops/linear_attention.h"
#ifdef FUSEDOPS_WITH_CUDA
#include "src/cuda/device_errors.cuh"
#endif

namespace fusedops::la {

namespace {

bool contiguous_or_empty(const TensorView& t) { return t.numel() == 0 || t.is_contiguous(); }

thread_local int t_nested = 0;

// An index tensor's contents in host memory, as a CPU view: the tensor itself on the CPU, else a
// copy (read_tensor_bytes: a synchronisation, so only under the debug checks).
struct HostIndex {
  std::vector<uint8_t> bytes;
  TensorView view;
  HostIndex(const char* op, const Context& ctx, const TensorView& t) {
    if (t.device().kind == DeviceKind::kCPU) {
      view = t;
      return;
    }
    bytes = read_tensor_bytes(op, ctx, t);
    view = TensorView(bytes.data(), t.dtype(), Device::cpu(), t.ndim(), t.shape(), t.strides());
  }
};

}  // namespace

NestedCalls::NestedCalls() { ++t_nested; }
NestedCalls::~NestedCalls() { --t_nested; }

bool Check::read_indices() const {
  // (Under a top level, whose own check read them, CUDA sub-operators do not copy them again.)
  return ctx_.device.kind == DeviceKind::kCPU || (t_nested == 0 && debug_checks(ctx_));
}

void Check::report_seqlens_on_device(const TensorView& cu, int64_t T) const {
#ifdef FUSEDOPS_WITH_CUDA
  if (ctx_.device.kind != DeviceKind::kCUDA || t_nested > 0 || cu.numel() == 0 || reported_) return;
  reported_ = true;  // once per call (seqlens, chunk_indices and chunk_offsets each get here)
  const uint32_t code = device_error_code(
      op_, "cu_seqlens must start at 0, be non-decreasing and end at T; cu_seqlens[{index}] = "
           "{value} is not (the kernels clamp every offset to [0, T])");
  cuda::DeviceGuard guard(op_, ctx_.device.index);
  cuda::check_offsets(op_, code, cu.data(), cu.dtype() == DType::kInt64, cu.size(0), T,
                      static_cast<cudaStream_t>(ctx_.stream));
#else
  (void)cu;
  (void)T;
#endif
}

void Check::input(const TensorView& t, const char* name, const std::vector<int64_t>& shape) const {
  c_.defined(t, name).floating(t, name).on_device(t, name, ctx_).shape(t, name, shape);
  FUSEDOPS_REQUIRE(t.numel() == 0 || t.ndim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1,
                   kValue, op_, name, " must have a contiguous last dimension (stride 1), got strides ",
                   shape_string(t.strides(), t.ndim()), " for shape ", t.shape_string());
}

void Check::dense(const TensorView& t, const char* name, const std::vector<int64_t>& shape, const char* why) const {
  c_.defined(t, name).floating(t, name).on_device(t, name, ctx_).shape(t, name, shape);
  FUSEDOPS_REQUIRE(contiguous_or_empty(t), kValue, op_, name, " must be contiguous", why, ", got shape ",
                   t.shape_string(), " with strides ", shape_string(t.strides(), t.ndim()));
}

void Check::state(const TensorView& t, const char* name, const std::vector<int64_t>& shape) const {
  dense(t, name, shape, " (states are read as dense [K, V] blocks)");
}

void Check::output(const TensorView& t, const char* name, const std::vector<int64_t>& shape) const {
  dense(t, name, shape, "");
}

std::vector<int64_t> Check::rank4(const TensorView& t, const char* name) const {
  c_.rank(t, name, 4);
  return shape_vector(t);
}

void Check::chunk_size(int64_t bt) const {
  FUSEDOPS_REQUIRE(bt == 16 || bt == 32 || bt == 64, kValue, op_,
                   "chunk_size must be 16, 32 or 64, got ", bt);
}

void Check::head_dims(int64_t K, int64_t V) const {
  FUSEDOPS_REQUIRE(K >= 1 && V >= 1, kValue, op_, "K and V must be >= 1, got K=", K, ", V=", V);
  FUSEDOPS_REQUIRE(K <= 256, kValue, op_,
                   "K must be <= 256 (the state kernels hold K in at most four 64-row tiles), got ", K);
}

void Check::groups(int64_t HV, int64_t Hk, const char* v_name, const char* k_name) const {
  FUSEDOPS_REQUIRE(Hk >= 1 && HV % Hk == 0, kValue, op_, v_name, " has HV=", HV,
                   " heads, which is not a multiple of the ", Hk, " heads of ", k_name);
}

int64_t Check::seqlens(const TensorView& cu, int64_t B, int64_t T) const {
  if (!cu.defined()) return B;
  c_.rank(cu, "cu_seqlens", 1).dtype_in(cu, "cu_seqlens", {DType::kInt32, DType::kInt64})
      .on_device(cu, "cu_seqlens", ctx_);
  FUSEDOPS_REQUIRE(B == 1, kValue, op_,
                   "with cu_seqlens the batch size must be 1 (sequences are packed along T), got B=", B);
  FUSEDOPS_REQUIRE(cu.size(0) >= 1, kValue, op_, "cu_seqlens must have at least one entry (N+1 >= 1)");
  FUSEDOPS_REQUIRE(contiguous_or_empty(cu), kValue, op_, "cu_seqlens must be contiguous");
  const int64_t N = cu.size(0) - 1;
  if (!read_indices()) {
    report_seqlens_on_device(cu, T);
    return N;
  }
  {
    const HostIndex host(op_, ctx_, cu);
    const TensorView& cu = host.view;
    FUSEDOPS_REQUIRE(read_index(cu, 0) == 0, kValue, op_, "cu_seqlens must start at 0, got ",
                     read_index(cu, 0));
    for (int64_t i = 0; i < N; ++i) {
      FUSEDOPS_REQUIRE(read_index(cu, i) <= read_index(cu, i + 1), kValue, op_,
                       "cu_seqlens must be non-decreasing, got cu_seqlens[", i, "]=",
                       read_index(cu, i), " > cu_seqlens[", i + 1, "]=", read_index(cu, i + 1));
    }
    FUSEDOPS_REQUIRE(read_index(cu, N) == T, kValue, op_, "cu_seqlens must end at T=", T,
                     " (the packed length), got cu_seqlens[", N, "]=", read_index(cu, N));
  }
  return N;
}

int64_t Check::chunk_indices(const TensorView& cu, const TensorView& ci, int64_t B, int64_t T,
                             int64_t BT) const {
  seqlens(cu, B, T);
  if (!cu.defined()) return B * ceil_div(T, BT);
  FUSEDOPS_REQUIRE(ci.defined(), kValue, op_,
                   "chunk_indices is required with cu_seqlens (see prepare_chunk_indices)");
  c_.rank(ci, "chunk_indices", 2).same_dtype(ci, "chunk_indices", cu, "cu_seqlens")
      .on_device(ci, "chunk_indices", ctx_);
  FUSEDOPS_REQUIRE(ci.size(1) == 2 && contiguous_or_empty(ci), kValue, op_,
                   "chunk_indices must be a contiguous [NT,2] tensor, got shape ", ci.shape_string());
  const int64_t NT = ci.size(0);
  if (read_indices()) {
    const HostIndex host_cu(op_, ctx_, cu), host_ci(op_, ctx_, ci);
    const TensorView &cu = host_cu.view, &ci = host_ci.view;
    const auto seqs = make_seqs(B, T, cu, BT);
    const auto chunks = make_chunks(seqs, BT);
    FUSEDOPS_REQUIRE(static_cast<int64_t>(chunks.size()) == NT, kValue, op_,
                     "chunk_indices has ", NT, " rows but cu_seqlens with chunk_size ", BT,
                     " gives ", chunks.size(), " chunks");
    for (int64_t i = 0; i < NT; ++i) {
      const int64_t want_chunk = (chunks[i].t0 - seqs[chunks[i].seq].t0) / BT;
      FUSEDOPS_REQUIRE(read_index(ci, 2 * i) == chunks[i].seq && read_index(ci, 2 * i + 1) == want_chunk,
                       kValue, op_, "chunk_indices row ", i, " is (", read_index(ci, 2 * i), ",",
                       read_index(ci, 2 * i + 1), "), expected (", chunks[i].seq, ",", want_chunk,
                       ") for these cu_seqlens");
    }
  }
  return NT;
}

int64_t Check::chunk_offsets(const TensorView& cu, const TensorView& co, int64_t B, int64_t T,
                             int64_t BT) const {
  const int64_t N = seqlens(cu, B, T);
  if (!cu.defined()) return B * ceil_div(T, BT);
  FUSEDOPS_REQUIRE(co.defined(), kValue, op_,
                   "chunk_offsets is required with cu_seqlens (see prepare_chunk_offsets)");
  c_.rank(co, "chunk_offsets", 1).same_dtype(co, "chunk_offsets", cu, "cu_seqlens")
      .on_device(co, "chunk_offsets", ctx_);
  FUSEDOPS_REQUIRE(co.size(0) == N + 1 && contiguous_or_empty(co), kValue, op_,
                   "chunk_offsets must be a contiguous [N+1]=[", N + 1, "] tensor, got shape ",
                   co.shape_string());
  if (read_indices()) {
    const HostIndex host_cu(op_, ctx_, cu), host_co(op_, ctx_, co);
    const TensorView &cu = host_cu.view, &co = host_co.view;
    const auto seqs = make_seqs(B, T, cu, BT);
    for (int64_t i = 0; i <= N; ++i) {
      const int64_t want = i < N ? seqs[i].chunk_offset
                                 : (N ? seqs[N - 1].chunk_offset + ceil_div(seqs[N - 1].len, BT) : 0);
      FUSEDOPS_REQUIRE(read_index(co, i) == want, kValue, op_, "chunk_offsets[", i, "] is ",
                       read_index(co, i), ", expected ", want, " for these cu_seqlens");
    }
    return total_chunks(B, T, cu, BT);
  }
  return -1;  // unknown without reading; the caller checks against other shapes
}

int64_t Check::snapshots(const TensorView& snap, const char* name, int64_t T, int64_t BT,
                         const TensorView& cu, int64_t nt_read) const {
  if (!cu.defined()) return ceil_div(T, BT);
  if (nt_read >= 0) return nt_read;
  c_.rank(snap, name, 5);
  return snap.size(1);
}

}  // namespace fusedops::la

namespace fusedops {

namespace {
void check_host_seqlens(const char* op, const TensorView& cu, int64_t chunk_size) {
  ArgCheck c(op);
  c.rank(cu, "cu_seqlens", 1).dtype_in(cu, "cu_seqlens", {DType::kInt32, DType::kInt64});
  FUSEDOPS_REQUIRE(cu.device().kind == DeviceKind::kCPU, kValue, op,
                   "cu_seqlens must be a CPU tensor here, got ", to_string(cu.device()));
  FUSEDOPS_REQUIRE(cu.size(0) >= 1 && (cu.numel() == 0 || cu.is_contiguous()), kValue, op,
                   "cu_seqlens must be a contiguous [N+1] tensor with N+1 >= 1");
  FUSEDOPS_REQUIRE(chunk_size >= 1, kValue, op, "chunk_size must be >= 1, got ", chunk_size);
  FUSEDOPS_REQUIRE(la::read_index(cu, 0) == 0, kValue, op, "cu_seqlens must start at 0, got ",
                   la::read_index(cu, 0));
  for (int64_t i = 0; i + 1 < cu.size(0); ++i)
    FUSEDOPS_REQUIRE(la::read_index(cu, i) <= la::read_index(cu, i + 1), kValue, op,
                     "cu_seqlens must be non-decreasing, got cu_seqlens[", i, "]=",
                     la::read_index(cu, i), " > cu_seqlens[", i + 1, "]=",
                     la::read_index(cu, i + 1));
}

void write_index(const TensorView& t, int64_t i, int64_t v) {
  if (t.dtype() == DType::kInt32) t.data_as<int32_t>()[i] = static_cast<int32_t>(v);
  else t.data_as<int64_t>()[i] = v;
}
}  // namespace

int64_t varlen_chunk_count(const TensorView& cu_seqlens, int64_t chunk_size) {
  check_host_seqlens("varlen_chunk_count", cu_seqlens, chunk_size);
  return la::total_chunks(1, 0, cu_seqlens, chunk_size);
}

void prepare_chunk_indices(const TensorView& cu_seqlens, int64_t chunk_size,
                           const TensorView& chunk_indices) {
  const char* op = "prepare_chunk_indices";
  check_host_seqlens(op, cu_seqlens, chunk_size);
  const int64_t NT = la::total_chunks(1, 0, cu_seqlens, chunk_size);
  ArgCheck c(op);
  c.same_dtype(chunk_indices, "chunk_indices", cu_seqlens, "cu_seqlens")
      .shape(chunk_indices, "chunk_indices", {NT, 2});
  FUSEDOPS_REQUIRE(chunk_indices.device().kind == DeviceKind::kCPU &&
                       (NT == 0 || chunk_indices.is_contiguous()),
                   kValue, op, "chunk_indices must be a contiguous CPU tensor");
  const auto seqs = la::make_seqs(1, 0, cu_seqlens, chunk_size);
  int64_t row = 0;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t i = 0; i < la::ceil_div(seqs[s].len, chunk_size); ++i, ++row) {
      write_index(chunk_indices, 2 * row, static_cast<int64_t>(s));
      write_index(chunk_indices, 2 * row + 1, i);
    }
}

void prepare_chunk_offsets(const TensorView& cu_seqlens, int64_t chunk_size,
                           const TensorView& chunk_offsets) {
  const char* op = "prepare_chunk_offsets";
  check_host_seqlens(op, cu_seqlens, chunk_size);
  const int64_t N = cu_seqlens.size(0) - 1;
  ArgCheck c(op);
  c.same_dtype(chunk_offsets, "chunk_offsets", cu_seqlens, "cu_seqlens")
      .shape(chunk_offsets, "chunk_offsets", {N + 1});
  FUSEDOPS_REQUIRE(chunk_offsets.device().kind == DeviceKind::kCPU && chunk_offsets.is_contiguous(),
                   kValue, op, "chunk_offsets must be a contiguous CPU tensor");
  int64_t off = 0;
  for (int64_t i = 0; i < N; ++i) {
    write_index(chunk_offsets, i, off);
    off += la::ceil_div(la::read_index(cu_seqlens, i + 1) - la::read_index(cu_seqlens, i),
                         chunk_size);
  }
  write_index(chunk_offsets, N, off);
}

}  // namespace fusedops
