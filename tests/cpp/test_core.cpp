// The core: TensorView, errors, argument checks, dtype conversions and the backend registry.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/core/workspace.h"
#include "src/cpu/parallel.h"
#include "src/cpu/stream_copy.h"
#include "tests/cpp/test_util.h"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#endif

namespace fusedops::testing {
namespace {

TEST(TensorView, ShapeStridesAndRows) {
  float buf[24];
  TensorView t(buf, DType::kFloat32, Device::cpu(), {2, 3, 4});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.rows(), 6);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.row_stride(), 4);
  EXPECT_EQ(t.shape_string(), "[2,3,4]");
  // buf viewed as [2,3,2] taking the first 2 of every 4 columns: rows still collapse (stride 4).
  const int64_t shape[] = {2, 3, 2}, strides[] = {12, 4, 1};
  TensorView s(buf, DType::kFloat32, Device::cpu(), 3, shape, strides);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.row_stride(), 4);
  // A transposed leading pair does not collapse.
  const int64_t tshape[] = {3, 2, 4}, tstrides[] = {4, 12, 1};
  TensorView tr(buf, DType::kFloat32, Device::cpu(), 3, tshape, tstrides);
  EXPECT_FALSE(tr.rows_collapsible(nullptr));
  EXPECT_FALSE(TensorView().defined());
}

TEST(Error, CarriesOpKindAndLocation) {
  try {
    FUSEDOPS_FAIL(kValue, "some_op", "x must be ", 3, ", got ", 4);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kValue);
    EXPECT_EQ(e.op(), "some_op");
    EXPECT_EQ(e.message(), "x must be 3, got 4");
    EXPECT_EQ(e.file(), "tests/cpp/test_core.cpp");
    EXPECT_GT(e.line(), 0);
    EXPECT_NE(std::string(e.what()).find("fusedops: some_op: x must be 3, got 4 (tests/cpp/test_core.cpp:"),
              std::string::npos)
        << e.what();
    return;
  }
  ADD_FAILURE() << "no exception";
}

