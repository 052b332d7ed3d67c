// Row and state loads of the float64 reference kernels (both families' and the shared
// sub-operators' in linear_attention_ref.cpp), in double from any storage dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "src/ops/linear_attention/la_common.h"

namespace fusedops::la::ref {

// Rows [c.t0, c.t0 + c.len) of head h as a [len, D] row-major block of doubles, and back.
std::vector<double> load_block(const Tok& t, const Chunk& c, int64_t h);
void store_block(const Tok& t, const Chunk& c, int64_t h, const std::vector<double>& v);
// The gate of a chunk ([len]); zeros when the gate is absent.
std::vector<double> load_gate(const Tok& g, const Chunk& c, int64_t h);
// A [K,V] state (index = snapshot_or_seq * HV + hv).
std::vector<double> load_mat(const Mat& m, int64_t index);
void store_mat(const Mat& m, int64_t index, const std::vector<double>& v);

}  // namespace fusedops::la::ref
