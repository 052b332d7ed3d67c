// The CPU's arithmetic peak for the GEMM study: how many vdpbf16ps (bf16 pairs into fp32, 64 flops
// per 512-bit instruction) and vfmadd231ps (fp32, 32 flops) one core and all cores issue per
// second, from independent accumulator chains (enough of them to cover the latency). A product's
// GFLOP/s over this peak is its efficiency; a time below FLOPs / peak is out of reach for any
// kernel. Build and run (bench/gemm/README.md):
//
//   g++ -std=c++20 -O2 -march=native -fopenmp bench/gemm/peak_bench.cpp -o build/peak_bench
//   build/peak_bench [seconds per measurement, default 0.5]
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#ifdef __AVX512F__
namespace {

constexpr int kChains = 24;  // independent accumulators (latency x throughput is about 12 here)

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Instructions per second of one thread over `seconds`; `sink` keeps the results alive.
template <bool kBf16>
double issue_rate(double seconds, float* sink) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1e-3f * static_cast<float>(i + 1));
  // Small operands: the sums stay finite over billions of steps.
  const __m512 a = _mm512_set1_ps(1e-20f), b = _mm512_set1_ps(1e-20f);
#ifdef __AVX512BF16__
  const __m512bh abf = _mm512_cvtne2ps_pbh(a, a), bbf = _mm512_cvtne2ps_pbh(b, b);
#endif
  constexpr long kInner = 1 << 16;
  long steps = 0;
  const double t0 = now();
  double t = t0;
  while (t - t0 < seconds) {
    for (long it = 0; it < kInner; ++it) {
#pragma GCC unroll 24
      for (int i = 0; i < kChains; ++i) {
        if constexpr (kBf16) {
#ifdef __AVX512BF16__
          acc[i] = _mm512_dpbf16_ps(acc[i], abf, bbf);
#endif
        } else {
          acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
        }
      }
    }
    steps += kInner;
    t = now();
  }
  float s = 0.0f;
  for (int i = 0; i < kChains; ++i) s += _mm512_reduce_add_ps(acc[i]);
  *sink += s;
  return static_cast<double>(steps) * kChains / (t - t0);
}

template <bool kBf16>
void report(const char* name, int flops_per_instr, double seconds) {
  float sink = 0.0f;
  const double one = issue_rate<kBf16>(seconds, &sink);
  const int threads = omp_get_max_threads();
  double all = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : all)
  {
    float s = 0.0f;
    all += issue_rate<kBf16>(seconds, &s);
#pragma omp atomic
    sink += s;
  }
  std::printf("%-12s 1 thread: %6.2f G instr/s = %6.1f GFLOP/s | %d threads: %6.2f G instr/s = %6.1f GFLOP/s  (%g)\n",
              name, one / 1e9, one * flops_per_instr / 1e9, threads, all / 1e9, all * flops_per_instr / 1e9,
              static_cast<double>(sink));
}

}  // namespace
#endif

int main(int argc, char** argv) {
#ifndef __AVX512F__
  (void)argc, (void)argv;
  std::printf("not measured: built without AVX-512 (this benchmark times 512-bit instructions)\n");
#else
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
  report<false>("fp32 fma", 32, seconds);
#ifdef __AVX512BF16__
  report<true>("bf16 dpbf16", 64, seconds);
#else
  std::printf("bf16 dpbf16  not measured: built without AVX512-BF16 (-march of a CPU that has it)\n");
#endif
#endif
  return 0;
}
