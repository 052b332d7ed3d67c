// Host-side pieces shared by the cross-entropy and chunk_loss backends: the label checks, the
// CUDA workspace layouts (also needed by the *_workspace_size queries, which
// are compiled without CUDA), and the chunk size rule of chunk_loss.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fusedops/core/check.h"
#include "fusedops/core/context.h"
#include "fusedops/core/dtype.h"
#include "fusedops/core/error.h"
#include "fusedops/ops/cross_entropy.h"

namespace fusedops::ce {

// Raises unless every label is ignore_index or in [0, vocab).
template <class L>
void check_labels_host(const char* op, const L* labels, int64_t n, int64_t vocab,
                       int64_t ignore_index) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t y = static_cast<int64_t>(labels[i]);
    FUSEDOPS_REQUIRE(y == ignore_index || (y >= 0 && y < vocab), kValue, op, "labels[", i,
                     "] = ", y, " is outside [0, ", vocab, ") and is not ignore_index (",
                     ignore_index, ")");
  }
}

// Every label is ignore_index or in [0, vocab): checked before any work on the CPU, and on CUDA
// with debug checks (a copy to the host and a synchronisation); otherwise the CUDA kernels give
// the row a NaN loss and report it (defined in cross_entropy_api.cpp).
void check_label_values(const char* op, const Context& ctx, const TensorView& labels,
                        int64_t vocab, int64_t ignore_index);

inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
inline int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// CUDA workspace of the cross-entropy passes over `rows` rows: four fp32 arrays of one value per
// row and a small block for counters. Every part starts on a 256-byte boundary.
struct RowsLayout {
  size_t row_scale = 0, row_norm = 0, row_loss = 0, row_z = 0, misc = 0, total = 0;
};

inline RowsLayout rows_layout(int64_t rows, size_t base = 0) {
  RowsLayout l;
  const size_t bytes = align_up(static_cast<size_t>(std::max<int64_t>(rows, 1)) * 4, 256);
  l.row_scale = align_up(base, 256);
  l.row_norm = l.row_scale + bytes;
  l.row_loss = l.row_norm + bytes;
  l.row_z = l.row_loss + bytes;
  l.misc = l.row_z + bytes;
  l.total = l.misc + 256;
  return l;
}

// Default memory for the per-chunk buffers of chunk_loss. On the CPU 32 MiB: glibc keeps freed
// blocks of up to 32 MiB on its heap for the next call, while larger ones go back to the OS and
// every call pays their first-touch page faults again (stop 24, [512, 256, 32000] on 2 cores:
// fp32 164 -> 140 ms, bf16 111 -> 90 ms fwd+bwd at 32 instead of 256 MiB).
inline constexpr int64_t kChunkBudgetCuda = int64_t(2) << 30;
inline constexpr int64_t kChunkBudgetCpu = int64_t(32) << 20;

// Rows per chunk: chunk_size when given, else as many rows as `budget` bytes hold at
// `bytes_per_row`, rounded to a multiple of 64 and balanced so the chunks have equal sizes.
inline int64_t chunk_rows(int64_t rows, int64_t chunk_size, int64_t budget, int64_t bytes_per_row) {
  if (rows <= 0) return 1;
  if (chunk_size > 0) return std::min(chunk_size, rows);
  int64_t cmax = std::max<int64_t>(1, budget / std::max<int64_t>(bytes_per_row, 1));
  if (cmax >= rows) return rows;
  if (cmax >= 64) cmax = cmax / 64 * 64;
  const int64_t chunks = (rows + cmax - 1) / cmax;
  int64_t c = (rows + chunks - 1) / chunks;
  if (cmax >= 64) c = round_up(c, 64);
  return std::min(std::min(c, cmax), rows);
}

// Leading dimension of the per-chunk logits / gradient buffers on CUDA: 16-byte rows.
inline int64_t chunk_ld(int64_t vocab) { return round_up(vocab, 8); }

