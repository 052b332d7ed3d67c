// Copies for outputs far larger than the last-level cache: with non-temporal (streaming) stores
// the destination's lines are not read before they are written (no read-for-ownership), so a
// copy moves 2 bytes per byte instead of 3. Small copies, or copies into outputs that fit in the
// cache (their reader may find them there), should use memcpy. A thread that used stream_copy
// calls stream_fence() before its writes are read by another thread (the end of its task).
//
// The source is prefetched into L2 (prefetcht1) kStreamPrefetchBytes ahead of the loads: the
// L2's miss queue holds more lines in flight than the L1's fill buffers, which bound a plain
// streaming loop. On the 2-core Xeon of bench/results/cpu this took a 256 MiB copy on both cores
// from ~36 to ~44 GB/s (distances of 4-32 KiB all within 1 GB/s of each other; 1 KiB gained
// little); bench/stream_copy_bench.cpp measures it (its runs:
// bench/results/cpu/studies/stream_copy-2026-12-05-prefetch.txt). On a 16-core Xeon (an H100
// machine's host) it was at or above the plain loop in 17 of 18 runs from 1 to 16 threads
// (bench/results/cpu/studies/stream_copy-2026-12-05-h100-host-threads.txt).
//
// Streaming stores into pages that are not mapped yet (a large output the allocator has just
// taken from the kernel) are slower than plain stores: every first store to a page faults, and
// the kernel's zeroing leaves the page's lines in the cache that the streaming store must then
// evict. On the same machine a 64 MiB copy into fresh pages on both cores took 20.7-21.5 ms with
// streaming stores and 15.7-17.6 ms with memcpy; mapping the pages first, one call per thread
// (prefault_for_write), and then streaming took 10.6-12.2 ms
// (bench/results/cpu/studies/stream_copy-2026-12-05-prefault.txt). So a caller with a large
// output calls prefault_stream_output on it before its streaming copies.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "src/cpu/parallel.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FUSEDOPS_STREAM_STORES 1
#endif

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (older headers lack the name)
#endif
#endif

namespace fusedops::cpu {

// Outputs at least this large take streaming stores (the last-level cache of the machines we
// measure is 32 MiB; half of it).
inline constexpr int64_t kStreamOutputBytes = int64_t{16} << 20;

// How far ahead of the loads the source is prefetched into L2.
inline constexpr size_t kStreamPrefetchBytes = 8192;

inline void stream_copy(void* dst, const void* src, size_t bytes) {
#ifdef FUSEDOPS_STREAM_STORES
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (bytes < 4096) {
    std::memcpy(d, s, bytes);
    return;
  }
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;  // to a 64-byte line
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const size_t body = bytes & ~size_t{63};
  // One 64-byte line from s + i to d + i (d + i is line-aligned).
  auto line = [&](size_t i) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + i));
#elif defined(__AVX__)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32)));
#else
    for (size_t k = 0; k < 64; k += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + k), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + k)));
#endif
  };
  // The prefetches stay inside the source: the last kStreamPrefetchBytes go without.
  const size_t ahead = body > kStreamPrefetchBytes ? body - kStreamPrefetchBytes : 0;
  size_t i = 0;
  for (; i < ahead; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(s + i + kStreamPrefetchBytes), _MM_HINT_T1);
    line(i);
  }
  for (; i < body; i += 64) line(i);
  std::memcpy(d + body, s + body, bytes - body);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Whether the page holding `p` is mapped in memory (Linux: mincore). Elsewhere, or when the
// kernel cannot tell, true: the caller then takes its usual path.
inline bool page_mapped(const void* p) {
#if defined(__linux__)
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  unsigned char vec = 0;
  if (mincore(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~(page - 1)), 1, &vec) != 0) return true;
  return (vec & 1) != 0;
#else
  (void)p;
  return true;
#endif
}

// Maps the whole pages of [p, p + bytes) for writing in one system call (Linux 5.14's
// MADV_POPULATE_WRITE) instead of a fault per page on first store. Only a hint: on older
// kernels, other systems or any failure nothing happens and the stores fault as usual. The
// contents of the range are not changed.
inline void prefault_for_write(void* p, size_t bytes) {
#if defined(__linux__)
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
  if (e > b) (void)madvise(reinterpret_cast<void*>(b), e - b, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)bytes;
#endif
}

// Before streaming into the output [dst, dst + bytes): when part of it is not mapped yet (a
// fresh allocation), the whole output is mapped for writing, each thread its part. Three pages
// are asked (a quarter, half and three quarters in): the first and last pages can be mapped by
// the allocator's headers of this block and the next one while the pages between are not. A
// mapped output costs three mincore calls.
inline void prefault_stream_output(void* dst, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(dst);
  if (bytes == 0 || (page_mapped(p + bytes / 4) && page_mapped(p + bytes / 2) && page_mapped(p + bytes / 4 * 3)))
    return;
  // Split on 4 KiB boundaries of the address (whole pages, no page left between two parts).
  const uintptr_t b0 = reinterpret_cast<uintptr_t>(dst), e0 = b0 + bytes;
  const int64_t units = static_cast<int64_t>(((e0 + 4095) >> 12) - (b0 >> 12));
  parallel_for(0, units, 256, [&](int64_t u0, int64_t u1) {  // 1 MiB per part at least
    const uintptr_t b = std::max(b0, ((b0 >> 12) + static_cast<uintptr_t>(u0)) << 12);
    const uintptr_t e = std::min(e0, ((b0 >> 12) + static_cast<uintptr_t>(u1)) << 12);
    prefault_for_write(reinterpret_cast<void*>(b), e - b);
  });
}

// Orders this thread's streaming stores before its later stores (and the end of its task).
inline void stream_fence() {
#ifdef FUSEDOPS_STREAM_STORES
  _mm_sfence();
#endif
}

}  // namespace fusedops::cpu
