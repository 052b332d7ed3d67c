// The CPU cross-entropy engine shared by fused_cross_entropy_loss and chunk_loss: per-row
// scales, the fused loss + gradient pass over the rows, and the final reductions. fp32 math
// (the final sums in double), threads over rows, results independent of the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "fusedops/core/dtype.h"
#include "fusedops/ops/cross_entropy.h"

namespace fusedops::cpu::ce {

// row_norm[i] = 1 / norm_i (0 for ignored rows) with norm_i = (#valid for "mean", else 1) *
// alpha_i; row_scale[i] = w_i * row_norm[i]. alpha_i = alpha_per_sample[i / rows_per_sample]
// when given, else alpha.
struct ScaleParams {
  const void* labels;
  bool labels_int64;
  const void* loss_weight;  // nullptr: w = 1
  DType loss_weight_dtype;
  const float* alpha_per_sample;  // nullptr: the scalar alpha
  int64_t rows_per_sample;
  double alpha;
  int64_t rows;
  int64_t ignore_index;
  bool mean;
  float* row_scale;
  float* row_norm;
};
void row_scales(const ScaleParams& p);

// For each row: l_i (row_loss), lambda lse^2 (row_z, optional) and, when grad is given,
// grad[i,:] = row_scale[i] * dl_i/dlogits[i,:]. grad may be the logits buffer itself (same
// dtype and row stride).
struct RowsParams {
  const void* logits;
  DType logits_dtype;
  int64_t logits_row_stride;
  void* grad;  // nullptr: loss only
  DType grad_dtype;
  int64_t grad_row_stride;
  const void* labels;
  bool labels_int64;
  const float* row_scale;
  float* row_loss;
  float* row_z;  // nullptr: not wanted
  int64_t rows, vocab;
  int64_t ignore_index;
  float logit_scale;
  float softcap;  // 0: off
  float label_smoothing;
  float lse_square_scale;
};
void rows(const RowsParams& p);

// The loss of rows whose fp32 logits arrive a block of columns at a time (chunk_loss without a
// gradient: the [rows, V] logits never exist). block_stats reads one block, columns [v0, v0 + cols)
// of rows [0, rows) at row stride ld, applies logit_scale and softcap in place and writes per row
// the maximum m_b of the block's z, sum exp(z - m_b), sum z (label smoothing only) and z at the
// label when the label falls in the block. finish_block_stats merges each row's blocks in block
// order (nblocks blocks of block_cols columns, the last one shorter) into row_loss and row_z as
// rows() defines them; which thread computed which block does not change the result.
struct BlockStat {
  float m, d, sz, zy;
};
struct BlockStatsParams {
  float* logits;
  int64_t ld, rows, cols, v0;
  const void* labels;
  bool labels_int64;
  int64_t ignore_index;
  float logit_scale;
  float softcap;  // 0: off
  float label_smoothing;
  BlockStat* out;  // [rows]
};
void block_stats(const BlockStatsParams& p);
// block_stats of a block stored vocabulary-major, logits[v * ld + r] (cols vocabulary rows by rows
// rows), as the AMX logits product writes it (src/cpu/amx.h). The same statistics and transforms;
// per row the vocabulary is taken in order, each sum in four partial sums (v mod 4) added as
// (s0 + s1) + (s2 + s3): sixteen rows per AVX-512 register, the same bits without AVX-512.
void block_stats_vocab_major(const BlockStatsParams& p);

struct FinishBlockStatsParams {
  const BlockStat* stats;  // [nblocks][rows]
  int64_t nblocks, block_cols, rows, vocab;
  const void* labels;
  bool labels_int64;
  int64_t ignore_index;
  float label_smoothing;
  float lse_square_scale;
  float* row_loss;
  float* row_z;  // nullptr: not wanted
};
void finish_block_stats(const FinishBlockStatsParams& p);

// loss = sum_i row_scale[i] row_loss[i] (or per row for "none"), z_loss likewise with row_norm,
// grad_loss_weight[i] = row_norm[i] row_loss[i]; outputs of any floating dtype, each optional
// except loss.
struct FinalizeParams {
  const float* row_scale;
  const float* row_norm;
  const float* row_loss;
  const float* row_z;
  int64_t rows;
  bool per_row;
  void* loss;
  DType loss_dtype;
  void* z_loss;  // nullptr: not wanted
  DType z_loss_dtype;
  void* grad_loss_weight;  // nullptr: not wanted
  DType grad_loss_weight_dtype;
};
void finalize(const FinalizeParams& p);

// out[i, :] = factor_i * in[i, :] for rows of `cols` elements (contiguous), factor_i = g[i] when
// per_row else g[0]; out may be in (then rows with factor 1 are skipped).
struct ScaleRowsParams {
  const void* in;
  void* out;
  DType dtype;
  int64_t rows, cols;
  const float* g;
  bool per_row;
};
void scale_rows(const ScaleRowsParams& p);

// ---------------------------------------------------------------------------------------------
// The plumbing of one loss call around the steps above (fused_cross_entropy_loss, chunk_loss).

// The per-row buffers of a call: row_scales() fills scale and norm, rows() (or the block
// statistics) loss and z, finalize() reads all four.
struct RowBuffers {
  explicit RowBuffers(int64_t n) : scale(n), norm(n), loss(n), z(n) {}
  std::vector<float> scale, norm, loss, z;
};
// RowsParams' fields that the options decide: ignore_index, logit_scale, softcap,
// label_smoothing, lse_square_scale.
void set_options(RowsParams& p, const CrossEntropyOptions& o);
// finalize() of the buffers (rows = their size) into the op's outputs: loss, and z_loss and
// grad_loss_weight where defined.
void finalize_outputs(const RowBuffers& b, bool per_row, const TensorView& loss,
                      const TensorView& z_loss, const TensorView& grad_loss_weight);
// The backward of grad_loss_weight: out[i] = g * saved[i] (saved fp32, out any floating dtype;
// g[i] when per_row, else g[0]), the product taken in out's precision when that is float64.
void scale_loss_weight_grad(const TensorView& saved, const TensorView& out, const float* g,
                            bool per_row);

}  // namespace fusedops::cpu::ce
