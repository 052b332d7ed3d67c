// Host-side pieces shared by the linear-attention families (GDN, KDA): sequence and chunk layout
// (fixed length or cu_seqlens), strided token-major tensor access, and row loads/stores in any
// float dtype. Used by the argument checks, the float64 references and the CPU backends.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "fusedops/core/dtype.h"
#include "fusedops/core/error.h"
#include "fusedops/core/tensor.h"
#include "src/core/half.h"

namespace fusedops::la {

// Element i of a rank-1 (or flattened contiguous) int32/int64 tensor in host memory.
inline int64_t read_index(const TensorView& t, int64_t i) {
  if (t.dtype() == DType::kInt32) return t.data_as<const int32_t>()[i];
  return t.data_as<const int64_t>()[i];
}

struct Seq {
  int64_t b;    // batch row
  int64_t t0;   // first token in that row
  int64_t len;  // tokens
  int64_t chunk_offset;  // global index of the sequence's first chunk (snapshot index)
};

struct Chunk {
  int64_t b, t0, len;  // batch row, first token, valid rows (<= BT)
  int64_t seq;         // sequence index
  int64_t index;       // global chunk index (snapshot index of h / dh)
  bool last;           // last chunk of its sequence
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The sequences of a call: B fixed-length rows of T tokens, or the cu_seqlens segments of row 0.
// cu_seqlens must be readable on the host and already validated.
inline std::vector<Seq> make_seqs(int64_t B, int64_t T, const TensorView& cu_seqlens, int64_t BT) {
  std::vector<Seq> seqs;
  if (!cu_seqlens.defined()) {
    const int64_t nt = ceil_div(T, BT);
    for (int64_t b = 0; b < B; ++b) seqs.push_back({b, 0, T, b * nt});
    return seqs;
  }
  const int64_t n = cu_seqlens.size(0) - 1;
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bos = read_index(cu_seqlens, i), eos = read_index(cu_seqlens, i + 1);
    seqs.push_back({0, bos, eos - bos, off});
    off += ceil_div(eos - bos, BT);
  }
  return seqs;
}

inline std::vector<Chunk> make_chunks(const std::vector<Seq>& seqs, int64_t BT) {
  std::vector<Chunk> chunks;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const Seq& q = seqs[s];
    const int64_t nc = ceil_div(q.len, BT);
    for (int64_t i = 0; i < nc; ++i) {
      const int64_t len = std::min(BT, q.len - i * BT);
      chunks.push_back({q.b, q.t0 + i * BT, len, static_cast<int64_t>(s), q.chunk_offset + i,
                        i == nc - 1});
    }
  }
  return chunks;
}

// Number of chunk snapshots: B * ceil(T/BT), or the total over the varlen sequences.
inline int64_t total_chunks(int64_t B, int64_t T, const TensorView& cu_seqlens, int64_t BT) {
  if (!cu_seqlens.defined()) return B * ceil_div(T, BT);
  int64_t total = 0;
  const int64_t n = cu_seqlens.size(0) - 1;
  for (int64_t i = 0; i < n; ++i)
    total += ceil_div(read_index(cu_seqlens, i + 1) - read_index(cu_seqlens, i), BT);
  return total;
}

// A token-major tensor [B,T,H,D] (or [B,T,H] with D = 1) with arbitrary strides for the first
// three dims and a unit-stride last dim.
struct Tok {
  char* base = nullptr;
  DType dtype = DType::kFloat32;
  int64_t sb = 0, st = 0, sh = 0;  // strides in elements
  int64_t H = 0, D = 1;
  size_t esize = 4;

  Tok() = default;
  explicit Tok(const TensorView& v) {
    if (!v.defined()) return;
    base = static_cast<char*>(v.data());
    dtype = v.dtype();
    esize = dtype_size(dtype);
    sb = v.stride(0);
    st = v.stride(1);
    sh = v.ndim() > 2 ? v.stride(2) : 0;
    H = v.ndim() > 2 ? v.size(2) : 1;
    D = v.ndim() > 3 ? v.size(3) : 1;
  }
  bool defined() const { return base != nullptr; }
  char* ptr(int64_t b, int64_t t, int64_t h) const {
    return base + static_cast<int64_t>(esize) * (b * sb + t * st + h * sh);
  }
};

// A contiguous state-like tensor [..., K, V] addressed by a leading index (n*HV + hv or
// chunk*HV + hv).
struct Mat {
  char* base = nullptr;
  DType dtype = DType::kFloat32;
  int64_t rows = 0, cols = 0;
  size_t esize = 4;

  Mat() = default;
  explicit Mat(const TensorView& v) {
    if (!v.defined()) return;
    base = static_cast<char*>(v.data());
    dtype = v.dtype();
    esize = dtype_size(dtype);
    rows = v.size(-2);
    cols = v.size(-1);
  }
  bool defined() const { return base != nullptr; }
  char* ptr(int64_t index) const {
    return base + static_cast<int64_t>(esize) * index * rows * cols;
  }
};

// n values of dtype dt at p, as float / double (T), and back (round to nearest even; a 16-bit
// type from double goes through float). The same type is a plain copy (nothing for n = 0: an empty
// tensor's data may be null).
template <class T>
inline void load_values(const void* p, DType dt, T* out, int64_t n) {
  auto from = [&](const auto* s) {
    using S = std::remove_cv_t<std::remove_pointer_t<decltype(s)>>;
    if constexpr (std::is_same_v<S, T>) {
      if (n > 0) std::memcpy(out, s, sizeof(T) * n);
    } else if constexpr (std::is_floating_point_v<S>) {
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(s[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(to_float(s[i]));
    }
  };
  switch (dt) {
    case DType::kFloat32: return from(static_cast<const float*>(p));
    case DType::kFloat64: return from(static_cast<const double*>(p));
    case DType::kBFloat16: return from(static_cast<const bf16_t*>(p));
    case DType::kFloat16: return from(static_cast<const fp16_t*>(p));
    default: break;
  }
  FUSEDOPS_FAIL(kType, "linear_attention", "unsupported dtype ", dtype_name(dt));
}

template <class T>
inline void store_values(const T* in, void* p, DType dt, int64_t n) {
  auto to = [&](auto* d) {
    using D = std::remove_pointer_t<decltype(d)>;
    if constexpr (std::is_same_v<D, T>) {
      if (n > 0) std::memcpy(d, in, sizeof(T) * n);
    } else if constexpr (std::is_floating_point_v<D>) {
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<D>(in[i]);
    } else if constexpr (std::is_same_v<D, bf16_t>) {
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(static_cast<float>(in[i]));
    } else {
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_fp16(static_cast<float>(in[i]));
    }
  };
  switch (dt) {
    case DType::kFloat32: return to(static_cast<float*>(p));
    case DType::kFloat64: return to(static_cast<double*>(p));
    case DType::kBFloat16: return to(static_cast<bf16_t*>(p));
    case DType::kFloat16: return to(static_cast<fp16_t*>(p));
    default: break;
  }
  FUSEDOPS_FAIL(kType, "linear_attention", "unsupported dtype ", dtype_name(dt));
}

inline void load_floats(const void* p, DType dt, float* out, int64_t n) { load_values(p, dt, out, n); }
inline void store_floats(const float* in, void* p, DType dt, int64_t n) { store_values(in, p, dt, n); }
inline void load_doubles(const void* p, DType dt, double* out, int64_t n) { load_values(p, dt, out, n); }
inline void store_doubles(const double* in, void* p, DType dt, int64_t n) { store_values(in, p, dt, n); }

}  // namespace fusedops::la
