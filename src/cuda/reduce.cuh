// Warp and block reductions with a fixed summation order (bitwise reproducible).
#pragma once

namespace fusedops::cuda {

__device__ __forceinline__ float warp_sum(float v, int width = 32) {
  for (int off = width / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over each group of `group` consecutive threads (a power of two, up to the block size),
// returned to every thread of the group. Every thread of the block must call it (it contains
// __syncthreads when group > 32). `scratch` holds one float per warp of the block.
__device__ __forceinline__ float group_sum(float v, int group, float* scratch) {
  v = warp_sum(v, group < 32 ? group : 32);
  if (group <= 32) return v;
  const int warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if ((threadIdx.x & 31) == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = group >> 5;
  const int first = (warp / warps) * warps;
  float s = 0.0f;
  for (int w = 0; w < warps; ++w) s += scratch[first + w];
  return s;
}

// Sum over the whole block, returned to every thread.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return group_sum(v, blockDim.x, scratch);
}

}  // namespace fusedops::cuda
