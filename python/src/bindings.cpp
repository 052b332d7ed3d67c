// fusedops._C: DLPack tensors in, TensorViews to the core, one line per op. No math here.
#include "python/src/bind.h"

namespace fusedops::py {

DType to_dtype(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(t.code);
  if (t.lanes == 1) {
    if (code == Code::Float && t.bits == 32) return DType::kFloat32;
    if (code == Code::Float && t.bits == 16) return DType::kFloat16;
    if (code == Code::Bfloat && t.bits == 16) return DType::kBFloat16;
    if (code == Code::Float && t.bits == 64) return DType::kFloat64;
    if (code == Code::Int && t.bits == 32) return DType::kInt32;
    if (code == Code::Int && t.bits == 64) return DType::kInt64;
    if (code == Code::Bool && t.bits == 8) return DType::kBool;
    if (code == Code::UInt && t.bits == 8) return DType::kUInt8;
  }
  FUSEDOPS_FAIL(kType, "", "unsupported tensor dtype (DLPack code ", int(t.code), ", ", int(t.bits),
                " bits, ", int(t.lanes), " lanes)");
}

nb::object torch_tensor_capsule(nb::handle src) noexcept {
  // torch.Tensor and torch._C._to_dlpack, looked up once torch is imported (fusedops imports it
  // before its first call); the GIL guards these statics.
  static PyObject* tensor_type = nullptr;
  static PyObject* to_dlpack = nullptr;
  if (to_dlpack == nullptr) {
    PyObject* torch = PyImport_GetModule(nb::str("torch").ptr());
    if (torch == nullptr) {
      PyErr_Clear();
      return {};
    }
    PyObject* type = PyObject_GetAttrString(torch, "Tensor");
    PyObject* c = PyObject_GetAttrString(torch, "_C");
    PyObject* fn = c ? PyObject_GetAttrString(c, "_to_dlpack") : nullptr;
    Py_DECREF(torch);
    Py_XDECREF(c);
    if (type == nullptr || fn == nullptr || !PyType_Check(type)) {
      PyErr_Clear();
      Py_XDECREF(type);
      Py_XDECREF(fn);
      return {};
    }
    tensor_type = type;  // kept for the life of the process
    to_dlpack = fn;
  }
  if (!PyObject_TypeCheck(src.ptr(), reinterpret_cast<PyTypeObject*>(tensor_type))) return {};
  PyObject* cap = PyObject_CallOneArg(to_dlpack, src.ptr());
  if (cap == nullptr) {
    PyErr_Clear();
    return {};
  }
  // DLManagedTensor begins with DLTensor {void* data; DLDevice {int32 device_type; int32 id}; ...}.
  struct Head {
    void* data;
    int32_t device_type;
  };
  const auto* head = static_cast<const Head*>(PyCapsule_GetPointer(cap, "dltensor"));
  if (head == nullptr ||
      (head->device_type != nb::device::cpu::value && head->device_type != nb::device::cuda::value)) {
    PyErr_Clear();
    Py_DECREF(cap);  // the capsule's destructor releases the export
    return {};
  }
  return nb::steal(cap);
}

TensorView view(const Array& a) {
  Device device;
  if (a.device_type() == nb::device::cpu::value) {
    device = Device::cpu();
  } else if (a.device_type() == nb::device::cuda::value) {
    device = Device::cuda(a.device_id());
  } else {
    FUSEDOPS_FAIL(kType, "", "tensors must be on the CPU or a CUDA device (DLPack device type ",
                  a.device_type(), ")");
  }
  std::vector<int64_t> shape(a.ndim()), strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = static_cast<int64_t>(a.stride(i));
  }
  return TensorView(a.data(), to_dtype(a.dtype()), device, static_cast<int>(a.ndim()), shape.data(),
                    strides.data());
}

}  // namespace fusedops::py

using namespace fusedops;
using namespace fusedops::py;

