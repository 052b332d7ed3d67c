// The dispatch trace (fusedops/core/trace.h): trace_start(), trace_stop() -> list of dicts.
#include "python/src/bind.h"

namespace fusedops::py {

void bind_trace(nb::module_& m) {
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
