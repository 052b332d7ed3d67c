#include "fusedops/core/dtype.h"

namespace fusedops {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: case DType::kInt32: return 4;
    case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kFloat64: case DType::kInt64: return 8;
    case DType::kBool: case DType::kUInt8: return 1;
  }
  return 0;
}

bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat64;
}

const char* device_kind_name(DeviceKind kind) { return kind == DeviceKind::kCPU ? "cpu" : "cuda"; }

std::string to_string(Device device) {
  if (device.kind == DeviceKind::kCPU) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

}  // namespace fusedops
