// sort_chunks_by_idx (and its helpers make_chunk_sort_map, sort_chunks_by_map): every runnable
// backend against an oracle written here (the concatenation of the chunks in sorted order), for
// every element dtype, bit for bit: odd row sizes, zero-size chunks, reversed and random orders,
// sum of sizes below N, no chunks at all, strided inputs, empty tensors; the backward as the
// exact inverse; poisoned outputs; determinism; every error of docs/specs/ops.md section 6.5.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "tests/cpp/test_util.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fusedops::testing {
namespace {

constexpr const char* kOp = "sort_chunks_by_idx";

struct ChunkCase {
  std::string name;
  int64_t N, Hd;
  std::vector<int64_t> sizes, order;
};

// Random sizes (some zero) summing to `total` <= N, and a random permutation.
ChunkCase random_case(const std::string& name, int64_t N, int64_t Hd, int64_t S, int64_t total,
                      uint64_t seed) {
  std::mt19937_64 gen(seed);
  ChunkCase c{name, N, Hd, std::vector<int64_t>(S, 0), std::vector<int64_t>(S)};
  for (int64_t i = 0; i < total && S > 0; ++i) c.sizes[gen() % S] += 1;
  if (S > 2) c.sizes[gen() % S] = 0, c.sizes[S - 1] += total - std::accumulate(c.sizes.begin(), c.sizes.end(), int64_t{0});
  std::iota(c.order.begin(), c.order.end(), 0);
  std::shuffle(c.order.begin(), c.order.end(), gen);
  return c;
}

std::vector<ChunkCase> cases() {
  std::vector<ChunkCase> out = {
      {"one_row", 1, 1, {1}, {0}},
      {"reversed_odd_rows", 37, 13, {5, 0, 11, 3, 0, 18}, {5, 4, 3, 2, 1, 0}},
      {"identity_order", 9, 7, {2, 3, 4}, {0, 1, 2}},
      {"sum_below_n", 23, 9, {4, 0, 7}, {2, 0, 1}},
      {"no_chunks", 6, 5, {}, {}},
      {"all_zero_sizes", 5, 3, {0, 0, 0}, {1, 2, 0}},
      {"one_chunk_holds_all", 17, 33, {0, 17, 0}, {2, 1, 0}},
      {"empty_rows", 5, 0, {2, 3}, {1, 0}},
      {"no_rows", 0, 8, {0, 0}, {1, 0}},
  };
  out.push_back(random_case("random_many_chunks", 1000, 64, 96, 1000, 7));
  out.push_back(random_case("random_wide_rows", 70, 520, 9, 61, 8));
  out.push_back(random_case("random_one_row_chunks", 300, 24, 300, 300, 9));
  return out;
}

// Where each input row goes: the chunks laid out one after another in sorted order, rows past
// the chunks unchanged. (A different formulation from the library's offsets and positions.)
std::vector<int64_t> oracle_map(const ChunkCase& c) {
  const int64_t S = static_cast<int64_t>(c.sizes.size());
  std::vector<int64_t> start(S, 0), map(c.N);
  for (int64_t k = 1; k < S; ++k) start[k] = start[k - 1] + c.sizes[k - 1];
  int64_t o = 0;
  for (int64_t j = 0; j < S; ++j)
    for (int64_t i = 0; i < c.sizes[c.order[j]]; ++i) map[start[c.order[j]] + i] = o++;
  for (int64_t r = o; r < c.N; ++r) map[r] = r;
  return map;
}

void fill_bytes(TestTensor& t, uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto* p = static_cast<uint8_t*>(t.data());
  const size_t n = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(gen());
  if (t.dtype() == DType::kBool)
    for (size_t i = 0; i < n; ++i) p[i] &= 1;
}

// A CPU tensor with the given bytes pattern, moved to `device`.
TestTensor random_tensor(DType dtype, std::vector<int64_t> shape, Device device, uint64_t seed) {
  TestTensor t(dtype, std::move(shape));
  fill_bytes(t, seed);
  return t.to(device);
}

TestTensor poisoned(DType dtype, std::vector<int64_t> shape, Device device) {
  TestTensor t(dtype, std::move(shape));
  std::memset(t.data(), 0xff, static_cast<size_t>(t.numel()) * dtype_size(dtype));
  return t.to(device);
}

TestTensor index_tensor(DType dtype, const std::vector<int64_t>& v, Device device) {
  TestTensor t(dtype, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kInt32) static_cast<int32_t*>(t.data())[i] = static_cast<int32_t>(v[i]);
    else static_cast<int64_t*>(t.data())[i] = v[i];
  }
  return t.to(device);
}

