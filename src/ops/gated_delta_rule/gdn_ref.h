// Helpers shared by the two halves of the GDN float64 reference backend (the shared ones are in
// la_ref.h).
#pragma once

#include <cstdint>
#include <vector>

#include "fusedops/core/context.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "src/ops/linear_attention/la_ref.h"

namespace fusedops::gdn::ref {

// The shared layout types (la_common.h) and row / state loads (la_ref.h).
using namespace la;
using namespace la::ref;

// The chunk's [len,len] block of a [B,T,H,BT] matrix tensor: lower part (strict or with the
// diagonal), zeros elsewhere.
std::vector<double> load_tril(const Tok& A, const Chunk& c, int64_t h, bool strict);
// Writes a [len,len] block as rows of BT values (columns >= len are 0).
void store_square(const Tok& A, const Chunk& c, int64_t h, const std::vector<double>& m);
double dot(const double* a, const double* b, int64_t n);
double gamma_factor(const std::vector<double>& g, int64_t i, int64_t j);
// (I + L)^{-1} of a strictly lower [n,n] matrix.
std::vector<double> unit_lower_inverse(const std::vector<double>& L, int64_t n);
// One token of the recurrence (section 1.1) applied to S in place; o (optional) = scale S^T q,
// delta_out (optional) = the delta-rule error.
void recurrent_step(std::vector<double>& S, const double* q, const double* k, const double* v,
                    double g, double beta, double scale, int64_t K, int64_t V, double* o,
                    double* delta_out);
void top_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a);

}  // namespace fusedops::gdn::ref
