// The AMX bf16 product of src/cpu/amx.h against oneDNN's (src/cpu/gemm.h, bgemm) on one thread, at
// chunk_loss's no-gradient logits blocks (vocabulary rows x the chunk's rows, K = the hidden size)
// and a longer K. Prints one line per shape: the pack of the chunk's rows, the AMX product
// (vocabulary-major Ct = W H^T) and oneDNN's H W^T, median of repeated calls over >= 0.3 s, warm.
// Build and run from the repository root after a build of build/dev (libfusedops.a) in the
// environment tools/setup.sh makes (oneDNN under the interpreter's prefix):
//   P=$(python -c 'import sys;print(sys.prefix)')
//   g++ -O2 -std=c++20 -march=native -fopenmp -I. -Iinclude -I$P/include bench/gemm/amx_gemm_bench.cpp \
//     build/dev/libfusedops.a -L$P/lib -ldnnl -Wl,-rpath,$P/lib -o /tmp/amx_gemm_bench && /tmp/amx_gemm_bench
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "src/cpu/amx.h"
#include "src/cpu/gemm.h"

using namespace fusedops;

template <class F>
double median_us(F&& f) {
  f();
  std::vector<double> t;
  const auto start = std::chrono::steady_clock::now();
  while (t.size() < 5 || std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 0.3) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() * 1e6);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  if (!cpu::amx::available()) {
    std::printf("this CPU (or OS) has no AMX\n");
    return 1;
  }
  omp_set_num_threads(1);
  std::printf("one thread; N = vocabulary rows, M = the chunk's rows, K = hidden\n");
  std::printf("%6s %5s %5s | %8s | %10s %8s | %10s %8s | %6s\n", "N", "M", "K", "pack us", "amx us",
              "GFLOP/s", "onednn us", "GFLOP/s", "ratio");
  const int64_t shapes[][3] = {{512, 128, 128},  {1024, 128, 128},  {1024, 256, 128},
                               {8000, 128, 128}, {1024, 256, 256},  {1024, 256, 512},
                               {1024, 256, 1024}, {1024, 256, 2048}, {1024, 256, 4096}};
  for (const auto& s : shapes) {
    const int64_t N = s[0], M = s[1], K = s[2];
    std::mt19937 gen(1);
    std::normal_distribution<float> dist;
    std::vector<bf16_t> A(M * K), B(N * K);
    for (auto& v : A) v = float_to_bf16(dist(gen));
    for (auto& v : B) v = float_to_bf16(dist(gen));
    std::vector<bf16_t> Ap(cpu::amx::padded_rows(M) * cpu::amx::padded_k(K));
    std::vector<float> C(cpu::amx::padded_rows(M) * N);
    const double pack = median_us([&] { cpu::amx::pack_pairs(A.data(), K, M, K, Ap.data()); });
    const double amx = median_us([&] {
      cpu::amx::gemm_bat(B.data(), K, N, Ap.data(), M, K, C.data(), cpu::amx::padded_rows(M));
    });
    const double dnnl = median_us([&] {
      cpu::bgemm(false, true, M, N, K, A.data(), K, B.data(), K, false, C.data(), N);
    });
    const double flop = 2.0 * M * N * K;
    std::printf("%6ld %5ld %5ld | %8.1f | %10.1f %8.0f | %10.1f %8.0f | %6.2f\n", static_cast<long>(N),
                static_cast<long>(M), static_cast<long>(K), pack, amx, flop / amx * 1e-3, dnnl,
                flop / dnnl * 1e-3, dnnl / amx);
  }
  return 0;
}