std::vector<int64_t> map_values(const TestTensor& map) {
  const auto b = map.bytes();
  std::vector<int64_t> out(map.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    int32_t v;
    std::memcpy(&v, b.data() + 4 * i, 4);
    out[i] = v;
  }
  return out;
}

// Rows of `bytes` (rows of `row_bytes`, `stride` bytes apart) placed by `map`:
// scatter out[map[r]] = in[r], or gather out[r] = in[map[r]].
std::vector<uint8_t> move_rows(const std::vector<uint8_t>& in, int64_t N, int64_t row_bytes,
                               int64_t stride, const std::vector<int64_t>& map, bool scatter) {
  std::vector<uint8_t> out(static_cast<size_t>(N * row_bytes), 0xff);
  if (row_bytes == 0) return out;  // no bytes to move (memcpy must not see an empty vector's null data)
  for (int64_t r = 0; r < N; ++r) {
    const int64_t d = scatter ? map[r] : r, s = scatter ? r : map[r];
    std::memcpy(out.data() + d * row_bytes, in.data() + s * stride, row_bytes);
  }
  return out;
}

std::vector<int64_t> identity(int64_t N) {
  std::vector<int64_t> id(N);
  std::iota(id.begin(), id.end(), 0);
  return id;
}

const DType kAllTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64,
                           DType::kUInt8,   DType::kInt32,    DType::kInt64,   DType::kBool};

TestTensor workspace_for(int64_t S, Device device) {
  return TestTensor(DType::kUInt8, {static_cast<int64_t>(sort_chunks_by_idx_workspace_size(S))},
                    device);
}

