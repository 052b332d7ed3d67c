// The CPU's copy ceilings: memcpy, a plain streaming-store loop, and src/cpu/stream_copy.h's
// streaming-store copy (which also prefetches the source into L2) of the same 256 MiB on all
// OpenMP threads, the caches flushed (1 GiB written) before each of 7 runs; the median, read +
// write bytes counted (as the report's copy bandwidth counts them). A row permutation
// (sort_chunks_by_idx) reads and writes every byte once, so the streaming copy's rate is its
// practical ceiling. Then the same copies of 64 MiB into fresh pages (mapped for each run, as a
// large output fresh from the allocator is): memcpy, stream_copy, and stream_copy after
// prefault_for_write on each thread's part (the path sort_chunks_by_idx takes for such outputs).
// Build and run from the repository root:
//   g++ -std=c++20 -O3 -march=native -fopenmp -I. bench/stream_copy_bench.cpp -o /tmp/copy_bench
//   /tmp/copy_bench > bench/results/cpu/studies/stream_copy-<date>.txt
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "src/cpu/stream_copy.h"

namespace {
// Streaming stores without the prefetch (stream_copy before it had one), for the comparison.
void plain_stream(char* d, const char* s, size_t n) {
  const size_t body = n & ~size_t{63};
  for (size_t i = 0; i < body; i += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + i));
  std::memcpy(d + body, s + body, n - body);
}
// This thread's part of n bytes: parts start on a 64-byte line (the plain loop's streaming
// stores need it) and the last thread takes the remainder.
struct Part {
  size_t off, bytes;
};
Part part_of(size_t n) {
  const size_t threads = omp_get_num_threads(), t = omp_get_thread_num();
  const size_t per = n / threads & ~size_t{63}, off = per * t;
  return {off, t + 1 == threads ? n - off : per};
}
}  // namespace

int main() {
  const size_t n = size_t(256) << 20;
  // Line-aligned buffers (the plain loop's stores need it; stream_copy aligns itself).
  std::unique_ptr<char, decltype(&std::free)> src(static_cast<char*>(std::aligned_alloc(4096, n)), &std::free),
      dst(static_cast<char*>(std::aligned_alloc(4096, n)), &std::free);
  std::memset(src.get(), 1, n);
  std::memset(dst.get(), 2, n);
  std::vector<char> flush(size_t(1) << 30, 3);
  enum Mode { kMemcpy, kPlainStream, kStreamCopy };
  auto rate = [&](Mode mode) {
    std::vector<double> t;
    for (int r = 0; r < 7; ++r) {
      std::memset(flush.data(), r, flush.size());
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
      {
        const Part part = part_of(n);
        const size_t per = part.bytes, off = part.off;
        char* d = dst.get() + off;
        const char* s = src.get() + off;
        if (mode == kMemcpy) {
          std::memcpy(d, s, per);
        } else {
          if (mode == kPlainStream) plain_stream(d, s, per);
          else fusedops::cpu::stream_copy(d, s, per);
          fusedops::cpu::stream_fence();
        }
      }
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return 2.0 * n / t[t.size() / 2] / 1e9;
  };
  const double plain = rate(kMemcpy), streaming = rate(kPlainStream), copy = rate(kStreamCopy);
  std::printf("threads %d: memcpy %.2f GB/s, streaming stores without prefetch %.2f GB/s (%.0f%% of memcpy), "
              "stream_copy (streaming stores, L2 prefetch %zu B ahead) %.2f GB/s (%.0f%% of memcpy)\n",
              omp_get_max_threads(), plain, streaming, 100.0 * streaming / plain, fusedops::cpu::kStreamPrefetchBytes,
              copy, 100.0 * copy / plain);

  // Fresh pages: a new anonymous mapping per run, the time including its faults (or prefault).
  const size_t m = size_t(64) << 20;
  auto fresh = [&](int how) {  // 0 memcpy, 1 stream_copy, 2 prefault + stream_copy
    std::vector<double> t;
    for (int r = 0; r < 9; ++r) {
      std::memset(flush.data(), r, flush.size());
      const auto t0 = std::chrono::steady_clock::now();
      void* map = mmap(nullptr, m, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (map == MAP_FAILED) return 0.0;
      char* out = static_cast<char*>(map);
#pragma omp parallel
      {
        const Part part = part_of(m);
        const size_t per = part.bytes, off = part.off;
        if (how == 0) {
          std::memcpy(out + off, src.get() + off, per);
        } else {
          if (how == 2) fusedops::cpu::prefault_for_write(out + off, per);
          fusedops::cpu::stream_copy(out + off, src.get() + off, per);
          fusedops::cpu::stream_fence();
        }
      }
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      munmap(map, m);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2] * 1e3;
  };
  const double f0 = fresh(0), f1 = fresh(1), f2 = fresh(2);
  std::printf("64 MiB into fresh pages: memcpy %.2f ms, stream_copy %.2f ms, prefault_for_write + stream_copy %.2f ms\n",
              f0, f1, f2);
}