TEST(HalfTypes, RoundTripAndRoundToNearestEven) {
  EXPECT_EQ(to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256).bits, float_to_bf16(1.0f).bits);  // tie -> even
  EXPECT_EQ(to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_EQ(to_float(float_to_fp16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(to_float(float_to_fp16(70000.0f))));
  EXPECT_EQ(to_float(float_to_fp16(5.9604644775390625e-08f)), 5.9604644775390625e-08f);  // subnormal
  EXPECT_EQ(to_float(float_to_fp16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(to_float(float_to_fp16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(to_float(float_to_bf16(std::nanf("")))));
  for (float v : {0.1f, -3.3f, 1e-5f, 1234.5f}) {
    EXPECT_NEAR(to_float(float_to_fp16(v)), v, std::abs(v) * 1e-3 + 1e-7);
    EXPECT_NEAR(to_float(float_to_bf16(v)), v, std::abs(v) * 8e-3);
  }
}

TEST(Registry, ListsEveryOpWithPriorities) {
  auto& reg = Registry::instance();
  auto ops = reg.ops();
  EXPECT_NE(std::find(ops.begin(), ops.end(), "rmsnorm_without_weight"), ops.end());
  EXPECT_NE(std::find(ops.begin(), ops.end(), "l2norm"), ops.end());
  bool saw_ref = false, saw_cpu = false;
  for (const auto& info : reg.list("l2norm")) {
    if (info.spec.id == "ref") saw_ref = info.runnable_here && info.spec.priority == kPriorityRef;
    if (info.spec.id == "cpu") saw_cpu = info.runnable_here && info.spec.priority == kPriorityCpu;
    if (info.spec.device == DeviceKind::kCUDA) {
      EXPECT_EQ(info.runnable_here, cuda_device_count() > 0);
    }
  }
  EXPECT_TRUE(saw_ref);
  EXPECT_TRUE(saw_cpu);
  EXPECT_EQ(reg.preferred("l2norm", Direction::kForward, Device::cpu(), DType::kFloat32), "cpu");
  EXPECT_EQ(reg.preferred("l2norm", Direction::kForward, Device::cpu(), DType::kFloat64), "ref");
}

TEST(Registry, ContextAndEnvironmentOverrides) {
  auto& reg = Registry::instance();
  unsetenv("FUSEDOPS_BACKEND");
  EXPECT_EQ(env_backend_override("l2norm"), "");
  setenv("FUSEDOPS_BACKEND", "l2norm=ref,rmsnorm_without_weight=cpu", 1);
  EXPECT_EQ(env_backend_override("l2norm"), "ref");
  EXPECT_EQ(env_backend_override("rmsnorm_without_weight"), "cpu");
  EXPECT_EQ(reg.preferred("l2norm", Direction::kForward, Device::cpu(), DType::kFloat32), "ref");
  setenv("FUSEDOPS_BACKEND", "ref", 1);
  EXPECT_EQ(env_backend_override("anything"), "ref");
  setenv("FUSEDOPS_BACKEND", "*=cpu,l2norm=ref", 1);
  EXPECT_EQ(env_backend_override("rmsnorm_without_weight"), "cpu");
  EXPECT_EQ(env_backend_override("l2norm"), "ref");

  // The environment decides when the context does not; the context wins when it does.
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8], r[2];
  L2NormFwdArgs args{TensorView(x, DType::kFloat32, Device::cpu(), {2, 4}),
                     TensorView(y, DType::kFloat32, Device::cpu(), {2, 4}),
                     TensorView(r, DType::kFloat32, Device::cpu(), {2}), 1e-6};
  setenv("FUSEDOPS_BACKEND", "l2norm=nosuch", 1);
  expect_error([&] { l2norm_fwd(Context::cpu(), args); }, ErrorKind::kValue,
               "backend 'nosuch' is not registered for fwd (forced by FUSEDOPS_BACKEND)");
  Context ctx;
  ctx.backend = "cpu";
  l2norm_fwd(ctx, args);
  EXPECT_NEAR(y[0], 1.0 / std::sqrt(30.0), 1e-6);
  unsetenv("FUSEDOPS_BACKEND");
  l2norm_fwd(Context::cpu(), args);
  EXPECT_NEAR(y[7], 8.0 / std::sqrt(174.0), 1e-6);
}

TEST(Registry, RefusalsExplainEachBackend) {
  float x[4], y[4], r[1];
  Context ctx;
  ctx.backend = "cuda_sm80";
  L2NormFwdArgs args{TensorView(x, DType::kFloat32, Device::cpu(), {1, 4}),
                     TensorView(y, DType::kFloat32, Device::cpu(), {1, 4}),
                     TensorView(r, DType::kFloat32, Device::cpu(), {1}), 1e-6};
  if (built_with_cuda()) {
    expect_error([&] { l2norm_fwd(ctx, args); }, ErrorKind::kRuntime, "cuda_sm80: runs on cuda, not cpu");
  } else {
    expect_error([&] { l2norm_fwd(ctx, args); }, ErrorKind::kValue, "backend 'cuda_sm80' is not registered");
  }
}

TEST(Cuda, DeviceQueriesAreConsistent) {
  if (!built_with_cuda()) GTEST_SKIP() << "built without CUDA (FUSEDOPS_CUDA=OFF or no nvcc)";
  const int n = cuda_device_count();
  if (n == 0) GTEST_SKIP() << "no CUDA device visible in this process";
  EXPECT_GE(cuda_arch(0), 50);
  EXPECT_EQ(cuda_arch(n), 0);
}

TEST(Cuda, BackendsAreRegisteredWhenBuiltWithCuda) {
  if (!built_with_cuda()) GTEST_SKIP() << "built without CUDA (FUSEDOPS_CUDA=OFF or no nvcc)";
  for (const char* op : {"rmsnorm_without_weight", "l2norm"}) {
    int cuda_entries = 0;
    for (const auto& info : Registry::instance().list(op))
      cuda_entries += info.spec.device == DeviceKind::kCUDA;
    EXPECT_EQ(cuda_entries, 2) << op;
  }
  if (cuda_device_count() == 0) return;
  EXPECT_EQ(Registry::instance().preferred("l2norm", Direction::kForward, Device::cuda(0), DType::kBFloat16),
            "cuda_sm80");
}

// parallel_for_dynamic: every index of the range is handed out exactly once, with several threads
// in blocks of at most `block` consecutive indices (one call on the whole range with one thread),
// and an empty range calls nothing.
TEST(Parallel, DynamicScheduleCoversTheRangeOnce) {
  for (const int64_t n : {0, 1, 7, 64, 1000, 4099}) {
    for (const int64_t block : {1, 8, 64}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n) + 3);
      std::atomic<int64_t> calls{0}, too_long{0};
      fusedops::cpu::parallel_for_dynamic(3, 3 + n, block, [&](int64_t b, int64_t e) {
        ++calls;
        if ((fusedops::cpu::max_threads() > 1 && e - b > block) || e <= b) ++too_long;
        for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)]++;
      });
      EXPECT_EQ(too_long.load(), 0) << "n " << n << " block " << block;
      for (int64_t i = 0; i < n + 3; ++i)
        EXPECT_EQ(seen[static_cast<size_t>(i)].load(), i >= 3 ? 1 : 0) << "index " << i << " n " << n;
      if (n == 0) {
        EXPECT_EQ(calls.load(), 0);
      }
      // With several threads, short ranges are split finer than `block` (blocks of
      // ceil(n / (4 threads)) indices when that is smaller) so that every thread gets work.
      const int64_t t = fusedops::cpu::max_threads();
      if (t > 1 && n > 0) {
        const int64_t b = std::min<int64_t>(block, (n + 4 * t - 1) / (4 * t));
        EXPECT_EQ(calls.load(), (n + b - 1) / b) << "n " << n << " block " << block;
      }
    }
  }
}