TEST(SortChunksByIdx, ForwardAndBackwardAreTheExactPermutationOnEveryBackend) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dt : kAllTypes) {
      if (!backend_takes(kOp, Direction::kForward, b.id, dt)) continue;
      for (const auto& c : cases()) {
        for (int variant = 0; variant < 3; ++variant) {
          // 0: int64 indices, fp32 probs, packed rows; 1: int32 indices, bf16 probs with stride
          // 2, rows 3 elements apart wider than Hd; 2: int32 indices, no probs.
          SCOPED_TRACE(b.id + "/" + dtype_name(dt) + "/" + c.name + "/variant" + std::to_string(variant));
          const DType idx_t = variant == 0 ? DType::kInt64 : DType::kInt32;
          const int64_t pad = variant == 1 ? 3 : 0;
          const int64_t es = static_cast<int64_t>(dtype_size(dt));
          const int64_t S = static_cast<int64_t>(c.sizes.size());
          TestTensor buf = random_tensor(dt, {c.N, c.Hd + pad}, b.device, 100 + checked);
          const TensorView inp = buf.strided_view({c.N, c.Hd}, {c.Hd + pad, 1});
          TestTensor sizes = index_tensor(idx_t, c.sizes, b.device);
          TestTensor order = index_tensor(idx_t, c.order, b.device);
          const bool with_probs = variant != 2;
          const DType pt = variant == 0 ? DType::kFloat32 : DType::kBFloat16;
          const int64_t pstride = variant == 1 ? 2 : 1;
          TestTensor pbuf = random_tensor(pt, {c.N * pstride}, b.device, 200 + checked);
          const TensorView probs = with_probs ? pbuf.strided_view({c.N}, {pstride}) : TensorView();
          TestTensor out = poisoned(dt, {c.N, c.Hd}, b.device);
          TestTensor pout = poisoned(pt, {c.N}, b.device);
          TestTensor map = poisoned(DType::kInt32, {c.N}, b.device);
          TestTensor ws = workspace_for(S, b.device);
          Context ctx = b.ctx();
          sort_chunks_by_idx_fwd(ctx, {inp, sizes.view(), order.view(), probs, out.view(),
                                       with_probs ? pout.view() : TensorView(), map.view(),
                                       ws.view()});
          const std::vector<int64_t> want_map = oracle_map(c);
          if (c.N > 0) {
            EXPECT_EQ(map_values(map), want_map);
          }
          const auto in_bytes = buf.bytes();
          const auto want = move_rows(in_bytes, c.N, c.Hd * es, (c.Hd + pad) * es, want_map, true);
          EXPECT_TRUE(out.bytes() == want) << "out differs from the concatenated chunks";
          if (with_probs) {
            const auto pw = move_rows(pbuf.bytes(), c.N, dtype_size(pt), pstride * dtype_size(pt),
                                      want_map, true);
            EXPECT_TRUE(pout.bytes() == pw) << "probs_out differs";
          }

          // Backward: the gather through the saved map gives back the input exactly.
          TestTensor d_inp = poisoned(dt, {c.N, c.Hd}, b.device);
          TestTensor d_probs = poisoned(pt, {c.N}, b.device);
          sort_chunks_by_idx_bwd(ctx, {out.view(), with_probs ? pout.view() : TensorView(),
                                       map.view(), d_inp.view(),
                                       with_probs ? d_probs.view() : TensorView()});
          const auto packed_in = move_rows(in_bytes, c.N, c.Hd * es, (c.Hd + pad) * es,
                                           identity(c.N),
                                           false);
          EXPECT_TRUE(d_inp.bytes() == packed_in) << "the backward is not the inverse";
          if (with_probs) {
            const auto pin = move_rows(pbuf.bytes(), c.N, dtype_size(pt), pstride * dtype_size(pt),
                                       identity(c.N),
                                       false);
            EXPECT_TRUE(d_probs.bytes() == pin) << "d_probs is not the inverse";
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(SortChunksByIdx, BackwardOfAnyGradientIsTheGatherThroughTheMap) {
  // A gradient unrelated to the forward output: d_inp[r] = d_out[map[r]] byte for byte.
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dt : {DType::kBFloat16, DType::kFloat32, DType::kUInt8}) {
      SCOPED_TRACE(b.id + "/" + dtype_name(dt));
      const ChunkCase c = random_case("bwd", 211, 45, 17, 200, 3);
      const auto want_map = oracle_map(c);
      TestTensor map(DType::kInt32, {c.N});
      for (int64_t r = 0; r < c.N; ++r) static_cast<int32_t*>(map.data())[r] = static_cast<int32_t>(want_map[r]);
      TestTensor dmap = map.to(b.device);
      TestTensor d_out = random_tensor(dt, {c.N, c.Hd}, b.device, 5);
      TestTensor d_inp = poisoned(dt, {c.N, c.Hd}, b.device);
      sort_chunks_by_idx_bwd(b.ctx(), {d_out.view(), TensorView(), dmap.view(), d_inp.view(), TensorView()});
      const int64_t rb = c.Hd * static_cast<int64_t>(dtype_size(dt));
      EXPECT_TRUE(d_inp.bytes() == move_rows(d_out.bytes(), c.N, rb, rb, want_map, false));
    }
  }
}

TEST(SortChunksByIdx, HelpersMatchTheOracle) {
  for (const auto& b : runnable_backends("make_chunk_sort_map", Direction::kForward)) {
    for (const auto& c : cases()) {
      SCOPED_TRACE(b.id + "/" + c.name);
      const int64_t S = static_cast<int64_t>(c.sizes.size());
      TestTensor sizes = index_tensor(DType::kInt32, c.sizes, b.device);
      TestTensor order = index_tensor(DType::kInt64, c.order, b.device);
      TestTensor map = poisoned(DType::kInt32, {c.N}, b.device);
      TestTensor ws = workspace_for(S, b.device);
      make_chunk_sort_map(b.ctx(), {sizes.view(), order.view(), map.view(), ws.view()});
      const auto want_map = oracle_map(c);
      if (c.N > 0) {
        EXPECT_EQ(map_values(map), want_map);
      }
    }
  }
  for (const auto& b : runnable_backends("sort_chunks_by_map", Direction::kForward)) {
    for (bool forward : {true, false}) {
      for (DType dt : {DType::kFloat16, DType::kFloat64}) {
        SCOPED_TRACE(b.id + "/" + dtype_name(dt) + (forward ? "/scatter" : "/gather"));
        const ChunkCase c = random_case("by_map", 157, 31, 12, 150, 11);
        const auto want_map = oracle_map(c);
        TestTensor hmap(DType::kInt32, {c.N});
        for (int64_t r = 0; r < c.N; ++r) static_cast<int32_t*>(hmap.data())[r] = static_cast<int32_t>(want_map[r]);
        TestTensor map = hmap.to(b.device);
        TestTensor inp = random_tensor(dt, {c.N, c.Hd}, b.device, 21);
        TestTensor probs = random_tensor(DType::kFloat32, {c.N}, b.device, 22);
        TestTensor out = poisoned(dt, {c.N, c.Hd}, b.device);
        TestTensor pout = poisoned(DType::kFloat32, {c.N}, b.device);
        TestTensor ws(DType::kUInt8, {static_cast<int64_t>(sort_chunks_by_map_workspace_size(c.N, forward))}, b.device);
        sort_chunks_by_map(b.ctx(), {inp.view(), map.view(), probs.view(), out.view(), pout.view(), forward, ws.view()});
        const int64_t rb = c.Hd * static_cast<int64_t>(dtype_size(dt));
        EXPECT_TRUE(out.bytes() == move_rows(inp.bytes(), c.N, rb, rb, want_map, forward));
        EXPECT_TRUE(pout.bytes() == move_rows(probs.bytes(), c.N, 4, 4, want_map, forward));
      }
    }
  }
}

// A case's random input (CPU, int64 indices) and the reference backend's forward of it.
struct RefForward {
  TestTensor inp, sizes, order, want, want_map;
  RefForward(const ChunkCase& c, DType dt, uint64_t seed)
      : inp(random_tensor(dt, {c.N, c.Hd}, Device::cpu(), seed)),
        sizes(index_tensor(DType::kInt64, c.sizes, Device::cpu())),
        order(index_tensor(DType::kInt64, c.order, Device::cpu())),
        want(dt, {c.N, c.Hd}),
        want_map(DType::kInt32, {c.N}) {
    sort_chunks_by_idx_fwd_ref(Context::cpu(), {inp.view(), sizes.view(), order.view(), TensorView(),
                                                want.view(), TensorView(), want_map.view(), TensorView()});
  }
};

TEST(SortChunksByIdx, ManyRowsAndChunksMatchTheReferenceBackend) {
  // A shape that spreads over many blocks; the reference backend is the oracle here.
  const ChunkCase c = random_case("large", 6000, 200, 256, 5990, 99);
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    if (b.id == "ref") continue;
    SCOPED_TRACE(b.id);
    const RefForward r(c, DType::kBFloat16, 1);
    const TestTensor &inp = r.inp, &sizes = r.sizes, &order = r.order, &want = r.want, &want_map = r.want_map;
    TestTensor di = inp.to(b.device), ds = sizes.to(b.device), dord = order.to(b.device);
    TestTensor out = poisoned(DType::kBFloat16, {c.N, c.Hd}, b.device);
    TestTensor map = poisoned(DType::kInt32, {c.N}, b.device);
    TestTensor ws = workspace_for(256, b.device);
    sort_chunks_by_idx_fwd(b.ctx(), {di.view(), ds.view(), dord.view(), TensorView(), out.view(),
                                     TensorView(), map.view(), ws.view()});
    EXPECT_TRUE(out.bytes() == want.bytes());
    EXPECT_TRUE(map.bytes() == want_map.bytes());
  }
}

#if defined(__linux__)
// Outputs of 16 MiB and more are written with streaming stores; an output whose pages are not
// mapped yet (fresh from the kernel, as a large allocation is) is mapped first
// (src/cpu/stream_copy.h). Both kinds of output, forward and backward, on the cpu backend: the
// same bytes as the reference backend's.
TEST(SortChunksByIdx, StreamedOutputsFreshOrMappedMatchTheReference) {
  const auto backends = runnable_backends(kOp, Direction::kForward);
  const auto cpu = std::find_if(backends.begin(), backends.end(), [](const auto& b) { return b.id == "cpu"; });
  ASSERT_NE(cpu, backends.end()) << "the cpu backend is always built";
  const ChunkCase c = random_case("streamed", 4200, 1024, 64, 4190, 11);  // 16.4 MiB of fp32
  const size_t bytes = static_cast<size_t>(c.N * c.Hd) * sizeof(float);
  const RefForward r(c, DType::kFloat32, 3);
  const TestTensor &inp = r.inp, &sizes = r.sizes, &order = r.order, &want = r.want, &want_map = r.want_map;
  for (const bool fresh : {true, false}) {
    SCOPED_TRACE(fresh ? "fresh pages" : "mapped pages");
    auto map_out = [&] {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      EXPECT_NE(p, MAP_FAILED);
      if (!fresh) std::memset(p, 0xff, bytes);
      return static_cast<float*>(p);
    };
    float* out = map_out();
    float* d_inp = map_out();
    ASSERT_TRUE(out != MAP_FAILED && d_inp != MAP_FAILED);
    TestTensor map = poisoned(DType::kInt32, {c.N}, Device::cpu());
    TestTensor ws = workspace_for(64, Device::cpu());
    const TensorView out_v(out, DType::kFloat32, Device::cpu(), {c.N, c.Hd});
    const TensorView d_inp_v(d_inp, DType::kFloat32, Device::cpu(), {c.N, c.Hd});
    Context ctx = cpu->ctx();
    sort_chunks_by_idx_fwd(ctx, {inp.view(), sizes.view(), order.view(), TensorView(), out_v, TensorView(),
                                 map.view(), ws.view()});
    EXPECT_EQ(std::memcmp(out, want.data(), bytes), 0) << "forward output";
    EXPECT_TRUE(map.bytes() == want_map.bytes());
    sort_chunks_by_idx_bwd(ctx, {out_v, TensorView(), map.view(), d_inp_v, TensorView()});
    EXPECT_EQ(std::memcmp(d_inp, inp.data(), bytes), 0) << "backward output";
    munmap(out, bytes);
    munmap(d_inp, bytes);
  }
}
#endif

TEST(SortChunksByIdx, RepeatedRunsAreBitwiseEqual) {
  const ChunkCase c = random_case("det", 513, 96, 40, 500, 5);
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    SCOPED_TRACE(b.id);
    TestTensor inp = random_tensor(DType::kBFloat16, {c.N, c.Hd}, b.device, 1);
    TestTensor sizes = index_tensor(DType::kInt32, c.sizes, b.device);
    TestTensor order = index_tensor(DType::kInt32, c.order, b.device);
    TestTensor ws = workspace_for(40, b.device);
    std::vector<std::vector<uint8_t>> runs;
    for (int k = 0; k < 2; ++k) {
      TestTensor out = poisoned(DType::kBFloat16, {c.N, c.Hd}, b.device);
      TestTensor map = poisoned(DType::kInt32, {c.N}, b.device);
      TestTensor din = poisoned(DType::kBFloat16, {c.N, c.Hd}, b.device);
      sort_chunks_by_idx_fwd(b.ctx(), {inp.view(), sizes.view(), order.view(), TensorView(), out.view(),
                                       TensorView(), map.view(), ws.view()});
      sort_chunks_by_idx_bwd(b.ctx(), {out.view(), TensorView(), map.view(), din.view(), TensorView()});
      auto o = out.bytes(), d = din.bytes();
      o.insert(o.end(), d.begin(), d.end());
      runs.push_back(o);
    }
    EXPECT_TRUE(runs[0] == runs[1]);
  }
}

