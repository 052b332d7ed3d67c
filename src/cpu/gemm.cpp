#include "src/cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "fusedops/core/error.h"
#include "src/cpu/parallel.h"
#include "src/cpu/scratch.h"

namespace fusedops::cpu {
namespace {

constexpr const char* kOp = "cpu gemm";

// What a primitive is made for. oneDNN splits the work for the thread count it sees when the
// primitive is created, so that count is part of the key. out_bf16: C in bf16 (else fp32);
// ld_addend > 0: an fp32 [M, N] operand added before C is written.
struct Key {
  bool bf16, ta, tb, accumulate, out_bf16;
  int threads;
  int64_t M, N, K, lda, ldb, ldc, ld_addend;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = (size_t{k.bf16} << 4) | (size_t{k.ta} << 3) | (size_t{k.tb} << 2) |
               (size_t{k.accumulate} << 1) | size_t{k.out_bf16};
    for (int64_t v : {int64_t{k.threads}, k.M, k.N, k.K, k.lda, k.ldb, k.ldc, k.ld_addend})
      h = h * 0x9E3779B97F4A7C15ull + std::hash<int64_t>{}(v);
    return h;
  }
};

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, addend, scratch;
  std::string impl;
  // bf16 without an optimised kernel on this CPU (below AVX-512 oneDNN has none, or only its
  // reference loops): the bf16 entry points widen the operands instead.
  bool unavailable = false;
};

// The engine and the primitives made so far (the cache is destroyed before the engine).
struct State {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> cache;
};

State& state() {
  static State s;
  return s;
}

// A bound on the shapes kept: a caller sweeping many shapes starts over rather than growing.
constexpr size_t kMaxPrimitives = 512;

std::shared_ptr<const Entry> primitive_for(const Key& k) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  if (auto it = st.cache.find(k); it != st.cache.end()) return it->second;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dt in = k.bf16 ? dt::bf16 : dt::f32;
  auto e = std::make_shared<Entry>();
  // Element (i, k) of op(A) sits at i*lda + k, or at k*lda + i when transposed; likewise B, C.
  e->a = dnnl::memory::desc(dims{k.M, k.K}, in, k.ta ? dims{1, k.lda} : dims{k.lda, 1});
  e->b = dnnl::memory::desc(dims{k.K, k.N}, in, k.tb ? dims{1, k.ldb} : dims{k.ldb, 1});
  e->c = dnnl::memory::desc(dims{k.M, k.N}, k.out_bf16 ? dt::bf16 : dt::f32, dims{k.ldc, 1});
  try {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    attr.set_fpmath_mode(dnnl::fpmath_mode::strict);  // fp32 stays fp32 (whatever the environment)
    dnnl::post_ops po;
    if (k.accumulate) po.append_sum(1.0f);
    if (k.ld_addend > 0) {
      e->addend = dnnl::memory::desc(dims{k.M, k.N}, dt::f32, dims{k.ld_addend, 1});
      po.append_binary(dnnl::algorithm::binary_add, e->addend);
    }
    attr.set_post_ops(po);
    const dnnl::matmul::primitive_desc pd(st.engine, e->a, e->b, e->c, attr);
    e->impl = pd.impl_info_str();
    // (fp32 always has a kernel on x86-64: oneDNN's JIT GEMMs start at SSE4.1.)
    e->unavailable = k.bf16 && e->impl.rfind("ref", 0) == 0;
    e->scratch = pd.scratchpad_desc();
    if (!e->unavailable) e->prim = dnnl::matmul(pd);
  } catch (const dnnl::error& err) {
    if (!k.bf16)
      FUSEDOPS_FAIL(kRuntime, kOp, "oneDNN could not make an fp32 matmul of [", k.M, ", ", k.K,
                    "] x [", k.K, ", ", k.N, "]: ", err.what());
    e->impl = "none";
    e->unavailable = true;
  }
  if (st.cache.size() >= kMaxPrimitives) st.cache.clear();
  st.cache.emplace(k, e);
  return e;
}

struct GemmScratch {};

