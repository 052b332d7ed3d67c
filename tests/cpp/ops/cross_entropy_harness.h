// What both cross-entropy C++ tests (test_cross_entropy.cpp, test_chunk_loss.cpp) build on: the
// cross-entropy of one row of logits as docs/specs/ops.md section 1 defines it, with its gradient,
// for their float64 oracles and their bases; the "mean" divisor; random labels and the label
// tensors; the workspace; and the check of the backward's rescaling of the saved gradients.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing::cross_entropy {

// The "mean" reduction's divisor: the rows not ignored (at least 1); 1 for the other reductions.
inline double mean_divisor(const std::vector<int64_t>& y, const CrossEntropyOptions& o) {
  int64_t valid = 0;
  for (int64_t label : y) valid += label != o.ignore_index;
  return o.reduction == LossReduction::kMean ? std::max<int64_t>(valid, 1) : 1.0;
}

struct RowLoss {
  double loss;    // the row's loss, its z-loss included
  double z_loss;  // lambda * lse^2
};

// The cross-entropy of the V logits x (before logit_scale) of a row with the given label, every
// intermediate rounded to dtype (kFloat64: exact); grad gets the gradient of c times the row's
// loss with respect to x.
inline RowLoss row_cross_entropy(const double* x, int64_t V, int64_t label,
                                 const CrossEntropyOptions& o, double c, DType dtype,
                                 double* grad) {
  auto rd = [&](double v) { return round_to(dtype, v); };
  const double eps = o.label_smoothing, lambda = o.lse_square_scale;
  const bool capped = o.logit_softcapping.has_value();
  const double cap = capped ? *o.logit_softcapping : 1.0;
  std::vector<double> z(V), t(V, 0.0);
  double m = -std::numeric_limits<double>::infinity(), sz = 0;
  for (int64_t v = 0; v < V; ++v) {
    z[v] = rd(o.logit_scale * x[v]);
    if (capped) {
      t[v] = rd(std::tanh(rd(z[v] / cap)));
      z[v] = rd(cap * t[v]);
    }
    m = std::max(m, z[v]);
    sz += z[v];
  }
  double s = 0;
  for (int64_t v = 0; v < V; ++v) s += rd(std::exp(rd(z[v] - m)));
  const double lse = rd(m + rd(std::log(s)));
  const bool in_range = label >= 0 && label < V;
  const double zy = in_range ? z[label] : std::nan("");
  const double ce = rd(rd((1 - eps) * rd(lse - zy)) + rd(eps * rd(lse - rd(sz / V))));
  const double rz = rd(lambda * rd(lse * lse));
  for (int64_t v = 0; v < V; ++v) {
    const double p = rd(std::exp(rd(z[v] - lse)));
    double dz = rd(rd((1 + 2 * lambda * lse) * p) - rd(eps / V));
    if (in_range && v == label) dz = rd(dz - (1 - eps));
    dz = rd(c * dz);
    grad[v] = rd(o.logit_scale * (capped ? rd(dz * rd(1 - t[v] * t[v])) : dz));
  }
  return {rd(ce + rz), rz};
}

// N labels in [0, V) drawn from gen (one draw a row); every ignore_every-th row from row 0 (0:
// none, 1: all) gets ignore_index instead.
inline std::vector<int64_t> draw_labels(std::mt19937_64& gen, int64_t N, int64_t V,
                                        int ignore_every, int64_t ignore_index) {
  std::vector<int64_t> y(N);
  for (int64_t i = 0; i < N; ++i) {
    y[i] = static_cast<int64_t>(gen() % static_cast<uint64_t>(V));
    if (ignore_every && i % ignore_every == 0) y[i] = ignore_index;
  }
  return y;
}

// The labels y as an int64 (or int32) tensor of `shape` on dev. TestTensor::set takes floating
// values only: the integers are written directly.
inline TestTensor labels_tensor(const std::vector<int64_t>& y, std::vector<int64_t> shape,
                                bool int64, Device dev) {
  TestTensor host(int64 ? DType::kInt64 : DType::kInt32, std::move(shape));
  for (size_t i = 0; i < y.size(); ++i) {
    if (int64)
      static_cast<int64_t*>(host.data())[i] = y[i];
    else
      static_cast<int32_t*>(host.data())[i] = static_cast<int32_t>(y[i]);
  }
  return host.to(dev);
}

// A workspace of `bytes` on dev (a 1-byte buffer when none is needed); its view is undefined then.
struct Workspace {
  TestTensor buf;
  size_t bytes;
  TensorView view() const { return bytes ? buf.view() : TensorView(); }
};
inline Workspace workspace(size_t bytes, Device dev) {
  const int64_t n = static_cast<int64_t>(std::max<size_t>(bytes, 1));
  return {TestTensor(DType::kUInt8, {n}, dev), bytes};
}

// The backward's rescaling of a saved gradient: got = g * saved, with one factor g[0] for all
// (g of size 1) or g[r] for row r of `row` elements; the base rounds g * saved to dtype.
inline void expect_rescaled(const std::string& what, const std::vector<double>& got,
                            const std::vector<double>& saved, const std::vector<double>& g,
                            int64_t row, DType dtype) {
  std::vector<double> ref(saved.size()), base(saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    ref[i] = (g.size() == 1 ? g[0] : g[i / static_cast<size_t>(row)]) * saved[i];
    base[i] = round_to(dtype, ref[i]);
  }
  expect_policy(what, got, base, ref, dtype);
}

}  // namespace fusedops::testing::cross_entropy