// Index contents that break the contract (issue 39's reproductions first: a non-permutation
// and sizes summing past the rows), each with the CPU message.
struct BadChunks {
  std::vector<int64_t> sizes, order;
  std::string message;
};
const std::vector<BadChunks>& bad_chunks() {
  static const std::vector<BadChunks> b = {
      {{2, 2, 2}, {0, 0, 1}, "sorted_index must be a permutation of 0..2, got 0 twice"},
      {{2, 2, 5}, {2, 1, 0}, "the sum of split_sizes (9) must not exceed the number of rows of inp (6)"},
      {{-4, 9, 1}, {1, 2, 0}, "split_sizes must be >= 0, got split_sizes[0] = -4"},
      {{3, 1, 2}, {7, -1, 1}, "sorted_index must be a permutation of 0..2, got sorted_index[0] = 7"},
  };
  return b;
}

// The same checks when inp has no rows (nothing would be moved, but the sizes are still wrong).
TEST(SortChunksByIdx, BadIndicesRaiseOnTheCpuWithoutRows) {
  TestTensor inp(DType::kFloat32, {0, 4}), out(DType::kFloat32, {0, 4}), map(DType::kInt32, {0});
  TestTensor sizes = index_tensor(DType::kInt64, {2}, Device::cpu());
  TestTensor order = index_tensor(DType::kInt64, {0}, Device::cpu());
  expect_error([&] { sort_chunks_by_idx_fwd(Context::cpu(), {inp.view(), sizes.view(), order.view(), TensorView(),
                                                            out.view(), TensorView(), map.view(), TensorView()}); },
               ErrorKind::kValue, "the sum of split_sizes (2) must not exceed the number of rows of inp (0)");
}

