// Dispatch trace: which backend, and which kernel variants, actually served the calls made while a
// trace is recording. The registry's dispatch() records every (op, direction, backend) it runs,
// including the sub-operators a composed op dispatches; a backend can name the kernel variant it
// launches with trace_kernel("name"), which is attributed to the innermost dispatch running on the
// same thread. Recording is process-wide (autograd runs backward passes on its own threads) and
// off by default: then each hook costs one relaxed atomic load.
//
//   fusedops::trace_start();
//   fusedops::chunk_gated_delta_rule_fwd(ctx, args);
//   for (const auto& e : fusedops::trace_stop()) ...  // e.op, e.direction, e.backend, e.kernel,
//                                                     // e.parent
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace fusedops {

struct TraceEvent {
  std::string op;         // registry op name ("" for a kernel launched outside any dispatch)
  std::string direction;  // "fwd" or "bwd"
  std::string backend;    // backend id of the dispatch ("ref", "cpu", "cuda_sm80", "cuda_sm90")
  std::string kernel;     // "" for the dispatch itself; else the kernel variant it launched
  std::string parent;     // "op direction" of the dispatch this one ran inside ("" at top level)
  int64_t count = 0;      // how many times this event happened while recording
};

// Clears the recorded events and starts recording (every thread).
void trace_start();
// Stops recording and returns the distinct events (op, direction, backend, kernel, parent) in the
// order they were first seen, each with its count.
std::vector<TraceEvent> trace_stop();

namespace detail {
std::atomic<bool>& trace_flag();
void trace_enter(const char* op, const char* direction, const std::string& backend);
void trace_leave();
void trace_kernel_slow(const char* name);
}  // namespace detail

inline bool trace_enabled() { return detail::trace_flag().load(std::memory_order_relaxed); }

// Names the kernel variant a backend is about to launch (a string literal: it is copied only
// while recording). Call it on the host, next to the launch.
inline void trace_kernel(const char* name) {
  if (trace_enabled()) detail::trace_kernel_slow(name);
}

// Held by dispatch() around a backend's run(): records the dispatch and makes it the owner of the
// trace_kernel() calls made inside it on this thread.
class TraceScope {
 public:
  TraceScope(const char* op, const char* direction, const std::string& backend)
      : active_(trace_enabled()) {
    if (active_) detail::trace_enter(op, direction, backend);
  }
  ~TraceScope() {
    if (active_) detail::trace_leave();
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  bool active_;
};

}  // namespace fusedops