namespace {

nb::dict backend_info(const BackendInfo& info) {
  nb::dict d;
  d["op"] = info.op;
  d["direction"] = direction_name(info.direction);
  d["backend"] = info.spec.id;
  d["device"] = device_kind_name(info.spec.device);
  d["min_arch"] = info.spec.min_arch;
  d["max_arch"] = info.spec.max_arch == INT_MAX ? -1 : info.spec.max_arch;
  std::vector<std::string> dtypes;
  for (DType t : info.spec.dtypes) dtypes.push_back(dtype_name(t));
  d["dtypes"] = dtypes;
  d["priority"] = info.spec.priority;
  d["runnable_here"] = info.runnable_here;
  return d;
}

DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32,
                  DType::kInt64, DType::kBool, DType::kUInt8})
    if (name == dtype_name(t)) return t;
  FUSEDOPS_FAIL(kValue, "", "unknown dtype name '", name, "'");
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "fusedops C++ core (framework-free) bound through DLPack";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* type = e.kind() == ErrorKind::kValue  ? PyExc_ValueError
                       : e.kind() == ErrorKind::kType ? PyExc_TypeError
                                                      : PyExc_RuntimeError;
      PyErr_SetString(type, e.what());
    }
  });

  nb::class_<Context>(m, "Context")
      .def(nb::init<>())
      .def("__init__",
           [](Context* c, const std::string& device_type, int device_index, uintptr_t stream,
              const std::string& backend, bool deterministic, bool validate) {
             new (c) Context();
             if (device_type == "cuda") c->device = Device::cuda(device_index);
             else if (device_type == "cpu") c->device = Device::cpu();
             else FUSEDOPS_FAIL(kType, "", "unsupported device type '", device_type, "'");
             c->stream = reinterpret_cast<void*>(stream);
             c->backend = backend;
             c->deterministic = deterministic;
             c->validate = validate;
           },
           nb::arg("device_type"), nb::arg("device_index"), nb::arg("stream"), nb::arg("backend"),
           nb::arg("deterministic") = true, nb::arg("validate") = false)
      .def_rw("backend", &Context::backend)
      .def_rw("deterministic", &Context::deterministic)
      .def_rw("validate", &Context::validate);

  // Bad-input reports of CUDA kernels (fusedops/core/device_errors.h). `host` is the address of
  // 32 bytes of (pinned) host memory the caller owns.
  m.def("device_error_code", &device_error_code, nb::arg("op"), nb::arg("condition"));
  m.def("describe_device_error",
        [](uint32_t code, int64_t index, int64_t value, uint64_t count) {
          DeviceErrorRecord r;
          r.code = code;
          r.index = index;
          r.value = value;
          r.count = count;
          return describe_device_error(r);
        },
        nb::arg("code"), nb::arg("index"), nb::arg("value"), nb::arg("count"));
  m.def("read_device_errors_async",
        [](const Context& ctx, uintptr_t host) {
          read_device_errors_async(ctx, reinterpret_cast<DeviceErrorRecord*>(host));
        },
        nb::arg("ctx"), nb::arg("host"));
  m.def("clear_device_errors", &clear_device_errors, nb::arg("ctx"));
  m.def("check_device_errors", &check_device_errors, nb::arg("ctx"), release_gil());
  m.def("debug_checks", &debug_checks, nb::arg("ctx"));

  m.def("built_with_cuda", &built_with_cuda);
  m.def("cuda_device_count", &cuda_device_count);
  m.def("cuda_arch", &cuda_arch, nb::arg("device_index"));
  m.def("ops", [] { return Registry::instance().ops(); });
  m.def("backends", [](const std::string& op) {
    nb::list out;
    for (const auto& info : Registry::instance().list(op)) out.append(backend_info(info));
    return out;
  }, nb::arg("op"));
  m.def("preferred_backend",
        [](const std::string& op, const std::string& direction, const std::string& device_type,
           int device_index, const std::string& dtype) {
          Device device = device_type == "cuda" ? Device::cuda(device_index) : Device::cpu();
          Direction dir = direction == "bwd" ? Direction::kBackward : Direction::kForward;
          return Registry::instance().preferred(op, dir, device, dtype_from_name(dtype));
        },
        nb::arg("op"), nb::arg("direction"), nb::arg("device_type"), nb::arg("device_index"),
        nb::arg("dtype"));

  bind_rmsnorm(m);
  bind_l2norm(m);
  bind_cross_entropy(m);
  bind_chunk_loss(m);
  bind_causal_conv1d(m);
  bind_sort_chunks(m);
  bind_matmul_add(m);
  bind_clipped_swiglu(m);
  bind_rmsnorm_gated(m);
  bind_mhc(m);
  bind_linear_attention(m);
  bind_gated_delta_rule(m);
  bind_kda(m);
  bind_context_parallel(m);
  bind_trace(m);
}