TEST(SortChunksByIdx, BadIndicesRaiseOnTheCpuBeforeAnyWork) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    if (b.device.kind != DeviceKind::kCPU) continue;
    for (const auto& bad : bad_chunks()) {
      SCOPED_TRACE(b.id + " " + bad.message);
      TestTensor inp = random_tensor(DType::kFloat32, {6, 4}, b.device, 3);
      TestTensor sizes = index_tensor(DType::kInt64, bad.sizes, b.device);
      TestTensor order = index_tensor(DType::kInt32, bad.order, b.device);
      TestTensor out = poisoned(DType::kFloat32, {6, 4}, b.device);
      TestTensor map = poisoned(DType::kInt32, {6}, b.device);
      const auto out_before = out.bytes(), map_before = map.bytes();
      expect_error([&] { sort_chunks_by_idx_fwd(b.ctx(), {inp.view(), sizes.view(), order.view(), TensorView(),
                                                          out.view(), TensorView(), map.view(), TensorView()}); },
                   ErrorKind::kValue, "sort_chunks_by_idx: " + bad.message);
      expect_error([&] { make_chunk_sort_map(b.ctx(), {sizes.view(), order.view(), map.view(), TensorView()}); },
                   ErrorKind::kValue, "make_chunk_sort_map: " + bad.message);
      EXPECT_TRUE(out.bytes() == out_before) << "the forward wrote before it raised";
      EXPECT_TRUE(map.bytes() == map_before) << "the map was written before the error";
    }
  }
}

