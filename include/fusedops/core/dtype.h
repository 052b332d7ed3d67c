// Element types, devices and the half-precision storage types shared by CPU and CUDA code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fusedops {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kBool, kUInt8 };

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);
bool is_floating(DType dtype);

enum class DeviceKind : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::kCUDA, index}; }
  bool operator==(const Device& o) const { return kind == o.kind && (kind == DeviceKind::kCPU || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

std::string to_string(Device device);
const char* device_kind_name(DeviceKind kind);

}  // namespace fusedops
