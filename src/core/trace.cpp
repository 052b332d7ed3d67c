#include "fusedops/core/trace.h"

#include <mutex>

namespace fusedops {
namespace {

struct Frame {
  std::string op, direction, backend;
  const Frame* outer;
};

// The dispatches running on this thread, innermost first (a composed op dispatches its steps).
thread_local const Frame* t_current = nullptr;

struct Log {
  std::mutex mu;
  std::vector<TraceEvent> events;
};

Log& log() {
  static Log* l = new Log();  // never destroyed: hooks may run during static destruction
  return *l;
}

// A trace is read by a person or a report: past this many distinct events it stops growing.
constexpr size_t kMaxEvents = 4096;

std::string name_of(const Frame* f) { return f ? f->op + " " + f->direction : std::string(); }

void record(const std::string& op, const std::string& direction, const std::string& backend,
            const char* kernel, const std::string& parent) {
  Log& l = log();
  std::lock_guard<std::mutex> lock(l.mu);
  for (auto& e : l.events) {
    if (e.op == op && e.direction == direction && e.backend == backend && e.kernel == kernel &&
        e.parent == parent) {
      ++e.count;
      return;
    }
  }
  if (l.events.size() < kMaxEvents) l.events.push_back({op, direction, backend, kernel, parent, 1});
}

}  // namespace

namespace detail {

std::atomic<bool>& trace_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}

void trace_enter(const char* op, const char* direction, const std::string& backend) {
  auto* frame = new Frame{op, direction, backend, t_current};
  t_current = frame;
  record(frame->op, frame->direction, frame->backend, "", name_of(frame->outer));
}

void trace_leave() {
  const Frame* frame = t_current;
  if (frame == nullptr) return;
  t_current = frame->outer;
  delete frame;
}

void trace_kernel_slow(const char* name) {
  static const std::string none;
  const Frame* f = t_current;
  record(f ? f->op : none, f ? f->direction : none, f ? f->backend : none, name ? name : "",
         f ? name_of(f->outer) : none);
}

}  // namespace detail

void trace_start() {
  Log& l = log();
  std::lock_guard<std::mutex> lock(l.mu);
  l.events.clear();
  detail::trace_flag().store(true, std::memory_order_relaxed);
}

std::vector<TraceEvent> trace_stop() {
  detail::trace_flag().store(false, std::memory_order_relaxed);
  Log& l = log();
  std::lock_guard<std::mutex> lock(l.mu);
  std::vector<TraceEvent> out;
  out.swap(l.events);
  return out;
}

}  // namespace fusedops
