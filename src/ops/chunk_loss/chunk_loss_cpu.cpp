// chunk_loss, CPU backend: per chunk of rows, Z = H_c W^T, the cross-entropy engine writing the
// gradient G over Z, dH_c = G W and dW += G^T H_c (cpu::sgemm / cpu::bgemm: oneDNN, fp32 sums).
// fp32 and bf16 operands go to the GEMMs as they are (bf16: G rounded to bf16, as the CUDA
// backend stores it); fp16 ones are copied to fp32 (the weight once, hidden a chunk at a time).
// Without gradients (torch.no_grad) only the logits GEMM and the loss pass run.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/chunk_loss.h"
#include "src/core/visit.h"
#include "src/cpu/amx.h"
#include "src/cpu/gemm.h"
#include "src/cpu/parallel.h"
#include "src/cpu/scratch.h"
#include "src/cpu/simd.h"
#include "src/ops/cross_entropy/ce_common.h"
#include "src/ops/cross_entropy/ce_cpu.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "chunk_loss";

// Scratch of n elements of T, overwritten before it is read. Buffers up to kKeepBytes are the
// calling thread's (cpu::thread_scratch, one per slot), kept between calls: a fresh multi-MiB
// buffer is returned to the OS when freed and page-faulted again on the next call (stop 25, bf16
// at [128, 128] x V = 8000: page faults and heap trims were ~20% of the call). Larger ones (an
// LLM's fp32 weight gradient) are allocated per call in `big`, uninitialised.
constexpr size_t kKeepBytes = size_t(64) << 20;
enum Slot { kSlotW32, kSlotDw, kSlotZ, kSlotH32, kSlotDh32, kSlotGb, kSlotHp };
struct ChunkScratch {};

template <class T>
T* scratch(Slot slot, int64_t n, std::unique_ptr<T[]>& big) {
  n = std::max<int64_t>(n, 1);
  if (static_cast<size_t>(n) * sizeof(T) <= kKeepBytes)
    return cpu::thread_scratch<ChunkScratch, T>().get(slot, n);
  big.reset(new T[static_cast<size_t>(n)]);
  return big.get();
}

bool supports_fwd(const ChunkLossFwdArgs& a) {
  return a.loss.dtype() == DType::kFloat32 &&
         (!a.grad_loss_weight.defined() || a.grad_loss_weight.dtype() == DType::kFloat32) &&
         (!a.alpha_per_sample.defined() || a.alpha_per_sample.dtype() == DType::kFloat32) &&
         (!a.grad_weight.defined() || a.grad_weight.dtype() != DType::kFloat64);
}

bool supports_bwd(const ChunkLossBwdArgs& a) {
  return a.grad_loss.dtype() == DType::kFloat32 &&
         (!a.saved_grad_loss_weight.defined() || a.saved_grad_loss_weight.dtype() == DType::kFloat32);
}

// rows x cols of T (row stride `stride`) -> contiguous fp32, threads over rows.
void to_float_rows(const void* src, DType dtype, int64_t stride, int64_t rows, int64_t cols, float* dst) {
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    cpu::parallel_for(0, rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(cols, 1)),
                      [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* s = static_cast<const T*>(src) + r * stride;
        float* d = dst + r * cols;
        if constexpr (std::is_same_v<T, double>) {
          for (int64_t c = 0; c < cols; ++c) d[c] = static_cast<float>(s[c]);
        } else {
          cpu::load_float(s, d, cols);
        }
      }
    });
  });
}

void from_float_rows(const float* src, int64_t rows, int64_t cols, void* dst, DType dtype) {
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    cpu::parallel_for(0, rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(cols, 1)),
                      [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        T* d = static_cast<T*>(dst) + r * cols;
        const float* s = src + r * cols;
        if constexpr (std::is_same_v<T, double>) {
          for (int64_t c = 0; c < cols; ++c) d[c] = s[c];
        } else {
          cpu::store_float(s, d, cols);
        }
      }
    });
  });
}

// Without a gradient (torch.no_grad, evaluation) a chunk's logits never exist whole: tasks of
// kLossRows rows by kLossCols vocabulary columns each compute their block with a single-threaded
// GEMM into the thread's buffer (256 x 1024 fp32 = 1 MiB, in L2; blocks of 512 columns were a
// little slower and of 2048 much slower on the 2-core Xeon) and reduce it at once to per-row
// statistics (cpu::ce::block_stats); the blocks are merged per row in block order
// (finish_block_stats), so the loss does not depend on the thread count. Before this (stop of
// 2026-12-05) the chunk's [C, V] fp32 logits went through DRAM between a two-thread GEMM and the
// loss pass. With bf16 operands on a CPU with AMX a block is computed vocabulary-major by
// cpu::amx::gemm_bat (faster than oneDNN's one-thread product at these blocks up to K = 2048:
// bench/gemm/amx_gemm_bench.cpp, bench/results/cpu/studies/amx_gemm-2026-12-05.txt) and reduced
// by cpu::ce::block_stats_vocab_major.
constexpr int64_t kLossRows = 256, kLossCols = 1024;
struct LossBlockScratch {};

