// CPU threading: a parallel_for over an index range on OpenMP threads (serial without OpenMP).
#pragma once

#include <algorithm>
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
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int64_t per = (n + threads - 1) / threads;
    const int64_t b = begin + t * per;
    const int64_t e = std::min(end, b + per);
    if (b < e) fn(b, e);
  }
#else
  fn(begin, end);
#endif
}

}  // namespace fusedops::cpu
