// The CPU's copy ceilings: memcpy against src/cpu/stream_copy.h's streaming-store copy of the same
// 256 MiB on all OpenMP threads, the caches flushed (1 GiB written) before each of 7 runs; the
// median, read + write bytes counted (as the report's copy bandwidth counts them). A row
// permutation (sort_chunks_by_idx) reads and writes every byte once, so the streaming copy's rate
// is its practical ceiling. Build and run from the repository root:
//   g++ -std=c++20 -O3 -march=native -fopenmp -I. bench/stream_copy_bench.cpp -o /tmp/copy_bench
//   /tmp/copy_bench > bench/results/cpu/studies/stream_copy-<date>.txt
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "src/cpu/stream_copy.h"

int main() {
  const size_t n = size_t(256) << 20;
  std::vector<char> src(n, 1), dst(n, 2), flush(size_t(1) << 30, 3);
  auto rate = [&](bool streaming) {
    std::vector<double> t;
    for (int r = 0; r < 7; ++r) {
      std::memset(flush.data(), r, flush.size());
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
      {
        const size_t per = n / omp_get_num_threads(), off = per * omp_get_thread_num();
        if (streaming) {
          fusedops::cpu::stream_copy(dst.data() + off, src.data() + off, per);
          fusedops::cpu::stream_fence();
        } else {
          std::memcpy(dst.data() + off, src.data() + off, per);
        }
      }
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return 2.0 * n / t[t.size() / 2] / 1e9;
  };
  const double plain = rate(false), streaming = rate(true);
  std::printf("threads %d: memcpy %.2f GB/s, streaming-store copy %.2f GB/s (%.0f%% of memcpy)\n",
              omp_get_max_threads(), plain, streaming, 100.0 * streaming / plain);
}
