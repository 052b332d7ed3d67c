// The CPU GEMM study (bench/gemm/gemm_study.py builds and runs this; see bench/gemm/README.md):
// times each candidate GEMM at the products chunk_loss and matmul_add make in the CPU report, in
// their layouts, on the OpenMP thread count given, and prints one JSON object.
//
//   gemm_bench --threads T [--min-reps R] [--min-seconds S] [--candidates a,b,...]
//
// Candidates:
//   onednn     fusedops::cpu::sgemm / bgemm as built from this tree (oneDNN matmul, cached
//              primitives); "cold" includes creating the primitive (the JIT).
//   handwritten the AVX-512 / AVX512-BF16 kernels that src/cpu/gemm.cpp had before oneDNN
//              (commit LEGACY_COMMIT, compiled from git history by gemm_study.py into the
//              namespace fusedops_legacy).
//   openblas   cblas_sgemm of the system OpenBLAS (fp32 only; its own thread pool set to T).
// Every timed call starts from the same C (beta = 1 products accumulate into a copy restored
// before each call, untimed). Per candidate and product: the first call ("cold") and then at
// least R calls and S seconds: minimum and median.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "src/cpu/gemm.h"

#ifdef GEMM_BENCH_OPENBLAS
#include <cblas.h>
#endif

namespace fusedops_legacy {
struct bf16_t {  // the legacy tree's src/core/half.h type, renamed with its namespace
  uint16_t bits;
};
namespace cpu {
// The pre-oneDNN kernels' entry points (alpha/beta interface).
void sgemm_avx512(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                  int64_t, float, float*, int64_t);
void bgemm(bool, bool, int64_t, int64_t, int64_t, float, const bf16_t*, int64_t, const bf16_t*,
           int64_t, float, float*, int64_t);
}  // namespace cpu
}  // namespace fusedops_legacy

namespace {

struct Product {
  const char* name;  // op.product
  const char* form;  // the op's formula, for the table
  bool bf16, ta, tb, accumulate;
  int64_t M, N, K;
};

// chunk_loss in the CPU report: fp32 N=512, H=256, V=32000 (the default 32 MiB budget gives two
// chunks of C=256 rows); bf16 N=128, H=128, V=8000 (one chunk of 128). Per chunk:
// logits Z = H_c W^T, dH_c = G W, dW (+)= G^T H_c. matmul_add: main_grad[O,I] += g[T,O]^T x[T,I].
const Product kProducts[] = {
    {"chunk_loss.logits", "Z = H_c W^T", false, false, true, false, 256, 32000, 256},
    {"chunk_loss.dH", "dH_c = G W", false, false, false, false, 256, 256, 32000},
    {"chunk_loss.dW", "dW += G^T H_c", false, true, false, true, 32000, 256, 256},
    {"chunk_loss.logits", "Z = H_c W^T", true, false, true, false, 128, 8000, 128},
    {"chunk_loss.dH", "dH_c = G W", true, false, false, false, 128, 128, 8000},
    {"chunk_loss.dW", "dW = G^T H_c", true, true, false, false, 8000, 128, 128},
    {"matmul_add", "C += g^T x", false, true, false, true, 512, 512, 512},
    {"matmul_add", "C += g^T x", true, true, false, true, 512, 512, 512},
};

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

using Call = std::function<void()>;

struct Operands {
  std::vector<float> a, b, c, c0;
  std::vector<uint16_t> ab, bb;
  int64_t lda, ldb, ldc;
};

Operands make(const Product& p) {
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  Operands o;
  const int64_t ar = p.ta ? p.K : p.M, ac = p.ta ? p.M : p.K, br = p.tb ? p.N : p.K,
                bc = p.tb ? p.K : p.N;
  o.lda = ac;
  o.ldb = bc;
  o.ldc = p.N;
  o.a.resize(ar * ac);
  o.b.resize(br * bc);
  o.c0.resize(p.M * p.N);
  for (auto& v : o.a) v = dist(gen);
  for (auto& v : o.b) v = dist(gen);
  for (auto& v : o.c0) v = dist(gen);
  o.c = o.c0;
  if (p.bf16) {
    o.ab.resize(o.a.size());
    o.bb.resize(o.b.size());
    std::transform(o.a.begin(), o.a.end(), o.ab.begin(), to_bf16);
    std::transform(o.b.begin(), o.b.end(), o.bb.begin(), to_bf16);
  }
  return o;
}

Call candidate(const std::string& name, const Product& p, Operands& o) {
  float beta = p.accumulate ? 1.0f : 0.0f;
  if (name == "onednn") {
    if (p.bf16)
      return [&p, &o] {
        fusedops::cpu::bgemm(p.ta, p.tb, p.M, p.N, p.K,
                             reinterpret_cast<const fusedops::bf16_t*>(o.ab.data()), o.lda,
                             reinterpret_cast<const fusedops::bf16_t*>(o.bb.data()), o.ldb,
                             p.accumulate, o.c.data(), o.ldc);
      };
    return [&p, &o] {
      fusedops::cpu::sgemm(p.ta, p.tb, p.M, p.N, p.K, o.a.data(), o.lda, o.b.data(), o.ldb,
                           p.accumulate, o.c.data(), o.ldc);
    };
  }
#ifdef GEMM_BENCH_LEGACY
  if (name == "handwritten") {
    if (p.bf16)
      return [&p, &o, beta] {
        fusedops_legacy::cpu::bgemm(p.ta, p.tb, p.M, p.N, p.K, 1.0f,
                                    reinterpret_cast<const fusedops_legacy::bf16_t*>(o.ab.data()),
                                    o.lda,
                                    reinterpret_cast<const fusedops_legacy::bf16_t*>(o.bb.data()),
                                    o.ldb, beta, o.c.data(), o.ldc);
      };
    return [&p, &o, beta] {
      fusedops_legacy::cpu::sgemm_avx512(p.ta, p.tb, p.M, p.N, p.K, 1.0f, o.a.data(), o.lda,
                                         o.b.data(), o.ldb, beta, o.c.data(), o.ldc);
    };
  }
#endif
#ifdef GEMM_BENCH_OPENBLAS
  if (name == "openblas" && !p.bf16)
    return [&p, &o, beta] {
      cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans,
                  p.M, p.N, p.K, 1.0f, o.a.data(), o.lda, o.b.data(), o.ldb, beta, o.c.data(),
                  o.ldc);
    };
#endif
  (void)beta;
  return nullptr;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of the calling thread: with one thread, a call's own work without the time other
// processes held the core (the machine this ran on was shared; preemption still costs caches).
double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, min_reps = 30;
  double min_seconds = 1.0;
  std::string cands = "onednn,handwritten,openblas";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (k == "--min-reps")
      min_reps = std::atoi(argv[i + 1]);
    else if (k == "--min-seconds")
      min_seconds = std::atof(argv[i + 1]);
    else if (k == "--candidates")
      cands = argv[i + 1];
  }
  omp_set_num_threads(threads);
