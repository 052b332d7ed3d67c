// The test harness both linear-attention families' C++ tests (test_gated_delta_rule.cpp,
// test_kda.cpp) build on: a test-side layout of the chunks (listed from cu_seqlens independently
// of the library), element addressing of contiguous [B,T,H,D] vectors, the rounding of the
// precision policy's base, random inputs as stored in a dtype, test tensors (NaN-poisoned
// outputs), the varlen index tensors, and the loop over backends, dtypes and cases with the
// precision-policy comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "fusedops/ops/linear_attention.h"
#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing::linear_attention {

using Vec = std::vector<double>;

// Contiguous [B,T,H,D] tensors, chunks of BT tokens per sequence (B rows of T, or cu_seqlens).
struct Layout {
  int64_t B, T, H, HV, K, V, BT;
  std::vector<int64_t> cu;  // empty: fixed length
  int64_t N() const { return cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1; }
  int64_t G() const { return HV / H; }
};

struct TChunk {
  int64_t b, t0, len, idx;  // batch row, first token, rows, snapshot index
};

inline std::vector<std::vector<TChunk>> seq_chunks(const Layout& L) {
  std::vector<std::vector<TChunk>> out;
  int64_t idx = 0;
  for (int64_t n = 0; n < L.N(); ++n) {
    const int64_t b = L.cu.empty() ? n : 0, t0 = L.cu.empty() ? 0 : L.cu[n];
    const int64_t len = L.cu.empty() ? L.T : L.cu[n + 1] - L.cu[n];
    std::vector<TChunk> cs;
    for (int64_t s = 0; s < len; s += L.BT) cs.push_back({b, t0 + s, std::min(L.BT, len - s), idx++});
    if (L.cu.empty()) idx = (n + 1) * ((L.T + L.BT - 1) / L.BT);
    out.push_back(cs);
  }
  return out;
}

inline std::vector<TChunk> all_chunks(const Layout& L) {
  std::vector<TChunk> out;
  for (const auto& s : seq_chunks(L)) out.insert(out.end(), s.begin(), s.end());
  return out;
}

// The snapshot tensors' second dimension NT.
inline int64_t snapshots(const Layout& L) {
  return L.cu.empty() ? (L.T + L.BT - 1) / L.BT : static_cast<int64_t>(all_chunks(L).size());
}

// Shapes: a token-major [B,T,H,D] tensor and the snapshots [B (1 with cu_seqlens),NT,HV,K,V].
inline std::vector<int64_t> tok(const Layout& L, int64_t H, int64_t D) { return {L.B, L.T, H, D}; }
inline std::vector<int64_t> snap(const Layout& L) { return {L.cu.empty() ? L.B : 1, snapshots(L), L.HV, L.K, L.V}; }

// Element (b, t, h, d) of a contiguous [B,T,H,D] vector.
struct At {
  int64_t T, H, D;
  int64_t operator()(int64_t b, int64_t t, int64_t h, int64_t d = 0) const { return ((b * T + t) * H + h) * D + d; }
};

// The rounding of the base (identity for the float64 oracle).
struct Rd {
  DType dt;
  double operator()(double x) const { return round_to(dt, x); }
};
inline const Rd kExact{DType::kFloat64};

// ---------------------------------------------------------------------------------------------
// Inputs.

inline Vec normal(int64_t n, std::mt19937_64& gen, double mean = 0.0, double stddev = 1.0) {
  std::normal_distribution<double> d(mean, stddev);
  Vec v(n);
  for (double& x : v) x = d(gen);
  return v;
}

// Values as stored in dtype (what the library reads).
inline Vec stored(Vec v, DType dt) {
  for (double& x : v) x = round_to(dt, x);
  return v;
}

// Rows of D values scaled to unit norm (sqrt(sum of squares + eps)).
inline void normalize_rows(Vec& v, int64_t D, double eps = 0.0) {
  for (size_t r = 0; r * D < v.size(); ++r) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += v[r * D + d] * v[r * D + d];
    for (int64_t d = 0; d < D; ++d) v[r * D + d] /= std::sqrt(s + eps);
  }
}

