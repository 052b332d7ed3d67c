// Helpers shared by the two halves of the CPU backend.
#pragma once

#include <cstdint>
#include <vector>

#include "src/ops/linear_attention/la_common.h"
#include "src/ops/linear_attention/la_cpu_kernels.h"

namespace fusedops::gdn::cpu {

// The GDN CPU kernels are written with the shared layout types and building blocks.
using namespace la;
using namespace la::cpu;

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
// The chunk's [len,len] lower block (strict or with the diagonal) of a [B,T,H,BT] tensor, zeros
// elsewhere, and the store of a [len,len] block as BT-wide rows (zeros beyond len).
void load_tril_block(const Tok& A, const Chunk& c, int64_t h, bool strict, float* out, int64_t ld);
void store_square_block(const float* in, int64_t ld, const Tok& A, const Chunk& c, int64_t h);
// X = (I + L)^{-1} for a strictly lower [n,n] L (ld n); X has leading dimension ld.
void unit_lower_inverse(const float* L, int64_t n, float* X, int64_t ld);
// One token of the recurrence on S [K,V] in place; o (optional, needs q) = scale S^T q; delta and
// p (scratch of V floats) return the delta-rule error and (decay S)^T k.
void recurrent_step(float* S, const float* q, const float* k, const float* v, float decay,
                    float beta, float scale, int64_t K, int64_t V, float* o, float* delta, float* p);

}  // namespace fusedops::gdn::cpu