TEST(SortChunksByIdx, BadRowMapsRaiseOnTheCpu) {
  const std::vector<std::pair<std::vector<int64_t>, std::string>> bad = {
      {{0, 1, 2, 3, 4, 4}, "row_id_map must be a permutation of 0..5, got 4 twice"},
      {{0, 1, 2, 3, 4, 6}, "row_id_map must be a permutation of 0..5, got row_id_map[5] = 6"},
      {{-1, 1, 2, 3, 4, 5}, "row_id_map must be a permutation of 0..5, got row_id_map[0] = -1"},
  };
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    if (b.device.kind != DeviceKind::kCPU) continue;
    for (const auto& [m, message] : bad) {
      SCOPED_TRACE(b.id + " " + message);
      TestTensor dout = random_tensor(DType::kFloat32, {6, 4}, b.device, 4);
      TestTensor map = index_tensor(DType::kInt32, m, b.device);
      TestTensor din = poisoned(DType::kFloat32, {6, 4}, b.device);
      expect_error([&] { sort_chunks_by_idx_bwd(b.ctx(), {dout.view(), TensorView(), map.view(), din.view(), TensorView()}); },
                   ErrorKind::kValue, "sort_chunks_by_idx: " + message);
      for (bool fwd : {true, false})
        expect_error([&] { sort_chunks_by_map(b.ctx(), {dout.view(), map.view(), TensorView(), din.view(), TensorView(), fwd, TensorView()}); },
                     ErrorKind::kValue, "sort_chunks_by_map: " + message);
    }
  }
}

// On CUDA the kernels check the indices: a bad table gives the identity permutation and a report
// that check_device_errors raises (once); with debug checks the call itself raises the CPU's
// message. (compute-sanitizer memcheck runs these on the H200 as well.)
TEST(SortChunksByIdx, BadIndicesOnCudaGiveTheIdentityAndAReport) {
  bool any = false;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    if (b.device.kind != DeviceKind::kCUDA) continue;
    any = true;
    const Context ctx = b.ctx();
    check_device_errors(ctx);  // nothing pending from earlier tests
    for (const auto& bad : bad_chunks()) {
      SCOPED_TRACE(b.id + " " + bad.message);
      TestTensor inp = random_tensor(DType::kFloat32, {6, 4}, b.device, 3);
      TestTensor sizes = index_tensor(DType::kInt64, bad.sizes, b.device);
      TestTensor order = index_tensor(DType::kInt32, bad.order, b.device);
      TestTensor out = poisoned(DType::kFloat32, {6, 4}, b.device);
      TestTensor map = poisoned(DType::kInt32, {6}, b.device);
      TestTensor ws = workspace_for(3, b.device);
      EXPECT_NO_THROW(sort_chunks_by_idx_fwd(ctx, {inp.view(), sizes.view(), order.view(), TensorView(),
                                                   out.view(), TensorView(), map.view(), ws.view()}));
      EXPECT_TRUE(out.bytes() == inp.bytes()) << "a bad table must give the identity";
      EXPECT_EQ(map_values(map), identity(6));
      expect_error([&] { check_device_errors(ctx); }, ErrorKind::kValue, "sort_chunks_by_idx: ");
      EXPECT_NO_THROW(check_device_errors(ctx)) << "the report was not cleared";
      Context debug = ctx;
      debug.validate = true;
      expect_error([&] { sort_chunks_by_idx_fwd(debug, {inp.view(), sizes.view(), order.view(), TensorView(),
                                                         out.view(), TensorView(), map.view(), ws.view()}); },
                   ErrorKind::kValue, "sort_chunks_by_idx: " + bad.message);
    }
    // Map entries outside [0, N): a gather writes zero rows, a scatter skips them; both report.
    TestTensor src = random_tensor(DType::kFloat32, {6, 4}, b.device, 5);
    TestTensor oob = index_tensor(DType::kInt32, {0, 1, 2, 3, 4, 9}, b.device);
    TestTensor dst = poisoned(DType::kFloat32, {6, 4}, b.device);
    EXPECT_NO_THROW(sort_chunks_by_idx_bwd(ctx, {src.view(), TensorView(), oob.view(), dst.view(), TensorView()}));
    auto got = dst.bytes(), in = src.bytes();
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + 5 * 16, in.begin()));
    EXPECT_TRUE(std::all_of(got.begin() + 5 * 16, got.end(), [](uint8_t v) { return v == 0; }));
    expect_error([&] { check_device_errors(ctx); }, ErrorKind::kValue,
                 "sort_chunks_by_idx: row_id_map[5] = 9 is outside [0, N)");
    // A scatter through a map that is not a permutation: rows nothing reaches are zero.
    TestTensor dup = index_tensor(DType::kInt32, {0, 1, 2, 3, 4, 4}, b.device);
    TestTensor mws(DType::kUInt8, {static_cast<int64_t>(sort_chunks_by_map_workspace_size(6, true))}, b.device);
    EXPECT_NO_THROW(sort_chunks_by_map(ctx, {src.view(), dup.view(), TensorView(), dst.view(), TensorView(), true, mws.view()}));
    got = dst.bytes();
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + 4 * 16, in.begin()));
    EXPECT_TRUE(std::all_of(got.begin() + 5 * 16, got.end(), [](uint8_t v) { return v == 0; }));
    expect_error([&] { check_device_errors(ctx); }, ErrorKind::kValue,
                 "sort_chunks_by_map: row_id_map is not a permutation: row 4 is the target of more than one entry");
  }
  if (!any) GTEST_SKIP() << "no CUDA backend can run here";
}