struct LossOnlyChunk {
  const bf16_t* Hp;  // bf16 operands with AMX: the chunk's rows packed (cpu::amx::pack_pairs), or
  const bf16_t* Hb;  // bf16 operands, or
  const float* Hf;   // fp32 ones
  int64_t ldh;
  const bf16_t* Wb;
  const float* Wf;
  int64_t rows, V, H;
  cpu::ce::BlockStatsParams base;  // labels (of this chunk), ignore_index and the transforms
  cpu::ce::FinishBlockStatsParams finish;
};

void loss_only_chunk(const LossOnlyChunk& c, std::vector<cpu::ce::BlockStat>& stats) {
  const int64_t nb = (c.V + kLossCols - 1) / kLossCols;
  const int64_t ng = (c.rows + kLossRows - 1) / kLossRows;
  stats.resize(static_cast<size_t>(nb * c.rows));
  const size_t label_size = c.base.labels_int64 ? 8 : 4;
  cpu::parallel_for_dynamic(0, nb * ng, 1, [&](int64_t t0, int64_t t1) {
    float* z = cpu::thread_scratch<LossBlockScratch, float>().get(0, kLossRows * kLossCols);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / ng, g = t % ng;
      const int64_t v0 = b * kLossCols, nv = std::min(kLossCols, c.V - v0);
      const int64_t i0 = g * kLossRows, ni = std::min(kLossRows, c.rows - i0);
      cpu::ce::BlockStatsParams p = c.base;
      p.rows = ni;
      p.cols = nv;
      p.v0 = v0;
      p.labels = static_cast<const uint8_t*>(c.base.labels) + i0 * label_size;
      p.out = stats.data() + b * c.rows + i0;
      p.logits = z;
      if (c.Hp) {  // the block vocabulary-major: z[v][i]
        p.ld = cpu::amx::padded_rows(ni);
        cpu::amx::gemm_bat(c.Wb + v0 * c.H, c.H, nv, c.Hp + i0 * cpu::amx::padded_k(c.H), ni, c.H, z, p.ld);
        cpu::ce::block_stats_vocab_major(p);
        continue;
      }
      p.ld = nv;
      if (c.Hb)
        cpu::bgemm(false, true, ni, nv, c.H, c.Hb + i0 * c.ldh, c.ldh, c.Wb + v0 * c.H, c.H, false, z, nv);
      else
        cpu::sgemm(false, true, ni, nv, c.H, c.Hf + i0 * c.ldh, c.ldh, c.Wf + v0 * c.H, c.H, false, z, nv);
      cpu::ce::block_stats(p);
    }
  });
  cpu::ce::FinishBlockStatsParams f = c.finish;
  f.stats = stats.data();
  f.nblocks = nb;
  f.block_cols = kLossCols;
  f.rows = c.rows;
  f.vocab = c.V;
  cpu::ce::finish_block_stats(f);
}