#if defined(__linux__)
// page_mapped tells a fresh anonymous mapping's untouched pages from written ones,
// prefault_for_write maps exactly the whole pages inside its range without changing any byte,
// a streaming copy into the prefaulted pages is then the source byte for byte, and
// prefault_stream_output maps a fresh output on every thread, also when its end pages are mapped.
TEST(StreamCopy, PrefaultMapsWholePagesAndKeepsTheContents) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), pages = 64, bytes = pages * page;
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* d = static_cast<uint8_t*>(map);
  for (size_t i = 0; i < pages; ++i) ASSERT_FALSE(fusedops::cpu::page_mapped(d + i * page)) << "page " << i;
  d[5 * page + 7] = 42;  // pages 5 and 6 written: mapped, the rest still not
  d[6 * page] = 43;
  EXPECT_TRUE(fusedops::cpu::page_mapped(d + 5 * page + 100));
  EXPECT_FALSE(fusedops::cpu::page_mapped(d + 4 * page));
  // From the middle of page 3 to the middle of page 10: whole pages 4-9 only.
  fusedops::cpu::prefault_for_write(d + 3 * page + page / 2, 7 * page);
  // MADV_POPULATE_WRITE needs Linux 5.14 (and a sandbox that allows it); without it the call maps
  // nothing. Whether this kernel has it: the same request on a probe page of another mapping.
  void* probe = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(probe, MAP_FAILED);
  const bool populated = madvise(probe, page, MADV_POPULATE_WRITE) == 0;
  munmap(probe, page);
  std::printf("MADV_POPULATE_WRITE %s here\n", populated ? "available" : "unavailable");
  for (size_t i = 0; i < pages; ++i) {
    const bool want = i == 5 || i == 6 || (populated && i >= 4 && i <= 9);
    EXPECT_EQ(fusedops::cpu::page_mapped(d + i * page), want) << "page " << i;
  }
  for (size_t i = 0; i < bytes; ++i) {
    const uint8_t want = i == 5 * page + 7 ? 42 : i == 6 * page ? 43 : 0;
    ASSERT_EQ(d[i], want) << "byte " << i;
  }
  std::vector<uint8_t> src(bytes - 3);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 29 + 1);
  fusedops::cpu::prefault_for_write(d, bytes);
  for (size_t i = 0; i < pages; ++i) EXPECT_EQ(fusedops::cpu::page_mapped(d + i * page), populated || i == 5 || i == 6);
  fusedops::cpu::stream_copy(d + 3, src.data(), src.size());
  fusedops::cpu::stream_fence();
  EXPECT_EQ(std::memcmp(d + 3, src.data(), src.size()), 0);
  munmap(map, bytes);

  // prefault_stream_output: a fresh output of 4 MiB (several threads' parts) starting 100 bytes
  // into its first page gets every page after the first mapped, also when its first and last
  // pages are already mapped (as an allocator's headers can map them) and no byte changes.
  const size_t big = (size_t{4} << 20) + page;
  for (const bool ends_mapped : {false, true}) {
    SCOPED_TRACE(ends_mapped ? "first and last pages mapped" : "fresh");
    void* m2 = mmap(nullptr, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(m2, MAP_FAILED);
    auto* o = static_cast<uint8_t*>(m2);
    if (ends_mapped) o[0] = o[big - 1] = 7;
    fusedops::cpu::prefault_stream_output(o + 100, big - 100);
    const size_t npages = big / page;
    for (size_t i = 1; i < npages; ++i)
      ASSERT_EQ(fusedops::cpu::page_mapped(o + i * page), populated || (ends_mapped && i + 1 == npages))
          << "page " << i;
    for (size_t i = 1; i + 1 < big; ++i) ASSERT_EQ(o[i], 0) << "byte " << i;
    EXPECT_EQ(o[big - 1], ends_mapped ? 7 : 0);
    munmap(m2, big);
  }
}
#endif

