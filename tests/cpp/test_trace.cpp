// The dispatch trace (include/fusedops/core/trace.h): dispatch() records the backend that served
// each call, trace_kernel() names variants inside the innermost dispatch of its thread, other
// threads are recorded too, and nothing is recorded while the trace is off.
#include <cmath>
#include <thread>
#include <vector>

#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

const TraceEvent* find_event(const std::vector<TraceEvent>& events, const std::string& op,
                             const std::string& direction, const std::string& backend,
                             const std::string& kernel) {
  for (const auto& e : events)
    if (e.op == op && e.direction == direction && e.backend == backend && e.kernel == kernel)
      return &e;
  return nullptr;
}

TEST(Trace, DispatchRecordsTheBackendThatRan) {
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8], r[2];
  L2NormFwdArgs args{TensorView(x, DType::kFloat32, Device::cpu(), {2, 4}),
                     TensorView(y, DType::kFloat32, Device::cpu(), {2, 4}),
                     TensorView(r, DType::kFloat32, Device::cpu(), {2}), 1e-6};
  Context cpu, ref;
  cpu.backend = "cpu";
  ref.backend = "ref";
  l2norm_fwd(cpu, args);  // not recorded: the trace is off
  trace_start();
  l2norm_fwd(cpu, args);
  l2norm_fwd(cpu, args);
  l2norm_fwd(ref, args);
  const auto events = trace_stop();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].op, "l2norm");
  EXPECT_EQ(events[0].direction, "fwd");
  EXPECT_EQ(events[0].backend, "cpu");
  EXPECT_EQ(events[0].kernel, "");
  EXPECT_EQ(events[0].count, 2);
  EXPECT_EQ(events[1].backend, "ref");
  EXPECT_EQ(events[1].count, 1);
  EXPECT_NEAR(y[0], 1.0 / std::sqrt(30.0), 1e-6);

  l2norm_fwd(cpu, args);  // after stop: nothing is added
  trace_start();
  EXPECT_TRUE(trace_stop().empty());
}

TEST(Trace, KernelsBelongToTheInnermostDispatchOfTheirThread) {
  trace_start();
  {
    TraceScope outer("composed_op", "bwd", "cuda_sm90");
    trace_kernel("outer_kernel");
    {
      TraceScope inner("step_op", "bwd", "cuda_sm80");
      trace_kernel("step_kernel_a");
      trace_kernel("step_kernel_a");
    }
    trace_kernel("outer_kernel");
    std::thread other([] {
      trace_kernel("loose_kernel");  // no dispatch on this thread
      TraceScope s("threaded_op", "fwd", "cpu");
      trace_kernel("threaded_kernel");
    });
    other.join();
  }
  trace_kernel("after_kernel");
  const auto events = trace_stop();
  trace_kernel("unrecorded_kernel");

  const TraceEvent* outer = find_event(events, "composed_op", "bwd", "cuda_sm90", "outer_kernel");
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(outer->count, 2);
  const TraceEvent* step = find_event(events, "step_op", "bwd", "cuda_sm80", "step_kernel_a");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->count, 2);
  const TraceEvent* step_dispatch = find_event(events, "step_op", "bwd", "cuda_sm80", "");
  ASSERT_NE(step_dispatch, nullptr);
  EXPECT_EQ(step_dispatch->parent, "composed_op bwd");
  EXPECT_EQ(step->parent, "composed_op bwd");
  EXPECT_EQ(outer->parent, "");
  EXPECT_NE(find_event(events, "", "", "", "loose_kernel"), nullptr);
  EXPECT_NE(find_event(events, "threaded_op", "fwd", "cpu", "threaded_kernel"), nullptr);
  EXPECT_NE(find_event(events, "", "", "", "after_kernel"), nullptr);
  EXPECT_EQ(find_event(events, "", "", "", "unrecorded_kernel"), nullptr);
  // First-seen order: the composed op's dispatch comes before its step's.
  EXPECT_EQ(events[0].op, "composed_op");
  EXPECT_EQ(events[0].kernel, "");
}

}  // namespace
}  // namespace fusedops::testing
