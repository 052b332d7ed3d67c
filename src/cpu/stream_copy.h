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
// little); bench/stream_copy_bench.cpp measures it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FUSEDOPS_STREAM_STORES 1
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

// Orders this thread's streaming stores before its later stores (and the end of its task).
inline void stream_fence() {
#ifdef FUSEDOPS_STREAM_STORES
  _mm_sfence();
#endif
}

}  // namespace fusedops::cpu
