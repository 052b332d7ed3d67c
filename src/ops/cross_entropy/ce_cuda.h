// The CUDA cross-entropy engine (kernels in cross_entropy_sm80.cu), shared by
// fused_cross_entropy_loss and chunk_loss. Host-callable, no CUDA types in the interface: every
// launcher takes the cudaStream_t as void*, runs on the current device, never allocates and
// never synchronizes.
#pragma once

#include <cstdint>

#include "fusedops/core/device_errors.h"
#include "fusedops/core/dtype.h"

namespace fusedops::cuda::ce {

// Value types of optional per-row inputs/outputs on the device.
enum ValueType : int { kNoValue = 0, kF32 = 1, kBF16 = 2, kF16 = 3 };
ValueType value_type(DType dtype);  // kF32/kBF16/kF16; raises for other dtypes

// row_norm[i] = 1 / norm_i (0 for ignored rows), norm_i = (#valid rows if mean else 1) * alpha_i
// with alpha_i = alpha_per_sample[i / rows_per_sample] when given, else alpha;
// row_scale[i] = loss_weight[i] * row_norm[i]. One block; counts the valid rows itself. A label
// outside [0, vocab) that is not ignore_index is reported into `record` with `bad_label_code`
// (index = the row, value = the label); the row pass gives that row a NaN loss.
struct ScaleParams {
  const void* labels;
  int labels_int64;
  const void* loss_weight;
  int loss_weight_type;  // ValueType; kNoValue: weight 1
  const float* alpha_per_sample;
  int64_t rows_per_sample;
  double alpha;
  int64_t rows;
  int64_t vocab;
  int64_t ignore_index;
  int mean;
  float* row_scale;
  float* row_norm;
  DeviceErrorRecord* record;
  uint32_t bad_label_code;
};
// The bad-input record of the current device and the code of "label out of range" for `op`.
void set_label_report(const char* op, ScaleParams& p);
void row_scales(const char* op, const ScaleParams& p, void* stream);

// The fused pass: for each row, l_i -> row_loss, lambda lse^2 -> row_z (optional) and, when g is
// given, g[i,:] = row_scale[i] * dl_i/dx[i,:] (fp32 math, one rounding). g may be x itself
// (then same dtype and row stride). Supported (x, g) dtypes: equal types, or fp32 x with a
// 16-bit g.
struct RowParams {
  const void* x;
  int64_t x_stride;
  void* g;
  int64_t g_stride;
  const void* labels;
  int labels_int64;
  const float* row_scale;
  float* row_loss;
  float* row_z;
  int64_t rows, vocab;
  int64_t ignore_index;
  float scale;    // logit_scale
  float cap;      // logit_softcapping, 0 = off
  float inv_cap;
  float eps;      // label_smoothing
  float inv_vocab;
  float lambda;   // lse_square_scale
  int tpr;        // set by the launcher
  int smem_iters; // set by the launcher
  // 1: launch the vectorised row kernel with programmatic dependent launch (sm_90), its first pass
  // overlapping the grid before it, which must be row_scales (it writes row_scale and lets this grid
  // start early; this grid reads nothing that grid writes before it waits). 0 for any other
  // predecessor (e.g. a GEMM that writes the logits).
  int pdl;
};
void rows(const char* op, RowParams p, DType x_dtype, DType g_dtype, int device, void* stream);

// loss = sum_i row_scale[i] row_loss[i] (per row when per_row), z_loss likewise with
// row_norm * row_z (optional), grad_loss_weight[i] = row_norm[i] row_loss[i] (optional).
// One block, fixed summation order in double.
struct FinalizeParams {
  const float* row_scale;
  const float* row_norm;
  const float* row_loss;
  const float* row_z;
  int64_t rows;
  int per_row;
  float* loss;
  float* z_loss;
  float* grad_loss_weight;
};
void finalize(const char* op, const FinalizeParams& p, void* stream);

// out[r, :] = f_r * in[r, :] over rows of `cols` contiguous elements of `dtype`;
// f_r = g[r] if per_row else g[0]. out may be in: rows with f_r == 1 are then skipped.
struct ScaleRowsParams {
  const void* in;
  void* out;
  int64_t rows, cols;
  const float* g;
  int per_row;
};
void scale_rows(const char* op, const ScaleRowsParams& p, DType dtype, void* stream);

// out[i] = f_i * in[i] (fp32 in, out of ValueType out_type), f_i as above.
void scale_values(const char* op, const float* in, void* out, int out_type, int64_t n,
                  const float* g, int per_row, void* stream);

// out[i] = in[i] converted to dtype (fp32 in), n elements.
void convert(const char* op, const float* in, void* out, DType dtype, int64_t n, void* stream);

}  // namespace fusedops::cuda::ce