// CUDA workspace of chunk_loss: cuBLASLt workspace, the per-row arrays over all rows, the fp32
// logits chunk, a separate gradient chunk when the operands are 16-bit (fp32 gradients replace
// the logits in place), and an fp32 weight-gradient accumulator when `own_dw` (a 16-bit weight
// gradient that the caller does not accumulate).
//
// With a separate 16-bit gradient the chunks have two levels: `chunk` rows of gradient (the rows
// of one d_hidden GEMM and one weight-gradient GEMM) are filled by sub-chunks of `sub` rows of
// fp32 logits (one logits GEMM and one cross-entropy pass each). A logits row costs twice a
// gradient row, and every chunk's weight-gradient GEMM reads and writes the whole fp32 [V, H]
// accumulator once more, so the budget goes to the gradient chunk first (stop 25, main_grad at
// 1 GiB, N=8192 V=128256: 7 one-level chunks of 1216 rows against 3 chunks of 2752 rows with
// logits sub-chunks of 704 rows).
//
// The default plan of a call that wants a 16-bit weight gradient back (own_dw; neither
// chunk_size nor memory_budget given) is held to what Liger-Kernel's
// LigerFusedLinearCrossEntropyLoss keeps besides the gradients it returns: one logits chunk in
// the operand dtype of about N x H elements (liger_logits_bytes). The whole workspace, cuBLASLt's
// included, then fits that: if an fp32 weight-gradient accumulator fits in half of it, the plan
// above runs in what is left; otherwise the plan is compact: the logits of a chunk are computed in
// the operand dtype and replaced by their gradient in place (as in Liger; the fp32 logits of the
// other plans round once more), and the weight gradient is accumulated in the caller's 16-bit
// tensor, rounded once per chunk (the fp32 accumulator of the other plans rounds once).
struct ChunkLayout {
  int64_t chunk = 1, sub = 1, ld = 8;
  size_t gemm = 0, gemm_bytes = 0, z = 0, g = 0, dw = 0, total = 0;
  RowsLayout rows;
  bool separate_g = false, own_dw = false;
  bool compact = false;  // 16-bit logits replaced by their gradient in place; dW into the output
};

// Liger-Kernel 0.8.5's chunk for N rows, vocabulary V, hidden size H: the rows of
// next_pow2(ceil(N / ceil(V / H))) (at most N), so that a chunk's logits hold about N x H values.
inline int64_t liger_chunk_rows(int64_t rows, int64_t vocab, int64_t hidden) {
  if (rows <= 0) return 0;
  const int64_t inc = (vocab + hidden - 1) / std::max<int64_t>(hidden, 1);
  const int64_t want = (rows + inc - 1) / std::max<int64_t>(inc, 1);
  int64_t p = 1;
  while (p < want) p *= 2;
  return std::min(p, rows);
}
// The bytes of that chunk's logits in the operand dtype.
inline int64_t liger_logits_bytes(int64_t rows, int64_t vocab, int64_t hidden, DType dtype) {
  return liger_chunk_rows(rows, vocab, hidden) * vocab * static_cast<int64_t>(dtype_size(dtype));
}
// Least workspace of the default plan for a 16-bit weight gradient (for problems so small that
// Liger's chunk holds less), and the cuBLASLt share of it (at most the GEMM workspace, at least
// 1 MiB).
inline constexpr int64_t kMinDefaultWorkspace = int64_t(4) << 20;
inline size_t default_gemm_share(int64_t workspace, size_t gemm_bytes) {
  const size_t eighth = static_cast<size_t>(workspace / 8) / 256 * 256;
  return std::min(gemm_bytes, std::max<size_t>(eighth, size_t(1) << 20));
}

// Fewest rows a logits sub-chunk gets when the budget is split (the logits GEMM keeps its rate).
inline constexpr int64_t kMinLogitsSubChunk = 512;

// Rows per logits sub-chunk of a gradient chunk of `chunk` rows when `room` bytes are left for
// them at `z_row` bytes per row: at most `chunk`, at least 1, balanced over the chunk.
inline int64_t sub_chunk_rows(int64_t chunk, int64_t room, int64_t z_row) {
  const int64_t cap = std::min(chunk, std::max<int64_t>(1, room / std::max<int64_t>(z_row, 1)));
  return chunk_rows(chunk, 0, cap, 1);
}

// The buffers after the GEMM workspace, for a plan whose rows are decided (l.chunk, l.sub,
// l.separate_g, l.own_dw, l.compact, l.gemm_bytes set).
inline void place_buffers(ChunkLayout& l, int64_t rows, int64_t vocab, int64_t hidden, DType dtype) {
  l.gemm = 0;
  l.rows = rows_layout(rows, align_up(l.gemm_bytes, 256));
  l.z = align_up(l.rows.total, 256);
  size_t end = l.z;
  if (l.compact) {
    // One buffer of operand-dtype rows: the logits, then (in place) their gradient.
    l.g = l.z;
    end = l.g + static_cast<size_t>(l.chunk) * static_cast<size_t>(l.ld) * dtype_size(dtype);
  } else {
    end += static_cast<size_t>(l.sub) * static_cast<size_t>(l.ld) * 4;
    if (l.separate_g) {
      l.g = align_up(end, 256);
      end = l.g + static_cast<size_t>(l.chunk) * static_cast<size_t>(l.ld) * dtype_size(dtype);
    }
  }
  if (l.own_dw) {
    l.dw = align_up(end, 256);
    end = l.dw + static_cast<size_t>(vocab) * static_cast<size_t>(hidden) * 4;
  }
  l.total = align_up(end, 256);
}