// stream_copy (non-temporal stores for large outputs) equals memcpy byte for byte whatever the
// alignment of either side and the size (below the streaming size, around it, around the end of
// the prefetched part, odd tails), and writes nothing outside the destination range.
TEST(StreamCopy, EqualsMemcpyAtEveryAlignmentAndSize) {
  std::vector<uint8_t> src(70000 + 128), dst(70000 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  constexpr size_t P = fusedops::cpu::kStreamPrefetchBytes;  // the prefetched part's end
  for (const size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{4095}, size_t{4096}, size_t{4097}, P - 1, P, P + 1,
                         P + 64, P + 127, 2 * P + 65, size_t{65599}, size_t{70000}}) {
    for (const size_t so : {size_t{0}, size_t{1}, size_t{17}, size_t{63}}) {
      for (const size_t d_off : {size_t{0}, size_t{3}, size_t{32}, size_t{64}, size_t{127}}) {
        std::fill(dst.begin(), dst.end(), uint8_t{0xA5});
        fusedops::cpu::stream_copy(dst.data() + d_off, src.data() + so, n);
        fusedops::cpu::stream_fence();
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool in = i >= d_off && i < d_off + n;
          const uint8_t want = in ? src[so + i - d_off] : uint8_t{0xA5};
          ASSERT_EQ(dst[i], want) << "n " << n << " src offset " << so << " dst offset " << d_off << " byte " << i;
        }
      }
    }
  }
}

// Bad-input reports (fusedops/core/device_errors.h): codes, messages, the debug-checks switch.
TEST(DeviceErrors, CodesAndMessages) {
  const uint32_t code = device_error_code("some_op", "x[{index}] = {value} is out of range");
  EXPECT_GE(code, 1u);
  EXPECT_EQ(device_error_code("some_op", "x[{index}] = {value} is out of range"), code);
  EXPECT_NE(device_error_code("other_op", "x[{index}] = {value} is out of range"), code);
  DeviceErrorRecord r;
  EXPECT_EQ(describe_device_error(r), "");
  r.code = code;
  r.index = 3;
  r.value = -7;
  r.count = 1;
  EXPECT_EQ(describe_device_error(r), "some_op: x[3] = -7 is out of range");
  EXPECT_EQ(device_error_op(r), "some_op");
  r.count = 4;
  EXPECT_EQ(describe_device_error(r), "some_op: x[3] = -7 is out of range (4 reports; the first is shown)");
  r.code = 1u << 30;
  EXPECT_NE(describe_device_error(r).find("unknown report code"), std::string::npos);
}

TEST(DeviceErrors, DebugChecksFollowTheContextAndTheEnvironment) {
  Context ctx;
  const char* old = std::getenv("FUSEDOPS_CHECK_INDICES");
  const std::string saved = old ? old : "";
  unsetenv("FUSEDOPS_CHECK_INDICES");
  EXPECT_FALSE(debug_checks(ctx));
  ctx.validate = true;
  EXPECT_TRUE(debug_checks(ctx));
  ctx.validate = false;
  setenv("FUSEDOPS_CHECK_INDICES", "0", 1);
  EXPECT_FALSE(debug_checks(ctx));
  setenv("FUSEDOPS_CHECK_INDICES", "1", 1);
  EXPECT_TRUE(debug_checks(ctx));
  if (old) setenv("FUSEDOPS_CHECK_INDICES", saved.c_str(), 1);
  else unsetenv("FUSEDOPS_CHECK_INDICES");
  // On a CPU context the device functions do nothing.
  DeviceErrorRecord host;
  EXPECT_NO_THROW(read_device_errors_async(Context::cpu(), &host));
  EXPECT_NO_THROW(clear_device_errors(Context::cpu()));
  EXPECT_NO_THROW(check_device_errors(Context::cpu()));
}

TEST(DeviceErrors, CudaRecordStartsClearAndChecksClearIt) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Context ctx = Context::cuda(0);
  check_device_errors(ctx);  // whatever an earlier test left
  EXPECT_NO_THROW(check_device_errors(ctx));
  DeviceErrorRecord host;
  host.code = 99;
  read_device_errors_async(ctx, &host);
#ifdef FUSEDOPS_WITH_CUDA
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
#endif
  EXPECT_EQ(host.code, 0u);
  EXPECT_EQ(host.count, 0u);
}