#ifdef GEMM_BENCH_OPENBLAS
  openblas_set_num_threads(threads);
#endif
  std::vector<std::string> names;
  for (size_t s = 0; s <= cands.size();) {
    const size_t e = std::min(cands.find(',', s), cands.size());
    if (e > s) names.push_back(cands.substr(s, e - s));
    s = e + 1;
  }
  std::printf("{\"threads\": %d, \"results\": [", threads);
  bool first = true;
  for (const std::string& name : names) {
    for (const Product& p : kProducts) {
      Operands o = make(p);
      Call call = candidate(name, p, o);
      if (!call) continue;
      std::vector<double> times, cpu_times;
      double cold = 0, spent = 0;
      for (int rep = 0; rep < 1 + min_reps || spent < min_seconds; ++rep) {
        std::copy(o.c0.begin(), o.c0.end(), o.c.begin());
        const double c0 = thread_cpu_s(), t0 = now_s();
        call();
        const double t = now_s() - t0, c = thread_cpu_s() - c0;
        if (rep == 0) {
          cold = t;
        } else {
          times.push_back(t);
          cpu_times.push_back(c);
          spent += t;
        }
        if (rep > 100000) break;
      }
      // (after the timing: the onednn row's cold call is the one that created the primitive)
      std::string impl = name;
      if (name == "onednn")
        impl = fusedops::cpu::gemm_impl(p.bf16, p.ta, p.tb, p.M, p.N, p.K, o.lda, o.ldb,
                                        p.accumulate, o.ldc);
      std::sort(times.begin(), times.end());
      std::sort(cpu_times.begin(), cpu_times.end());
      const double med = times[times.size() / 2], mn = times.front();
      // Only meaningful with one thread (the other threads' work is not the calling thread's).
      const double cpu_med = threads == 1 ? cpu_times[cpu_times.size() / 2] : 0.0;
      const double gflop = 2.0 * p.M * p.N * p.K / 1e9;
      std::printf(
          "%s\n  {\"candidate\": \"%s\", \"product\": \"%s\", \"form\": \"%s\", \"dtype\": \"%s\", "
          "\"trans_a\": %s, \"trans_b\": %s, \"accumulate\": %s, \"M\": %lld, \"N\": %lld, \"K\": "
          "%lld, "
          "\"impl\": \"%s\", \"cold_ms\": %.4f, \"min_ms\": %.4f, \"median_ms\": %.4f, \"reps\": "
          "%zu, "
          "\"gflops_min\": %.1f, \"gflops_median\": %.1f, \"thread_cpu_median_ms\": %.4f}",
          first ? "" : ",", name.c_str(), p.name, p.form, p.bf16 ? "bfloat16" : "float32",
          p.ta ? "true" : "false", p.tb ? "true" : "false", p.accumulate ? "true" : "false",
          static_cast<long long>(p.M), static_cast<long long>(p.N), static_cast<long long>(p.K),
          impl.c_str(), cold * 1e3, mn * 1e3, med * 1e3, times.size(), gflop / mn, gflop / med,
          cpu_med * 1e3);
      first = false;
      std::fflush(stdout);
    }
  }
  std::printf("\n]}\n");
  return 0;
}
