// sort_chunks family (docs/specs/ops.md section 6): sort_chunks_by_idx, the MoE chunk permutation, and its
// helpers make_chunk_sort_map and sort_chunks_by_map.
//
// The rows of inp [N, Hd] are split into S consecutive chunks of split_sizes[c] rows and the
// chunks are concatenated in the order sorted_index gives:
//
//   in_off[c]  = sum_{c' < c} split_sizes[c']
//   pos[c]     = the j with sorted_index[j] == c
//   out_off[j] = sum_{j' < j} split_sizes[sorted_index[j']]
//   row_id_map[r] = out_off[pos[c]] + (r - in_off[c])   for r in chunk c
//   row_id_map[r] = r                                    for r >= sum(split_sizes)
//   out[row_id_map[r]] = inp[r],   probs_out[row_id_map[r]] = probs[r]
//
// The op only moves bytes: any element dtype works (fp32/bf16/fp16, fp8 passed as uint8 bytes,
// integers), outputs and gradients are bit-identical to the definition.
//
// Index tensors (split_sizes, sorted_index, row_id_map) must hold: sizes >= 0 with sum <= N,
// sorted_index a permutation of 0..S-1, row_id_map a permutation of 0..N-1. On the CPU their
// contents are checked before any work (a kValue Error). On CUDA they are read on the device, so
// no call synchronizes: the kernels check them, keep every access in bounds and report a
// violation into the device's bad-input record (fusedops/core/device_errors.h), with a defined
// result: bad split_sizes / sorted_index give the identity (out = inp, row_id_map[r] = r); map
// entries outside [0, N) are skipped (scatter) or give zero rows (gather); rows a scatter
// through a non-permutation does not reach are zero. With debug checks (debug_checks(ctx)) the
// CUDA calls check the indices on the host first and raise like the CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

// Forward: out = the chunks of inp in sorted_index order (see the header comment).
//   inp:          [N, Hd] any dtype. Last dim stride 1 (or Hd <= 1); any row stride.
//   split_sizes:  [S] int32/int64, contiguous, entries >= 0, sum <= N.
//   sorted_index: [S] int32/int64, contiguous, a permutation of 0..S-1.
//   probs:        [N] any dtype (usually float32), any stride; optional (undefined = none).
//   out:          [N, Hd] contiguous, dtype of inp; overwritten.
//   probs_out:    [N] contiguous, dtype of probs; required iff probs is given.
//   row_id_map:   [N] int32 contiguous, written; saved for the backward. N < 2^31.
//   workspace:    CUDA only: uint8 [>= sort_chunks_by_idx_workspace_size(S)] on the device
//                 (per-chunk offsets); ignored (may be undefined) on the CPU.
struct SortChunksFwdArgs {
  TensorView inp;
  TensorView split_sizes;
  TensorView sorted_index;
  TensorView probs;
  TensorView out;
  TensorView probs_out;
  TensorView row_id_map;
  TensorView workspace;
};

// Backward: the inverse permutation, a gather through the saved map:
//   d_inp[r] = d_out[row_id_map[r]],   d_probs[r] = d_probs_out[row_id_map[r]].
//   d_out: [N, Hd] any dtype, last dim stride 1. row_id_map: [N] int32 as saved.
//   d_probs_out: [N] or undefined; d_probs: [N] contiguous, required iff d_probs_out is given.
//   d_inp: [N, Hd] contiguous, dtype of d_out; overwritten (not accumulated).
struct SortChunksBwdArgs {
  TensorView d_out;
  TensorView d_probs_out;
  TensorView row_id_map;
  TensorView d_inp;
  TensorView d_probs;
};

// make_chunk_sort_map: only the row_id_map of the forward (MindSpeed/TE helper).
//   split_sizes, sorted_index, workspace: as in SortChunksFwdArgs; row_id_map: [N] int32.
struct ChunkSortMapArgs {
  TensorView split_sizes;
  TensorView sorted_index;
  TensorView row_id_map;
  TensorView workspace;
};

// sort_chunks_by_map: moves rows through a given map (MindSpeed/TE helper).
//   is_forward: out[row_id_map[r]] = inp[r] (scatter, the forward);
//   otherwise   out[r] = inp[row_id_map[r]] (gather, the backward).
//   inp [N, Hd] any dtype; row_id_map [N] int32, a permutation of 0..N-1; probs [N] or
//   undefined; out [N, Hd] contiguous, dtype of inp; probs_out [N] contiguous, dtype of probs,
//   required iff probs is given.
//   workspace: CUDA scatter (is_forward) only: uint8 [>= sort_chunks_by_map_workspace_size(N,
//   true)] on the device, 4-byte aligned (a bitmap of the rows written); ignored otherwise.
struct SortChunksByMapArgs {
  TensorView inp;
  TensorView row_id_map;
  TensorView probs;
  TensorView out;
  TensorView probs_out;
  bool is_forward = true;
  TensorView workspace;
};

// Bytes of device workspace the CUDA backend needs for S chunks (0 when S == 0). The same
// workspace serves sort_chunks_by_idx_fwd and make_chunk_sort_map.
size_t sort_chunks_by_idx_workspace_size(int64_t num_splits);
// Bytes of device workspace the CUDA backend of sort_chunks_by_map needs for N rows (0 for the
// gather, is_forward false, and for N == 0).
size_t sort_chunks_by_map_workspace_size(int64_t num_rows, bool is_forward);

void sort_chunks_by_idx_fwd(const Context& ctx, const SortChunksFwdArgs& args);
void sort_chunks_by_idx_bwd(const Context& ctx, const SortChunksBwdArgs& args);
void make_chunk_sort_map(const Context& ctx, const ChunkSortMapArgs& args);
void sort_chunks_by_map(const Context& ctx, const SortChunksByMapArgs& args);

// The reference (plain loops over the definition; CPU tensors).
void sort_chunks_by_idx_fwd_ref(const Context& ctx, const SortChunksFwdArgs& args);
void sort_chunks_by_idx_bwd_ref(const Context& ctx, const SortChunksBwdArgs& args);

}  // namespace fusedops