TEST(SortChunksByIdx, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor inp(DType::kFloat32, {6, 4}), out(DType::kFloat32, {6, 4}), map(DType::kInt32, {6});
  TestTensor sizes = index_tensor(DType::kInt64, {2, 4}, Device::cpu());
  TestTensor order = index_tensor(DType::kInt64, {1, 0}, Device::cpu());
  auto fwd = [&](const SortChunksFwdArgs& a, const Context& c = Context::cpu()) { sort_chunks_by_idx_fwd(c, a); };
  SortChunksFwdArgs good{inp.view(), sizes.view(), order.view(), TensorView(), out.view(), TensorView(),
                         map.view(), TensorView()};
  EXPECT_NO_THROW(fwd(good));

  TestTensor inp3(DType::kFloat32, {2, 3, 4});
  auto a = good;
  a.inp = inp3.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue,
               "sort_chunks_by_idx: inp must have rank 2, got rank 3 with shape [2,3,4]");
  TestTensor order3 = index_tensor(DType::kInt64, {1, 0, 2}, Device::cpu());
  a = good;
  a.sorted_index = order3.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue,
               "split_sizes and sorted_index must have the same number of elements, got 2 and 3");
  TestTensor probs5(DType::kFloat32, {5}), pout(DType::kFloat32, {6}), probs6(DType::kFloat32, {6});
  a = good;
  a.probs = probs5.view();
  a.probs_out = pout.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue,
               "probs must have shape [6] ([N], N = rows of inp), got [5]");
  a = good;
  a.probs = probs6.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "probs_out is required but was not given");
  TestTensor fsizes(DType::kFloat32, {2});
  a = good;
  a.split_sizes = fsizes.view();
  expect_error([&] { fwd(a); }, ErrorKind::kType,
               "split_sizes must have dtype in {int32, int64}, got float32");
  TestTensor map64(DType::kInt64, {6});
  a = good;
  a.row_id_map = map64.view();
  expect_error([&] { fwd(a); }, ErrorKind::kType, "row_id_map must have dtype in {int32}, got int64");
  TestTensor out16(DType::kFloat16, {6, 4});
  a = good;
  a.out = out16.view();
  expect_error([&] { fwd(a); }, ErrorKind::kType, "out must have the dtype of inp (float32), got float16");
  // Devices differ: a tensor that claims to be on cuda:0 in a CPU call.
  a = good;
  a.split_sizes = TensorView(sizes.data(), DType::kInt64, Device::cuda(0), {2});
  expect_error([&] { fwd(a); }, ErrorKind::kValue,
               "split_sizes must be on cpu (the call's device), got cuda:0");
  expect_error([&] { fwd(good, Context::cuda(0)); }, ErrorKind::kValue,
               "inp must be on cuda:0 (the call's device), got cpu");
  TensorView inp_cols = inp.strided_view({6, 2}, {4, 2});
  TestTensor out62(DType::kFloat32, {6, 2});
  a = good;
  a.inp = inp_cols;
  a.out = out62.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "inp must have a contiguous last dimension (stride 1)");

  // Contents of split_sizes and sorted_index (checked on the CPU with or without debug checks).
  Context vctx = Context::cpu();
  vctx.validate = true;
  EXPECT_NO_THROW(fwd(good, vctx));
  TestTensor neg = index_tensor(DType::kInt64, {-1, 4}, Device::cpu());
  a = good;
  a.split_sizes = neg.view();
  expect_error([&] { fwd(a, vctx); }, ErrorKind::kValue, "split_sizes must be >= 0, got split_sizes[0] = -1");
  TestTensor big = index_tensor(DType::kInt32, {4, 3}, Device::cpu());
  a = good;
  a.split_sizes = big.view();
  expect_error([&] { fwd(a, vctx); }, ErrorKind::kValue,
               "the sum of split_sizes (7) must not exceed the number of rows of inp (6)");
  TestTensor dup = index_tensor(DType::kInt64, {1, 1}, Device::cpu());
  a = good;
  a.sorted_index = dup.view();
  expect_error([&] { fwd(a, vctx); }, ErrorKind::kValue, "sorted_index must be a permutation of 0..1, got 1 twice");
  TestTensor oob = index_tensor(DType::kInt64, {0, 2}, Device::cpu());
  a = good;
  a.sorted_index = oob.view();
  expect_error([&] { fwd(a, vctx); }, ErrorKind::kValue,
               "sorted_index must be a permutation of 0..1, got sorted_index[1] = 2");
  expect_error([&] { fwd(a); }, ErrorKind::kValue,
               "sorted_index must be a permutation of 0..1, got sorted_index[1] = 2");

  // Backward and helpers.
  TestTensor din(DType::kFloat32, {6, 4});
  TestTensor badmap = index_tensor(DType::kInt32, {0, 1, 2, 3, 4, 4}, Device::cpu());
  expect_error([&] { sort_chunks_by_idx_bwd(vctx, {out.view(), TensorView(), badmap.view(), din.view(), TensorView()}); },
               ErrorKind::kValue, "row_id_map must be a permutation of 0..5, got 4 twice");
  TestTensor map5(DType::kInt32, {5});
  expect_error([&] { sort_chunks_by_idx_bwd(ctx, {out.view(), TensorView(), map5.view(), din.view(), TensorView()}); },
               ErrorKind::kValue, "row_id_map must have shape [6] ([N], N = rows of d_out), got [5]");
  expect_error([&] { make_chunk_sort_map(ctx, {sizes.view(), order3.view(), map.view(), TensorView()}); },
               ErrorKind::kValue, "make_chunk_sort_map: split_sizes and sorted_index must have the same number");
  expect_error([&] { sort_chunks_by_map(vctx, {inp.view(), badmap.view(), TensorView(), out.view(), TensorView(), true, TensorView()}); },
               ErrorKind::kValue, "sort_chunks_by_map: row_id_map must be a permutation of 0..5");
}

