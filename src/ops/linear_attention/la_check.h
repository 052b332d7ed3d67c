// Argument checks shared by the linear-attention entry points (both families' sub-operators and
// top levels): tensor roles, head dimensions, and the varlen indices (read and checked on the CPU).
#pragma once

#include <string>
#include <vector>

#include "fusedops/core/check.h"
#include "fusedops/core/context.h"
#include "src/ops/linear_attention/la_common.h"

namespace fusedops::la {

class Check {
 public:
  Check(const char* op, const Context& ctx) : c_(op), ctx_(ctx), op_(op) {}

  const ArgCheck& base() const { return c_; }
  const Context& ctx() const { return ctx_; }
  const char* op() const { return op_; }
  // Whether the index tensors' contents are read and checked on the host: on the CPU, and on CUDA
  // under the debug checks (debug_checks(ctx): a copy and a synchronisation).
  bool read_indices() const;

  // A floating input of the given shape on ctx.device whose last dim has stride 1.
  void input(const TensorView& t, const char* name, const std::vector<int64_t>& shape) const;
  void opt_input(const TensorView& t, const char* name, const std::vector<int64_t>& shape) const {
    if (t.defined()) input(t, name, shape);
  }
  // A state input (h, dh snapshots; initial_state / h0, dht): floating, of the given shape on
  // ctx.device and contiguous, since the state kernels read states as dense [.., K, V] blocks.
  // (The Python functions pass states contiguous; an expanded or sliced state is an error here.)
  void state(const TensorView& t, const char* name, const std::vector<int64_t>& shape) const;
  void opt_state(const TensorView& t, const char* name, const std::vector<int64_t>& shape) const {
    if (t.defined()) state(t, name, shape);
  }
  // A floating, contiguous output of the given shape on ctx.device.
  void output(const TensorView& t, const char* name, const std::vector<int64_t>& shape) const;
  void opt_output(const TensorView& t, const char* name, const std::vector<int64_t>& shape) const {
    if (t.defined()) output(t, name, shape);
  }
  // q/k-like [B,T,H,K]: rank 4 input; returns its shape.
  std::vector<int64_t> rank4(const TensorView& t, const char* name) const;
  void value(bool ok, const std::string& msg) const { c_.value(ok, msg); }

  // chunk_size in {16,32,64} (what the solve and the top level accept).
  void chunk_size(int64_t bt) const;
  // K <= 256 for the state kernels; K, V >= 1.
  void head_dims(int64_t K, int64_t V) const;
  // HV is a multiple of Hk.
  void groups(int64_t HV, int64_t Hk, const char* v_name, const char* k_name) const;

  // cu_seqlens (optional) for a [B,T,...] batch: rank 1, int32/int64, B == 1. Its contents are
  // checked on the host when read_indices(); otherwise (CUDA) a one-block device check reports a
  // bad entry through the device error record (fusedops/core/device_errors.h) while the kernels
  // clamp every offset (la_sm80.cuh), unless a top level already did (NestedCalls). Returns N.
  int64_t seqlens(const TensorView& cu, int64_t B, int64_t T) const;
  // chunk_indices for chunk-parallel ops (required with cu_seqlens). Returns NT.
  int64_t chunk_indices(const TensorView& cu, const TensorView& ci, int64_t B, int64_t T,
                        int64_t BT) const;
  // chunk_offsets for state ops (required with cu_seqlens). Returns NT, or -1 when the indices
  // were not read.
  int64_t chunk_offsets(const TensorView& cu, const TensorView& co, int64_t B, int64_t T,
                        int64_t BT) const;
  // The second dimension NT of the snapshot tensor `snap` (h / dh): ceil(T/BT) per batch row, or
  // for varlen nt_read (the count read from the indices), else snap's own (rank 5 checked).
  int64_t snapshots(const TensorView& snap, const char* name, int64_t T, int64_t BT,
                    const TensorView& cu, int64_t nt_read) const;

 private:
  // A floating, contiguous tensor of the given shape on ctx.device; `why` follows "must be
  // contiguous" in the message.
  void dense(const TensorView& t, const char* name, const std::vector<int64_t>& shape, const char* why) const;
  void report_seqlens_on_device(const TensorView& cu, int64_t T) const;

  ArgCheck c_;
  const Context& ctx_;
  const char* op_;
  mutable bool reported_ = false;
};

// While alive, the linear-attention entry points called on this thread do not launch the device
// check of cu_seqlens: a top level that checked it once holds one around its sub-operators.
class NestedCalls {
 public:
  NestedCalls();
  ~NestedCalls();
  NestedCalls(const NestedCalls&) = delete;
  NestedCalls& operator=(const NestedCalls&) = delete;
};

// True when none of the given (defined) tensors is float64: the fp32 CPU backend's predicate.
inline bool no_float64(std::initializer_list<const TensorView*> ts) {
  for (const TensorView* t : ts)
    if (t->defined() && t->dtype() == DType::kFloat64) return false;
  return true;
}

}  // namespace fusedops::la