// max|ours - ref| / max(1, max|ref|) of each (ours, ref) pair, in order (the extreme-gate tests).
inline std::vector<double> relative_errors(std::initializer_list<std::pair<const TestTensor*, const Vec*>> outs) {
  std::vector<double> e;
  for (const auto& [t, want] : outs) {
    double m = 1;
    for (double x : *want) m = std::max(m, std::abs(x));
    e.push_back(max_abs_error(t->to_double(), *want) / m);
  }
  return e;
}

// The extreme-gate tests' bound for one output: within 10x of the backend's error at ordinary
// gates (or of the dtype's floor). The CUDA backends keep the chunk-local gate cumsum in fp32 (a
// known issue, in the family READMEs): each in-chunk difference g_i - g_j then carries up to one
// ulp of the largest cumsum magnitude M in its chunk, so exp(g_i - g_j) is off by up to about
// M * 2^-23 relative; their bound is the larger of the two. `max_chunk_cumsum` is M, the largest
// |chunk-local cumsum| of the gates the test passes (0 for the CPU backends, which sum in float64).
inline double extreme_gate_bound(double ordinary, double floor, bool fp32_cumsum, double max_chunk_cumsum) {
  const double b = 10 * std::max(ordinary, floor);
  return fp32_cumsum ? std::max(b, max_chunk_cumsum * 0x1p-23) : b;
}

// The largest |chunk-local cumsum| of log-gates g laid out [tokens, C] (C channels: value heads
// or heads x key channels), chunks of BT tokens starting at each sequence's start (`starts`: the
// token offsets of the sequences, their last entry the token count).
inline double max_chunk_cumsum(const Vec& g, int64_t C, int64_t BT, const std::vector<int64_t>& starts) {
  double m = 0;
  for (size_t n = 0; n + 1 < starts.size(); ++n)
    for (int64_t c = 0; c < C; ++c) {
      double run = 0;
      for (int64_t t = starts[n]; t < starts[n + 1]; ++t) {
        if ((t - starts[n]) % BT == 0) run = 0;
        run += g[t * C + c];
        m = std::max(m, std::abs(run));
      }
    }
  return m;
}

// fp32 "by convention" tensors (gates, states) are float64 in the float64 cases.
inline DType f32or(DType dt) { return dt == DType::kFloat64 ? dt : DType::kFloat32; }

// The gate cumsum's dtype as the torch layer allocates it for backend b: float64 on the CPU (its
// backends take in-chunk differences of it in double; README, Numerics), `gpu` on a GPU. The CUDA
// kernels take the GPU's also where the CPU emulation (src/ops/linear_attention/cpu_emulation)
// registers them as CPU backends.
inline DType gate_cumsum_dtype(const BackendCase& b, DType gpu) {
  const bool cuda_kernels = b.id.rfind("cuda", 0) == 0;
  return b.device.kind == DeviceKind::kCPU && !cuda_kernels ? DType::kFloat64 : gpu;
}

// A test tensor holding `values` (rounded to dt) with the given shape, on dev.
inline TestTensor tensor(DType dt, std::vector<int64_t> shape, const Vec& values, Device dev) {
  TestTensor t(dt, shape);
  t.set(values);
  return t.to(dev);
}

// An output filled with NaN (a kernel that leaves an element unwritten fails the comparison).
inline TestTensor poisoned(DType dt, std::vector<int64_t> shape, Device dev) {
  TestTensor t(dt, shape, dev);
  t.fill_nan();
  return t;
}

// Varlen index tensors (int32 or int64) built on the host by the library's helpers and placed on
// dev (a device backend reads them on its device); undefined views without cu_seqlens.
struct Index {
  TestTensor cu, ci, co;
  TensorView cuv() const { return cu.numel() ? cu.view() : TensorView(); }
  TensorView civ() const { return ci.numel() ? ci.view() : TensorView(); }
  TensorView cov() const { return co.numel() ? co.view() : TensorView(); }
};