TEST(SortChunksByIdx, CudaNeedsTheWorkspace) {
  bool any = false;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    if (b.device.kind != DeviceKind::kCUDA) continue;
    any = true;
    TestTensor inp(DType::kFloat32, {6, 4}, b.device), out(DType::kFloat32, {6, 4}, b.device);
    TestTensor map(DType::kInt32, {6}, b.device);
    TestTensor sizes = index_tensor(DType::kInt64, {2, 4}, b.device);
    TestTensor order = index_tensor(DType::kInt64, {1, 0}, b.device);
    TestTensor small(DType::kUInt8, {8}, b.device);
    expect_error([&] { sort_chunks_by_idx_fwd(b.ctx(), {inp.view(), sizes.view(), order.view(), TensorView(),
                                                         out.view(), TensorView(), map.view(), TensorView()}); },
                 ErrorKind::kValue, "workspace is required but was not given");
    expect_error([&] { sort_chunks_by_idx_fwd(b.ctx(), {inp.view(), sizes.view(), order.view(), TensorView(),
                                                         out.view(), TensorView(), map.view(), small.view()}); },
                 ErrorKind::kValue, "workspace must hold at least 48 bytes (sort_chunks_by_idx_workspace_size), got 8");
    // Debug checks read the device indices (a synchronizing copy).
    Context v = b.ctx();
    v.validate = true;
    TestTensor ws = workspace_for(2, b.device);
    TestTensor dup = index_tensor(DType::kInt64, {0, 0}, b.device);
    expect_error([&] { sort_chunks_by_idx_fwd(v, {inp.view(), sizes.view(), dup.view(), TensorView(),
                                                   out.view(), TensorView(), map.view(), ws.view()}); },
                 ErrorKind::kValue, "sorted_index must be a permutation of 0..1, got 0 twice");
  }
  if (!any) GTEST_SKIP() << "no CUDA backend can run here";
}

}  // namespace
}  // namespace fusedops::testing
