// CPU helpers of the chunked linear-attention kernels (both families' CPU backends and the
// shared sub-operators of linear_attention_cpu.cpp): the chunks of a call, the V tiling of the
// state recurrences, and [K,V] state tiles in fp32.
#pragma once

#include <cstdint>
#include <vector>

#include "src/ops/linear_attention/la_common.h"
#include "src/ops/linear_attention/la_cpu_kernels.h"

namespace fusedops::la::cpu {

std::vector<Chunk> chunks_of(int64_t B, int64_t T, const TensorView& cu, int64_t BT);
// Width of the V tiles of the state recurrences given the number of (sequence, head) tasks.
int64_t v_tile(int64_t tasks, int64_t V);
// Columns [v0, v0+vt) of a [K,V] state as a [K, vt] fp32 block, and back.
void load_state_tile(const Mat& m, int64_t index, int64_t v0, int64_t vt, float* X);
void store_state_tile(const float* X, const Mat& m, int64_t index, int64_t v0, int64_t vt);
// The same by non-temporal stores where the tile is fp32 and 32-byte aligned (for snapshots that
// only later operators read); the caller ends its task with _mm_sfence.
void store_state_tile_nt(const float* X, const Mat& m, int64_t index, int64_t v0, int64_t vt);
// A whole [K,V] state as fp32: the tensor itself when fp32, else converted into buf.
const float* view_state(const Mat& m, int64_t index, float* buf);

}  // namespace fusedops::la::cpu
