// Provenance: the dispatch trace (fusedops/core/trace.h), trace_start() and trace_stop() -> list
// of dicts, and build_info(): how this extension was compiled.
#include "python/src/bind.h"

namespace fusedops::py {

#ifndef FUSEDOPS_BUILD_CXX  // set by CMakeLists.txt
#define FUSEDOPS_BUILD_CXX ""
#define FUSEDOPS_BUILD_CUDA ""
#define FUSEDOPS_BUILD_CUDA_ARCHS ""
#define FUSEDOPS_BUILD_NATIVE ""
#define FUSEDOPS_BUILD_GEMM ""
#define FUSEDOPS_BUILD_TYPE ""
#endif

void bind_trace(nb::module_& m) {
  m.def(
      "build_info",
      [] {
        nb::dict d;
        d["cxx_compiler"] = FUSEDOPS_BUILD_CXX;
        d["cuda_compiler"] = FUSEDOPS_BUILD_CUDA;  // "" when built without CUDA
        d["cuda_archs"] = FUSEDOPS_BUILD_CUDA_ARCHS;
        d["native"] = std::string(FUSEDOPS_BUILD_NATIVE) == "ON";
        d["cpu_gemm"] = FUSEDOPS_BUILD_GEMM;
        d["build_type"] = FUSEDOPS_BUILD_TYPE;
        d["built_with_cuda"] = built_with_cuda();
        return d;
      },
      "How this extension was compiled: C++ and CUDA compiler versions, CUDA archs, -march=native, "
      "the CPU GEMM library, build type.");
  m.def("trace_start", &trace_start,
        "Clear the dispatch trace and start recording (every thread).");
  m.def(
      "trace_stop",
      [] {
        nb::list out;
        for (const auto& e : trace_stop()) {
          nb::dict d;
          d["op"] = e.op;
          d["direction"] = e.direction;
          d["backend"] = e.backend;
          d["kernel"] = e.kernel;
          d["parent"] = e.parent;
          d["count"] = e.count;
          out.append(d);
        }
        return out;
      },
      "Stop recording; the distinct (op, direction, backend, kernel, parent) events in first-seen "
      "order, each with its count. kernel is '' for a dispatch, else the variant a backend named; "
      "parent is 'op direction' of the enclosing dispatch, '' at top level.");
}

}  // namespace fusedops::py