void fwd(const Context& ctx, const ChunkLossFwdArgs& a) {
  const CrossEntropyOptions& o = a.options;
  const int64_t N = a.hidden.rows(), H = a.hidden.size(-1), V = a.weight.size(0);
  const DType dt = a.hidden.dtype();
  const bool f32 = dt == DType::kFloat32;
  const bool int64 = a.labels.dtype() == DType::kInt64;
  const bool want_grad = a.grad_hidden.defined() || a.grad_weight.defined();

  cpu::ce::RowBuffers rb(N);
  cpu::ce::ScaleParams sp{};
  sp.labels = a.labels.data();
  sp.labels_int64 = int64;
  sp.loss_weight = a.loss_weight.defined() ? a.loss_weight.data() : nullptr;
  sp.loss_weight_dtype = a.loss_weight.defined() ? a.loss_weight.dtype() : DType::kFloat32;
  sp.alpha_per_sample = a.alpha_per_sample.defined() ? a.alpha_per_sample.data_as<const float>() : nullptr;
  sp.rows_per_sample = a.alpha_per_sample.defined() ? a.hidden.size(1) : 1;
  sp.alpha = a.alpha;
  sp.rows = N;
  sp.ignore_index = o.ignore_index;
  sp.mean = o.reduction == LossReduction::kMean;
  sp.row_scale = rb.scale.data();
  sp.row_norm = rb.norm.data();
  cpu::ce::row_scales(sp);

  // bf16 products straight on the operands. Without gradients, the logits blocks on AMX tiles
  // where the CPU has them (cpu::amx, vocabulary-major; the chunk's rows packed once).
  const bool bf = dt == DType::kBFloat16;
  // Up to a hidden size of 2048: a block's 256 packed rows then fit half of a 2 MiB L2; at 4096 the
  // AMX product ran at 0.73-0.76x oneDNN's in two of three runs
  // (bench/results/cpu/studies/amx_gemm-2026-12-05.txt).
  constexpr int64_t kAmxMaxHidden = 2048;
  const bool amx = !want_grad && bf && H <= kAmxMaxHidden && cpu::amx::available();
  // fp32 operands.
  std::unique_ptr<float[]> w32_big, dw_big, z_big, h32_big, dh32_big;
  std::unique_ptr<bf16_t[]> gb_big;
  const float* W = nullptr;
  if (f32) {
    W = a.weight.data_as<const float>();
  } else if (!bf) {
    float* w32 = scratch(kSlotW32, V * H, w32_big);
    to_float_rows(a.weight.data(), dt, H, V, H, w32);
    W = w32;
  }
  const int64_t C = chunk_loss_chunk_rows(ctx, a);
  const int64_t ldh = a.hidden.row_stride();
  const int64_t Cn = std::min(C, N);
  // fp32 weight-gradient accumulator: the output itself when it is fp32. A bf16 output is written
  // by the last chunk's GEMM (bgemm_to_bf16: the earlier chunks' fp32 sum added, one rounding),
  // so with a single chunk there is no accumulator at all.
  const bool dw_to_bf16 = bf && a.grad_weight.defined() && a.grad_weight.dtype() == DType::kBFloat16;
  float* dw_own = nullptr;
  float* dW = nullptr;
  bool dw_started = false;
  if (a.grad_weight.defined()) {
    if (a.grad_weight.dtype() == DType::kFloat32) {
      dW = a.grad_weight.data_as<float>();
      dw_started = a.accumulate_grad_weight;
    } else if (!dw_to_bf16 || N > C) {
      dw_own = scratch(kSlotDw, V * H, dw_big);
      dW = dw_own;
    }
  }

  float* const z = scratch(kSlotZ, want_grad ? Cn * V : 0, z_big);
  std::vector<cpu::ce::BlockStat> block_stats;
  float* const h32 = scratch(kSlotH32, f32 || bf ? 0 : Cn * H, h32_big);
  // (bf16 dH is written by its GEMM.)
  float* const dh32 =
      scratch(kSlotDh32, (a.grad_hidden.defined() && !f32 && !bf) ? Cn * H : 0, dh32_big);
  bf16_t* const gb = scratch(kSlotGb, bf && want_grad ? Cn * V : 0, gb_big);
  std::unique_ptr<bf16_t[]> hp_big;
  bf16_t* const hp = scratch(kSlotHp, amx ? cpu::amx::padded_rows(Cn) * cpu::amx::padded_k(H) : 0, hp_big);
  const bf16_t* Wb = bf ? a.weight.data_as<const bf16_t>() : nullptr;
  const size_t label_size = int64 ? 8 : 4;
  for (int64_t r0 = 0; r0 < N; r0 += C) {
    const int64_t rows = std::min(C, N - r0);
    const float* Hc = nullptr;
    int64_t ldhc = H;
    const bf16_t* Hb = bf ? a.hidden.data_as<const bf16_t>() + r0 * ldh : nullptr;
    if (f32) {
      Hc = a.hidden.data_as<const float>() + r0 * ldh;
      ldhc = ldh;
    } else if (!bf) {
      to_float_rows(static_cast<const uint8_t*>(a.hidden.data()) + r0 * ldh * dtype_size(dt), dt, ldh,
                    rows, H, h32);
      Hc = h32;
      ldhc = H;
    }
    const void* chunk_labels = static_cast<const uint8_t*>(a.labels.data()) + r0 * label_size;
    if (!want_grad) {
      if (amx) cpu::amx::pack_pairs(Hb, ldh, rows, H, hp);
      LossOnlyChunk c{};
      c.Hp = amx ? hp : nullptr;
      c.Hb = Hb;
      c.Hf = Hc;
      c.ldh = bf ? ldh : ldhc;
      c.Wb = Wb;
      c.Wf = W;
      c.rows = rows;
      c.V = V;
      c.H = H;
      c.base.labels = chunk_labels;
      c.base.labels_int64 = int64;
      c.base.ignore_index = o.ignore_index;
      c.base.logit_scale = static_cast<float>(o.logit_scale);
      c.base.softcap = o.logit_softcapping ? static_cast<float>(*o.logit_softcapping) : 0.0f;
      c.base.label_smoothing = static_cast<float>(o.label_smoothing);
      c.finish.labels = chunk_labels;
      c.finish.labels_int64 = int64;
      c.finish.ignore_index = o.ignore_index;
      c.finish.label_smoothing = static_cast<float>(o.label_smoothing);
      c.finish.lse_square_scale = static_cast<float>(o.lse_square_scale);
      c.finish.row_loss = rb.loss.data() + r0;
      c.finish.row_z = rb.z.data() + r0;
      loss_only_chunk(c, block_stats);
      continue;
    }
    if (bf)
      cpu::bgemm(false, true, rows, V, H, Hb, ldh, Wb, H, false, z, V);
    else
      cpu::sgemm(false, true, rows, V, H, Hc, ldhc, W, H, false, z, V);

    cpu::ce::RowsParams rp{};
    rp.logits = z;
    rp.logits_dtype = DType::kFloat32;
    rp.logits_row_stride = V;
    // With bf16 GEMMs the cross-entropy writes the gradient G straight in bf16 (rounded once,
    // as the CUDA backend rounds it; the same bits as an fp32 G converted after it).
    rp.grad = bf ? static_cast<void*>(gb) : static_cast<void*>(z);
    rp.grad_dtype = bf ? DType::kBFloat16 : DType::kFloat32;
    rp.grad_row_stride = V;
    rp.labels = chunk_labels;
    rp.labels_int64 = int64;
    rp.row_scale = rb.scale.data() + r0;
    rp.row_loss = rb.loss.data() + r0;
    rp.row_z = rb.z.data() + r0;
    rp.rows = rows;
    rp.vocab = V;
    cpu::ce::set_options(rp, o);
    cpu::ce::rows(rp);

    if (bf) {
      // dH_c = G W and dW += G^T H_c.
      if (a.grad_hidden.defined())
        cpu::bgemm_to_bf16(false, false, rows, H, V, gb, V, Wb, H, nullptr, 0,
                           a.grad_hidden.data_as<bf16_t>() + r0 * H, H);
      if (dw_to_bf16 && r0 + rows == N) {
        cpu::bgemm_to_bf16(true, false, V, H, rows, gb, V, Hb, ldh, dw_started ? dW : nullptr, H,
                           a.grad_weight.data_as<bf16_t>(), H);
        dw_own = nullptr;  // written
      } else if (dW) {
        cpu::bgemm(true, false, V, H, rows, gb, V, Hb, ldh, dw_started, dW, H);
        dw_started = true;
      }
    } else if (a.grad_hidden.defined()) {
      if (f32) {
        cpu::sgemm(false, false, rows, H, V, z, V, W, H, false,
                   a.grad_hidden.data_as<float>() + r0 * H, H);
      } else {
        cpu::sgemm(false, false, rows, H, V, z, V, W, H, false, dh32, H);
        from_float_rows(dh32, rows, H,
                        static_cast<uint8_t*>(a.grad_hidden.data()) + r0 * H * dtype_size(dt), dt);
      }
    }
    if (dW && !bf) {
      cpu::sgemm(true, false, V, H, rows, z, V, Hc, ldhc, dw_started, dW, H);
      dw_started = true;
    }
  }
  if (N == 0 && dw_to_bf16) {  // no rows: a zero gradient
    bf16_t* out = a.grad_weight.data_as<bf16_t>();
    std::fill(out, out + static_cast<size_t>(V) * H, float_to_bf16(0.0f));
  }
  if (dW && !dw_started) std::fill(dW, dW + static_cast<size_t>(V) * H, 0.0f);  // no rows
  if (dw_own) from_float_rows(dw_own, V, H, a.grad_weight.data(), a.grad_weight.dtype());

  cpu::ce::finalize_outputs(rb, false, a.loss, a.z_loss, a.grad_loss_weight);
}

void scale_pair(const TensorView& saved, const TensorView& out, const float* g) {
  if (!saved.defined() || saved.numel() == 0) return;
  cpu::ce::ScaleRowsParams p{};
  p.in = saved.data();
  p.out = out.data();
  p.dtype = saved.dtype();
  p.rows = saved.ndim() >= 2 ? saved.rows() : 1;
  p.cols = saved.ndim() >= 1 ? saved.size(-1) : 1;
  p.g = g;
  p.per_row = false;
  cpu::ce::scale_rows(p);
}

void bwd(const Context&, const ChunkLossBwdArgs& a) {
  const float* g = a.grad_loss.data_as<const float>();
  scale_pair(a.saved_grad_hidden, a.grad_hidden, g);
  scale_pair(a.saved_grad_weight, a.grad_weight, g);
  cpu::ce::scale_loss_weight_grad(a.saved_grad_loss_weight, a.grad_loss_weight, g, false);
}

}  // namespace

void register_chunk_loss_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<ChunkLossFwdArgs>(kOp, Direction::kForward, spec, supports_fwd, fwd);
  r.add<ChunkLossBwdArgs>(kOp, Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