void run(const Entry& e, const void* A, const void* B, void* C, const float* addend = nullptr) {
  const dnnl::engine& eng = state().engine;
  thread_local dnnl::stream stream(eng);
  const size_t bytes = e.scratch.get_size();
  uint8_t* sp = thread_scratch<GemmScratch, uint8_t>().get(
      0, static_cast<int64_t>(std::max<size_t>(bytes, 1)));
  try {
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(e.a, eng, const_cast<void*>(A))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(e.b, eng, const_cast<void*>(B))},
        {DNNL_ARG_DST, dnnl::memory(e.c, eng, C)},
        {DNNL_ARG_SCRATCHPAD, dnnl::memory(e.scratch, eng, sp)}};
    // The binary add is the only post-op when there is an addend (bgemm_to_bf16 never sums).
    if (addend)
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                   dnnl::memory(e.addend, eng, const_cast<float*>(addend)));
    e.prim.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& err) {
    FUSEDOPS_FAIL(kRuntime, kOp, "oneDNN matmul (", e.impl, ") failed: ", err.what());
  }
}

Key key_of(bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
           bool acc, int64_t ldc, bool out_bf16 = false, int64_t ld_addend = 0) {
  // A product called from inside a parallel region runs on the calling thread alone.
  return Key{bf16, ta, tb, acc, out_bf16, in_parallel() ? 1 : max_threads(), M, N, K, lda, ldb, ldc,
             ld_addend};
}

// K == 0: the product is zero.
void empty_product(int64_t M, int64_t N, bool accumulate, float* C, int64_t ldc) {
  if (accumulate) return;
  for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
}

// Where oneDNN has no bf16 kernel: the operands widened to fp32 (exact; the calling thread's
// buffers), then sgemm.
void bgemm_widened(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16_t* A, int64_t lda,
                   const bf16_t* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  struct Widened {};
  const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  float* a = thread_scratch<Widened, float>().get(0, ar * ac);
  float* b = thread_scratch<Widened, float>().get(1, br * bc);
  for (int64_t r = 0; r < ar; ++r)
    for (int64_t c = 0; c < ac; ++c) a[r * ac + c] = to_float(A[r * lda + c]);
  for (int64_t r = 0; r < br; ++r)
    for (int64_t c = 0; c < bc; ++c) b[r * bc + c] = to_float(B[r * ldb + c]);
  sgemm(ta, tb, M, N, K, a, ac, b, bc, accumulate, C, ldc);
}

}  // namespace

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
           const float* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return empty_product(M, N, accumulate, C, ldc);
  run(*primitive_for(key_of(false, ta, tb, M, N, K, lda, ldb, accumulate, ldc)), A, B, C);
}

void bgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16_t* A, int64_t lda,
           const bf16_t* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return empty_product(M, N, accumulate, C, ldc);
  const auto e = primitive_for(key_of(true, ta, tb, M, N, K, lda, ldb, accumulate, ldc));
  if (!e->unavailable) return run(*e, A, B, C);
  bgemm_widened(ta, tb, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}

void bgemm_to_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16_t* A, int64_t lda,
                   const bf16_t* B, int64_t ldb, const float* addend, int64_t ld_addend, bf16_t* C,
                   int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K > 0) {
    const auto e = primitive_for(
        key_of(true, ta, tb, M, N, K, lda, ldb, false, ldc, true, addend ? ld_addend : 0));
    if (!e->unavailable) return run(*e, A, B, C, addend);
  }
  // K == 0, or no bf16 kernel: the fp32 sums in the calling thread's buffer, the addend, one
  // rounding.
  struct Rounded {};
  float* c32 = thread_scratch<Rounded, float>().get(0, M * N);
  if (K > 0)
    bgemm_widened(ta, tb, M, N, K, A, lda, B, ldb, false, c32, N);
  else
    std::fill(c32, c32 + M * N, 0.0f);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      C[i * ldc + j] = float_to_bf16(c32[i * N + j] + (addend ? addend[i * ld_addend + j] : 0.0f));
}

std::string gemm_impl(bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                      int64_t ldb, bool accumulate, int64_t ldc) {
  return primitive_for(key_of(bf16, ta, tb, M, N, K, lda, ldb, accumulate, ldc))->impl;
}

}  // namespace fusedops::cpu
