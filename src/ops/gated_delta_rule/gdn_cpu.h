// Helpers shared by the two halves of the GDN CPU backend (the shared ones are in la_cpu.h).
#pragma once

#include <cstdint>
#include <vector>

#include "src/ops/linear_attention/la_common.h"
#include "src/ops/linear_attention/la_cpu.h"
#include "src/ops/linear_attention/la_cpu_kernels.h"

namespace fusedops::gdn::cpu {

// The GDN CPU kernels are written with the shared layout types and building blocks.
using namespace la;
using namespace la::cpu;

// The chunk's [len,len] lower block (strict or with the diagonal) of a [B,T,H,BT] tensor, zeros
// elsewhere, and the store of a [len,len] block as BT-wide rows (zeros beyond len).
void load_tril_block(const Tok& A, const Chunk& c, int64_t h, bool strict, float* out, int64_t ld);
void store_square_block(const float* in, int64_t ld, const Tok& A, const Chunk& c, int64_t h);
// The chunk's Q and K rows of q/k head h (read in place when fp32, else converted into scratch
// slots 0 and 1) and Q K^T, [n,n] (n = c.len) in slot 3: the start of chunk_fwd_o and dv_local.
struct QkBlock {
  Rows q, k;
  float* qk;
};
QkBlock qk_block(Scratch& s, const Tok& q, const Tok& k, const Chunk& c, int64_t h);
// for_each_chunk_head's head prefetch for the kernels that read the chunk's Q and K rows.
inline auto prefetch_qk(const Tok& q, const Tok& k) {
  return [&q, &k](const Chunk& nx, int64_t nh) {
    prefetch_rows(q, nx, nh);
    prefetch_rows(k, nx, nh);
  };
}
// P = scale (M>= . Gamma . Q K^T), [n,n] with ld n (n = c.len), for value head hv of chunk c:
// the decays of its gates on and below the diagonal times the chunk's Q K^T block qk (ld n),
// zeros above. gd (n values, e.g. gate_buffer(n)) receives the gates.
void gated_scores(const Tok& g, const Chunk& c, int64_t hv, const float* qk, float scale,
                  double* gd, float* P);
// X = (I + L)^{-1} for a strictly lower [n,n] L (ld n); X has leading dimension ld.
void unit_lower_inverse(const float* L, int64_t n, float* X, int64_t ld);
// One token of the recurrence on S [K,V] in place; o (optional, needs q) = scale S^T q; delta and
// p (scratch of V floats) return the delta-rule error and (decay S)^T k.
void recurrent_step(float* S, const float* q, const float* k, const float* v, float decay,
                    float beta, float scale, int64_t K, int64_t V, float* o, float* delta, float* p);

}  // namespace fusedops::gdn::cpu