// Rows of the fp32-logits plan (chunk, sub) for the given chunk_size and budget (0: the default
// kChunkBudgetCuda).
inline void fp32_logits_rows(ChunkLayout& l, int64_t rows, int64_t chunk_size, int64_t budget,
                             DType dtype) {
  const int64_t z_row = l.ld * 4;
  const int64_t g_row = l.separate_g ? l.ld * static_cast<int64_t>(dtype_size(dtype)) : 0;
  if (!l.separate_g) {
    l.chunk = chunk_rows(rows, chunk_size, budget > 0 ? budget : kChunkBudgetCuda, z_row);
    l.sub = l.chunk;
  } else if (chunk_size > 0) {
    // The caller's chunk; logits sub-chunks only when a budget is given as well.
    l.chunk = chunk_rows(rows, chunk_size, 0, 1);
    l.sub = budget > 0 ? sub_chunk_rows(l.chunk, budget - l.chunk * g_row, z_row) : l.chunk;
  } else {
    const int64_t b = budget > 0 ? budget : kChunkBudgetCuda;
    // Largest gradient chunk R with R * g_row + min(R, kMinLogitsSubChunk) * z_row <= b.
    int64_t rmax = (b - kMinLogitsSubChunk * z_row) / g_row;
    if (rmax < kMinLogitsSubChunk) rmax = b / (g_row + z_row);
    l.chunk = chunk_rows(rows, 0, std::max<int64_t>(rmax, 1), 1);
    l.sub = sub_chunk_rows(l.chunk, b - l.chunk * g_row, z_row);
  }
}

inline ChunkLayout chunk_layout(int64_t rows, int64_t vocab, int64_t hidden, DType dtype,
                                bool need_grad, bool own_dw, int64_t chunk_size, int64_t budget,
                                size_t gemm_bytes) {
  ChunkLayout l;
  l.ld = chunk_ld(vocab);
  l.separate_g = need_grad && dtype != DType::kFloat32;
  l.own_dw = own_dw;
  l.gemm_bytes = gemm_bytes;
  if (own_dw && chunk_size <= 0 && budget <= 0) {
    // The default plan for a 16-bit weight gradient: everything within Liger's logits chunk.
    const int64_t total = std::max(liger_logits_bytes(rows, vocab, hidden, dtype) -
                                       static_cast<int64_t>(rows_layout(rows).total),
                                   kMinDefaultWorkspace);
    l.gemm_bytes = default_gemm_share(total, gemm_bytes);
    const int64_t avail =
        total - static_cast<int64_t>(align_up(l.gemm_bytes, 256) + rows_layout(rows).total) - 1024;
    const int64_t acc = vocab * hidden * 4;
    if (acc <= avail / 2) {
      fp32_logits_rows(l, rows, 0, avail - acc - 512, dtype);
    } else {
      l.compact = true;
      l.own_dw = false;
      const int64_t row_bytes = l.ld * static_cast<int64_t>(dtype_size(dtype));
      l.chunk = chunk_rows(rows, 0, std::max<int64_t>(avail - 256, row_bytes), row_bytes);
      l.sub = l.chunk;
    }
  } else {
    fp32_logits_rows(l, rows, chunk_size, budget, dtype);
  }
  place_buffers(l, rows, vocab, hidden, dtype);
  return l;
}

// Argument checks shared by the API files (defined in cross_entropy_api.cpp).
void check_options(const char* op, const CrossEntropyOptions& o);
// Contiguous, or empty (torch gives empty tensors arbitrary strides).
void check_dense(const ArgCheck& c, const TensorView& t, const char* name);
// `out` is `in` itself or does not overlap it.
void check_in_place_or_apart(const ArgCheck& c, const TensorView& out, const char* out_name,
                             const TensorView& in, const char* in_name);

}  // namespace fusedops::ce
