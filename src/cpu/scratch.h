// Per-thread scratch buffers kept between calls, shared by the CPU backends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fusedops::cpu {

// An arena of buffers: buffer i keeps its largest size, so repeated calls neither allocate nor
// page-fault it again (a std::vector zero-fills only when it grows). Callers overwrite what they
// read.
template <class T>
class Scratch {
 public:
  T* get(size_t i, int64_t n) {
    if (bufs_.size() <= i) bufs_.resize(i + 1);
    if (static_cast<int64_t>(bufs_[i].size()) < n) bufs_[i].resize(static_cast<size_t>(n));
    return bufs_[i].data();
  }

 private:
  std::vector<std::vector<T>> bufs_;
};

// The calling thread's arena of one client, named by Tag (clients never share a buffer), kept
// across calls; OpenMP's worker threads persist, so a parallel region's threads find theirs again.
template <class Tag, class T>
Scratch<T>& thread_scratch() {
  thread_local Scratch<T> s;
  return s;
}

}  // namespace fusedops::cpu