inline Index make_index(const std::vector<int64_t>& cu, int64_t BT, Device dev, DType idt = DType::kInt64) {
  Index ix;
  if (cu.empty()) return ix;
  const int64_t n = static_cast<int64_t>(cu.size());
  ix.cu = TestTensor(idt, {n});
  for (int64_t i = 0; i < n; ++i) {
    if (idt == DType::kInt32) static_cast<int32_t*>(ix.cu.data())[i] = static_cast<int32_t>(cu[i]);
    else static_cast<int64_t*>(ix.cu.data())[i] = cu[i];
  }
  ix.ci = TestTensor(idt, {varlen_chunk_count(ix.cu.view(), BT), 2});
  ix.co = TestTensor(idt, {n});
  prepare_chunk_indices(ix.cu.view(), BT, ix.ci.view());
  prepare_chunk_offsets(ix.cu.view(), BT, ix.co.view());
  ix.cu = ix.cu.to(dev);
  ix.ci = ix.ci.to(dev);
  ix.co = ix.co.to(dev);
  return ix;
}
inline Index make_index(const Layout& L, Device dev, DType idt = DType::kInt64) {
  return make_index(L.cu, L.BT, dev, idt);
}

// ---------------------------------------------------------------------------------------------
// Running and comparing.

struct Case {
  Layout L;
  std::string name;
  bool cuda_16bit = false;  // run only by the CUDA backends with 16-bit storage (their 16-bit mma kernels)
};

inline const DType kDtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64};

// fn(backend, dtype, layout) for every runnable backend of (op, dir), every dtype it takes and the
// cases: 16-bit storage runs the first two cases (and, on CUDA, the cuda_16bit ones); fp32 and
// float64 all but the cuda_16bit ones.
template <class Fn>
void for_each_case(const std::vector<Case>& all, const std::string& op, Direction dir, Fn&& fn) {
  int checked = 0;
  for (const auto& b : runnable_backends(op, dir))
    for (DType dt : kDtypes) {
      if (!backend_takes(op, dir, b.id, dt)) continue;
      const bool half = dt == DType::kBFloat16 || dt == DType::kFloat16;
      const bool cuda = b.id.rfind("cuda", 0) == 0;
      for (size_t ci = 0; ci < all.size(); ++ci) {
        const Case& cs = all[ci];
        if (cs.cuda_16bit ? !(cuda && half) : (half && ci >= 2)) continue;
        SCOPED_TRACE(b.id + "/" + dtype_name(dt) + "/" + cs.name);
        fn(b, dt, cs.L);
        ++checked;
      }
    }
  EXPECT_GT(checked, 0);
}

// The precision policy with the tolerance of the coarser of the input and output dtypes. The
// float64 reference backend must agree with the oracle to f64_rel relative to the largest value
// (summation orders differ).
inline void expect_close(const char* what, const TestTensor& ours, const Vec& base, const Vec& ref, DType dt,
                         double f64_rel) {
  const Vec got = ours.to_double();
  if (dt == DType::kFloat64 && ours.dtype() == DType::kFloat64) {
    double m = 1, e = max_abs_error(got, ref);
    for (double r : ref) m = std::max(m, std::abs(r));
    EXPECT_LE(e, f64_rel * m) << what << ": float64 max-abs err " << e;
    return;
  }
  const DType tol_dt = floor_for(ours.dtype()) > floor_for(dt) ? ours.dtype() : dt;
  Vec b = base;
  if (tol_dt != dt)
    for (double& x : b) x = round_to(tol_dt, x);
  Verdict v = check_close(got, b, ref, tol_dt);
  EXPECT_TRUE(v.pass) << what << ": " << v.describe();
}

}  // namespace fusedops::testing::linear_attention
