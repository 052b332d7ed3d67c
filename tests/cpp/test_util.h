// Test tensors that own host or device memory, random fills, NaN poisoning, a list of the
// backends a test can run on this machine and the dtypes each takes, a shape seen as rows, and the
// precision policy's check of one output.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fusedops/fusedops.h"
#include "src/core/half.h"
#include "src/core/visit.h"
#include "tests/common/tolerance.h"

#ifdef FUSEDOPS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fusedops::testing {

class TestTensor {
 public:
  TestTensor() = default;
  TestTensor(DType dtype, std::vector<int64_t> shape, Device device = Device::cpu())
      : dtype_(dtype), shape_(std::move(shape)), device_(device) {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    numel_ = n;
    bytes_ = static_cast<size_t>(n) * dtype_size(dtype);
    host_.assign(bytes_ + 64, 0);
    if (device_.kind == DeviceKind::kCUDA) {
#ifdef FUSEDOPS_WITH_CUDA
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, bytes_ + 64), cudaSuccess);
      dev_ = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
#endif
    }
  }

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  void* data() const {
    return device_.kind == DeviceKind::kCUDA ? dev_.get() : const_cast<uint8_t*>(host_.data());
  }

  TensorView view() const {
    std::vector<int64_t> strides(shape_.size());
    int64_t s = 1;
    for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
      strides[d] = s;
      s *= shape_[d];
    }
    return TensorView(data(), dtype_, device_, static_cast<int>(shape_.size()), shape_.data(),
                      strides.data());
  }
  // A view with explicit shape and strides over this buffer.
  TensorView strided_view(std::vector<int64_t> shape, std::vector<int64_t> strides) const {
    return TensorView(data(), dtype_, device_, static_cast<int>(shape.size()), shape.data(),
                      strides.data());
  }

  std::vector<double> to_double() const {
    sync_to_host();
    std::vector<double> out(numel_);
    visit_float(dtype_, [&](auto tag) {
      using T = decltype(tag);
      const T* p = reinterpret_cast<const T*>(host_.data());
      for (int64_t i = 0; i < numel_; ++i) out[i] = to_double_value(p[i]);
    });
    return out;
  }

  // Stores v (rounded to the dtype) and returns what was stored, as doubles.
  std::vector<double> set(const std::vector<double>& v) {
    visit_float(dtype_, [&](auto tag) {
      using T = decltype(tag);
      T* p = reinterpret_cast<T*>(host_.data());
      for (int64_t i = 0; i < numel_; ++i) p[i] = from_double_value<T>(v[i]);
    });
    sync_to_device();
    return to_double();
  }

  std::vector<double> fill_normal(uint64_t seed, double mean = 0.0, double stddev = 1.0) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> dist(mean, stddev);
    std::vector<double> v(numel_);
    for (auto& x : v) x = dist(gen);
    return set(v);
  }

  void fill_nan() { set(std::vector<double>(numel_, std::nan(""))); }

  // The raw bytes (for bitwise comparisons).
  std::vector<uint8_t> bytes() const {
    sync_to_host();
    return std::vector<uint8_t>(host_.begin(), host_.begin() + bytes_);
  }

  TestTensor to(Device device) const {
    TestTensor t(dtype_, shape_, device);
    sync_to_host();
    std::memcpy(t.host_.data(), host_.data(), bytes_);
    t.sync_to_device();
    return t;
  }

 private:
  template <class T>
  static double to_double_value(T v) {
    if constexpr (std::is_same_v<T, double>) return v;
    else return static_cast<double>(to_float(v));
  }
  template <class T>
  static T from_double_value(double v) {
    if constexpr (std::is_same_v<T, double>) return v;
    else return from_float<T>(static_cast<float>(v));
  }
  void sync_to_host() const {
#ifdef FUSEDOPS_WITH_CUDA
    if (device_.kind == DeviceKind::kCUDA && bytes_) {
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(const_cast<uint8_t*>(host_.data()), dev_.get(), bytes_,
                           cudaMemcpyDeviceToHost), cudaSuccess);
    }
#endif
  }
  void sync_to_device() {
#ifdef FUSEDOPS_WITH_CUDA
    if (device_.kind == DeviceKind::kCUDA && bytes_) {
      EXPECT_EQ(cudaMemcpy(dev_.get(), host_.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    }
#endif
  }

  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> shape_;
  Device device_{};
  int64_t numel_ = 0;
  size_t bytes_ = 0;
  std::vector<uint8_t> host_;
  std::shared_ptr<void> dev_;
};

// A backend of `op` that this process can run, with the context that selects it.
struct BackendCase {
  std::string id;
  Device device;
  Context ctx() const {
    Context c;
    c.device = device;
    c.backend = id;
    return c;
  }
};

inline std::vector<BackendCase> runnable_backends(const std::string& op, Direction dir) {
  std::vector<BackendCase> out;
  for (const auto& info : Registry::instance().list(op)) {
    if (info.direction != dir || !info.runnable_here) continue;
    out.push_back({info.spec.id, info.spec.device == DeviceKind::kCUDA ? Device::cuda(0)
                                                                       : Device::cpu()});
  }
  return out;
}

inline bool backend_takes(const std::string& op, Direction dir, const std::string& id, DType dtype) {
  for (const auto& info : Registry::instance().list(op))
    if (info.direction == dir && info.spec.id == id)
      for (DType d : info.spec.dtypes)
        if (d == dtype) return true;
  return false;
}

inline const std::vector<DType> kFloatDtypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                                DType::kFloat64};

// The dtypes of `from` that backend b of (op, dir) takes, in that order.
inline std::vector<DType> dtypes_taken(const std::string& op, Direction dir, const BackendCase& b,
                                       const std::vector<DType>& from = kFloatDtypes) {
  std::vector<DType> out;
  for (DType d : from)
    if (backend_takes(op, dir, b.id, d)) out.push_back(d);
  return out;
}

// The dtype of the tensors kept in fp32 by convention (statistics, losses) for inputs of dtype x:
// float64 for float64 inputs.
inline DType fp32_or_f64(DType x) {
  return x == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
}

// A shape as rows of its last dimension D; lead_shape is the shape without it.
struct Rows {
  int64_t rows, D;
};
inline Rows rows_of(const std::vector<int64_t>& shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return {rows, shape.back()};
}
inline std::vector<int64_t> lead_shape(const std::vector<int64_t>& shape) {
  return std::vector<int64_t>(shape.begin(), shape.end() - 1);
}

// Outputs filled with NaN (a kernel that leaves an element unwritten fails the comparison).
template <class... T>
void poison(T&... outputs) {
  (outputs.fill_nan(), ...);
}

// The precision policy (tests/common/tolerance.h) on one output; `what` names it in a failure.
inline void expect_policy(const std::string& what, const std::vector<double>& got,
                          const std::vector<double>& base, const std::vector<double>& ref,
                          DType dtype) {
  const Verdict v = check_close(got, base, ref, dtype);
  EXPECT_TRUE(v.pass) << what << ": " << v.describe();
}

inline std::string case_name(const std::string& backend, DType dtype, const std::vector<int64_t>& shape) {
  return backend + "/" + dtype_name(dtype) + "/" + shape_string(shape.data(), static_cast<int>(shape.size()));
}

// Expects `fn` to throw a fusedops::Error of `kind` whose message contains `text`.
template <class Fn>
void expect_error(Fn&& fn, ErrorKind kind, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing '" << text << "'";
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
        << "message was: " << e.what() << "\nexpected to contain: " << text;
  }
}

}  // namespace fusedops::testing
