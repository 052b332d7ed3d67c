// CPU threading: a parallel_for over an index range on OpenMP threads (serial without OpenMP).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace fusedops::cpu {

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Inside an OpenMP parallel region (a nested parallel region then runs on the calling thread).
inline bool in_parallel() {
#ifdef _OPENMP
  return omp_in_parallel() != 0;
#else
  return false;
#endif
}

// Calls fn(begin, end) on disjoint sub-ranges covering [begin, end), each of at least `grain`
// indices (except possibly the last), spread over the OpenMP threads. The split depends only on
// the range, grain and thread count, so results are reproducible for a fixed thread count; ops
// whose per-index results do not depend on the split are reproducible for any.
template <class Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, Fn&& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int threads = static_cast<int>(std::min<int64_t>(max_threads(), max_chunks));
  if (threads <= 1) {
    fn(begin, end);
    return;
  }
#ifdef _OPENMP
  // The split is fixed by `threads`; a smaller team (a call nested inside another parallel
  // region gets one thread) takes several parts each.
#pragma omp parallel num_threads(threads)
  {
    const int64_t per = (n + threads - 1) / threads;
    for (int t = omp_get_thread_num(); t < threads; t += omp_get_num_threads()) {
      const int64_t b = begin + t * per;
      const int64_t e = std::min(end, b + per);
      if (b < e) fn(b, e);
    }
  }
#else
  fn(begin, end);
#endif
}

// Calls fn(b, e) on consecutive blocks of at most `block` indices of [begin, end), handed to the
// OpenMP threads one at a time as each finishes its previous block (with one thread, or without
// OpenMP, one call on the whole range). Only for loops whose
// per-index results do not depend on which thread runs an index (each index writes its own
// outputs): the results are then the same for any schedule, while a thread slowed down by
// other work on the machine no longer holds the others at the end of a static split.
template <class Fn>
void parallel_for_dynamic(int64_t begin, int64_t end, int64_t block, Fn&& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  // block is an upper bound: short ranges get smaller blocks, about four per thread.
  const int64_t want = 4 * static_cast<int64_t>(max_threads());
  block = std::clamp<int64_t>((n + want - 1) / want, 1, std::max<int64_t>(block, 1));
  const int64_t nblocks = (n + block - 1) / block;
  const int threads = static_cast<int>(std::min<int64_t>(max_threads(), nblocks));
  if (threads <= 1) {
    fn(begin, end);
    return;
  }
#ifdef _OPENMP
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(threads)
  {
    for (int64_t i = next.fetch_add(1); i < nblocks; i = next.fetch_add(1))
      fn(begin + i * block, std::min(end, begin + (i + 1) * block));
  }
#else
  fn(begin, end);
#endif
}

}  // namespace fusedops::cpu