TEST(ArgCheck, OffsetsAndIndexValues) {
  ArgCheck c("some_op");
  EXPECT_NO_THROW(c.offsets({0, 2, 2, 5}, "cu", 5, "T"));
  expect_error([&] { c.offsets({1, 2, 5}, "cu", 5, "T"); }, ErrorKind::kValue,
               "some_op: cu must start at 0, got cu[0] = 1");
  expect_error([&] { c.offsets({0, 3, 2, 5}, "cu", 5, "T"); }, ErrorKind::kValue,
               "cu must be non-decreasing, got cu[2] = 2 < cu[1] = 3");
  expect_error([&] { c.offsets({0, 3, 4}, "cu", 5, "T", "the length"); }, ErrorKind::kValue,
               "cu must end at T = 5 (the length), got cu[2] = 4");
  const int32_t v32[6] = {5, -1, 7, -2, 9, -3};
  const int64_t shape[1] = {3}, stride[1] = {2};
  const TensorView strided(const_cast<int32_t*>(v32), DType::kInt32, Device::cpu(), 1, shape, stride);
  EXPECT_EQ(read_index_values("some_op", Context::cpu(), strided), (std::vector<int64_t>{5, 7, 9}));
  const int64_t v64[2] = {int64_t(1) << 40, -4};
  const TensorView t64(const_cast<int64_t*>(v64), DType::kInt64, Device::cpu(), {2});
  EXPECT_EQ(read_index_values("some_op", Context::cpu(), t64), (std::vector<int64_t>{int64_t(1) << 40, -4}));
  const TensorView empty(nullptr, DType::kInt64, Device::cpu(), {0});
  EXPECT_TRUE(read_index_values("some_op", Context::cpu(), empty).empty());
}

TEST(ArgCheck, Workspace) {
  ArgCheck c("some_op");
  const Context ctx = Context::cpu();
  EXPECT_NO_THROW(c.workspace(TensorView(), ctx, 0, "some_op_workspace_size"));
  expect_error([&] { c.workspace(TensorView(), ctx, 16, "some_op_workspace_size"); }, ErrorKind::kValue,
               "some_op: workspace is required but was not given");
  TestTensor f32(DType::kFloat32, {4});  // 16 bytes in any dtype
  EXPECT_NO_THROW(c.workspace(f32.view(), ctx, 16, "some_op_workspace_size", 4));
  expect_error([&] { c.workspace(f32.view(), ctx, 17, "some_op_workspace_size"); }, ErrorKind::kValue,
               "workspace must hold at least 17 bytes (some_op_workspace_size), got 16");
  alignas(64) static uint8_t bytes[128];
  const TensorView off(bytes + 8, DType::kUInt8, Device::cpu(), {64});
  EXPECT_NO_THROW(c.workspace(off, ctx, 64, "some_op_workspace_size", 8));
  expect_error([&] { c.workspace(off, ctx, 64, "some_op_workspace_size", 16); }, ErrorKind::kValue,
               "workspace must start on a 16-byte boundary");
  const int64_t shape[1] = {32}, stride[1] = {2};
  const TensorView strided(bytes, DType::kUInt8, Device::cpu(), 1, shape, stride);
  expect_error([&] { c.workspace(strided, ctx, 8, "some_op_workspace_size"); }, ErrorKind::kValue,
               "workspace must be contiguous");
}

TEST(WorkspaceCarver, CountsThenHandsOutAlignedViewsInTheSameOrder) {
  WorkspaceCarver count(nullptr, Device::cpu(), 64);
  count.take(DType::kFloat32, {3, 5});  // 60 bytes -> 64
  count.take(DType::kBFloat16, {65});   // 130 bytes -> 192
  const int64_t mark = count.used();
  count.take(DType::kFloat64, {1});     // 8 bytes -> 64
  EXPECT_EQ(mark, 64 + 192);
  EXPECT_EQ(count.used(), 64 + 192 + 64);
  alignas(64) static char ws[320];
  WorkspaceCarver cv(ws, Device::cpu(), 64);
  const TensorView a = cv.take(DType::kFloat32, {3, 5});
  const TensorView b = cv.take(DType::kBFloat16, {65});
  EXPECT_EQ(static_cast<char*>(a.data()), ws);
  EXPECT_EQ(static_cast<char*>(b.data()), ws + 64);
  EXPECT_EQ(a.stride(0), 5);
  EXPECT_TRUE(b.is_contiguous());
  cv.seek(64);  // reuse b's bytes
  EXPECT_EQ(static_cast<char*>(cv.take(DType::kUInt8, {1}).data()), ws + 64);
  WorkspaceCarver none(TensorView(), Device::cpu(), 64);
  EXPECT_EQ(none.take(DType::kFloat32, {2}).data(), nullptr);
  EXPECT_EQ(none.used(), 64);
}

}  // namespace
}  // namespace fusedops::testing
