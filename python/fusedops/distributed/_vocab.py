"""Vocabulary-parallel fused_cross_entropy_loss and chunk_loss (docs/distributed.md).

Each rank holds the logits (or the LM-head weight rows) of a contiguous slice of the vocabulary.
Per row, the shard's statistics (fused_cross_entropy_loss_shard_stats: max, sum of exponentials
below it, the target logit when the label falls in the shard, the sum of the logits) are combined
over the group by one MAX and one SUM all-reduce into the row's log-sum-exp, target logit and
logit sum over the whole vocabulary; the loss follows from them alone and is the same on every
rank. The backward hands the per-row gradients of those three values to the shard's gradient
kernel (fused_cross_entropy_loss_shard_bwd), which needs no communication; chunk_loss's hidden
gradient is then summed over the group (one SUM all-reduce).
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from ._comm import all_gather_rows, all_reduce

_OP = "cross_entropy_shard"

# Default memory for one chunk of fp32 logits in chunk_loss (chunk_loss's own defaults).
_BUDGET = {"cuda": 2 << 30, "cpu": 32 << 20}


def _acc(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def vocab_start_of(group: Optional[dist.ProcessGroup], shard: int, device: torch.device,
                   vocab_start: Optional[int]) -> int:
    """This rank's first vocabulary index: vocab_start when given, else the sum of the shard
    sizes of the ranks before it (one all-gather read on the host: a synchronization per call,
    which passing vocab_start avoids)."""
    if vocab_start is not None:
        if int(vocab_start) < 0:
            raise ValueError(f"fusedops: vocab_start must be >= 0, got {vocab_start}")
        return int(vocab_start)
    sizes = all_gather_rows(torch.tensor([shard], dtype=torch.int64, device=device), group).view(-1).tolist()
    return int(sum(sizes[: dist.get_rank(group)]))


def _combine(stats: Tensor, labels: Tensor, ignore_index: int, shard: int, group):
    """(lse, z_y, sum z, V) per row over the whole vocabulary from every rank's [N, 4] shard
    statistics: one MAX all-reduce of the row maxima, one SUM all-reduce of the packed rescaled
    sums, target logits, logit sums and shard sizes (V, the vocabulary size, without a host read)."""
    m = stats[:, 0].clone()
    all_reduce(m, dist.ReduceOp.MAX, group)
    packed = torch.stack((stats[:, 1] * torch.exp(stats[:, 0] - m), stats[:, 2], stats[:, 3],
                          torch.full_like(m, float(shard))), 1)
    all_reduce(packed, dist.ReduceOp.SUM, group)
    valid = labels.reshape(-1) != ignore_index
    # Ignored rows have zero statistics everywhere: lse 0 there instead of log(0).
    lse = m + torch.log(torch.where(valid, packed[:, 0], torch.ones_like(m)))
    return lse, packed[:, 1], packed[:, 2], packed[:, 3]


def _row_grads(lse: Tensor, d_lse, d_zy, d_sz) -> Tensor:
    z = torch.zeros_like(lse)
    return torch.stack((lse, z if d_lse is None else d_lse, z if d_zy is None else d_zy,
                        z if d_sz is None else d_sz), 1).contiguous()


class _ShardStats(torch.autograd.Function):
    """logits shard [N, Vs] -> (lse, z_y, sum z) [N] over the whole vocabulary."""

    @staticmethod
    def forward(ctx, logits, labels, group, start, ignore_index, scale, softcap, inplace):
        x = rows_view(logits).reshape(-1, logits.shape[-1])
        lab = labels.reshape(-1).contiguous()
        stats = torch.empty(x.shape[0], 4, dtype=_acc(logits), device=logits.device)
        _C.fused_cross_entropy_loss_shard_stats(context(_OP, x), x, lab, stats, start, ignore_index, scale, softcap)
        lse, zy, sz, vocab = _combine(stats, lab, ignore_index, logits.shape[-1], group)
        ctx.opts = (start, ignore_index, scale, softcap, inplace)
        ctx.save_for_backward(logits, lab, lse)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(vocab)
        return lse, zy, sz, vocab

    @staticmethod
    def backward(ctx, d_lse, d_zy, d_sz, _d_vocab):
        logits, lab, lse = ctx.saved_tensors
        start, ignore_index, scale, softcap, inplace = ctx.opts
        x = rows_view(logits).reshape(-1, logits.shape[-1])
        grad = logits if inplace and logits.is_contiguous() else torch.empty(logits.shape, dtype=logits.dtype,
                                                                             device=logits.device)
        _C.fused_cross_entropy_loss_shard_bwd(context(_OP, x), x, lab, _row_grads(lse, d_lse, d_zy, d_sz),
                                              grad.view(-1, logits.shape[-1]), start, ignore_index, scale, softcap)
        return grad, None, None, None, None, None, None, None


def _row_losses(lse, zy, sz, labels, vocab: Tensor, ignore_index: int, eps: float, lam: float):
    """Per row: (loss l_i, z-loss term, valid) as fused_cross_entropy_loss defines them (NaN for a
    label outside the vocabulary that is not ignore_index; 0 for ignored rows)."""
    lab = labels.reshape(-1)
    valid = lab != ignore_index
    loss = (1 - eps) * (lse - zy) + lam * lse * lse
    if eps != 0.0:  # as the single op: no smoothing term at all without smoothing
        loss = loss + eps * (lse - sz / vocab)
    in_range = (lab >= 0) & (lab < vocab)
    loss = torch.where(in_range, loss, torch.full_like(loss, math.nan))
    zero = torch.zeros_like(loss)
    return torch.where(valid, loss, zero), torch.where(valid, lam * lse * lse, zero), valid


def cross_entropy_tp(logits: Tensor, labels: Tensor, loss_weight: Optional[Tensor], *, ignore_index: int,
                     reduction: str, label_smoothing: float, logit_scale: float, logit_softcapping: Optional[float],
                     lse_square_scale: float, return_z_loss: bool, inplace_backward: bool, process_group,
                     vocab_start: Optional[int]):
    """fused_cross_entropy_loss over a vocabulary sharded along V (process_group given)."""
    op = "fused_cross_entropy_loss"
    if logits.dim() < 2:
        raise ValueError(f"fusedops: {op}: logits must have rank >= 2, got shape {list(logits.shape)}")
    if labels.numel() != logits.numel() // max(1, logits.shape[-1]):
        raise ValueError(f"fusedops: {op}: labels must have one entry per row of logits, got {list(labels.shape)} "
                         f"for logits {list(logits.shape)}")
    start = vocab_start_of(process_group, logits.shape[-1], logits.device, vocab_start)
    lse, zy, sz, vocab = _ShardStats.apply(logits, labels, process_group, start, int(ignore_index), float(logit_scale),
                                    None if logit_softcapping is None else float(logit_softcapping),
                                    bool(inplace_backward))
    loss, zl, valid = _row_losses(lse, zy, sz, labels, vocab, int(ignore_index), float(label_smoothing),
                                  float(lse_square_scale))
    w = None if loss_weight is None else loss_weight.reshape(-1).to(loss.dtype)
    wl = loss if w is None else w * loss
    if reduction == "none":
        out, z_out = wl.reshape(labels.shape), zl.reshape(labels.shape)
    else:
        norm = valid.sum().clamp_min(1).to(loss.dtype) if reduction == "mean" else 1.0
        out, z_out = wl.sum() / norm, zl.sum() / norm
    return (out, z_out.detach()) if return_z_loss else out


# ---------------------------------------------------------------------------------------------
# chunk_loss


def _mm(a: Tensor, b: Tensor, b32: Optional[Tensor] = None) -> Tensor:
    """a @ b with fp32 products and result (fp64 for fp64 operands) for b in the model's dtype and
    a in b's dtype or fp32 (a 16-bit b takes a rounded to it, as chunk_loss's gradient GEMMs do;
    on the CPU the 16-bit operands are widened instead: b32 is b in fp32 when already made)."""
    if b.dtype in (torch.float32, torch.float64):
        return a.to(b.dtype) @ b
    if b.is_cuda:
        return torch.mm(a.to(b.dtype), b, out_dtype=torch.float32)
    return a.float() @ (b32 if b32 is not None else b.float())


class _LinearShardStats(torch.autograd.Function):
    """(hidden [N, H], weight shard [Vs, H]) -> (lse, z_y, sum z) [N] over the whole vocabulary,
    the logits made one chunk of rows at a time (forward, and again in the backward)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, group, start, ignore_index, scale, softcap, chunk, buffer):
        N, Vs = hidden.shape[0], weight.shape[0]
        acc = _acc(hidden)
        w32 = weight.float() if hidden.device.type == "cpu" and hidden.dtype not in (torch.float32,
                                                                                   torch.float64) else None
        stats = torch.empty(N, 4, dtype=acc, device=hidden.device)
        for r0 in range(0, N, chunk):
            z = _mm(hidden[r0: r0 + chunk], weight.t(), None if w32 is None else w32.t())
            _C.fused_cross_entropy_loss_shard_stats(context(_OP, z), z, labels[r0: r0 + chunk],
                                                    stats[r0: r0 + chunk], start, ignore_index, scale, softcap)
        lse, zy, sz, vocab = _combine(stats, labels, ignore_index, Vs, group)
        ctx.opts = (group, start, ignore_index, scale, softcap, chunk, Vs)
        ctx.buffer = buffer
        ctx.save_for_backward(hidden, weight, labels, lse)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(vocab)
        return lse, zy, sz, vocab

    @staticmethod
    def backward(ctx, d_lse, d_zy, d_sz, _d_vocab):
        hidden, weight, labels, lse = ctx.saved_tensors
        group, start, ignore_index, scale, softcap, chunk, Vs = ctx.opts
        N = hidden.shape[0]
        acc = _acc(hidden)
        w32 = weight.float() if hidden.device.type == "cpu" and hidden.dtype not in (torch.float32,
                                                                                   torch.float64) else None
        rg = _row_grads(lse, d_lse, d_zy, d_sz)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1] or ctx.buffer is not None
        dh = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if want_h else None
        dw = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_w else None
        for r0 in range(0, N, chunk):
            h = hidden[r0: r0 + chunk]
            z = _mm(h, weight.t(), None if w32 is None else w32.t())
            _C.fused_cross_entropy_loss_shard_bwd(context(_OP, z), z, labels[r0: r0 + chunk], rg[r0: r0 + chunk], z,
                                                  start, ignore_index, scale, softcap)
            if dh is not None:
                dh[r0: r0 + chunk] = _mm(z, weight, w32)
            if dw is not None:
                dw += _mm(z.t(), h)
        if dh is not None:
            all_reduce(dh, dist.ReduceOp.SUM, group)
            dh = dh.to(hidden.dtype)
        if ctx.buffer is not None:
            ctx.buffer.add_(dw)
            dw = None
        elif dw is not None:
            dw = dw.to(weight.dtype)
        return dh, dw, None, None, None, None, None, None, None, None


def chunk_loss_tp(hidden: Tensor, weight: Tensor, labels: Tensor, loss_weight: Optional[Tensor], *,
                  chunk_size: Optional[int], ignore_index: int, reduction: str, alpha: Union[None, float, Tensor],
                  label_smoothing: float, lse_square_scale: float, softcap: Optional[float], logit_scale: float,
                  memory_budget: Optional[int], return_z_loss: bool, grad_weight_buffer: Optional[Tensor],
                  process_group, vocab_start: Optional[int]):
    """chunk_loss with the LM-head weight sharded along V (process_group given); the arguments
    were checked by chunk_loss."""
    op = "chunk_loss"
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"fusedops: {op}: weight must be [Vs, H] with H = {hidden.shape[-1]}, got "
                         f"{list(weight.shape)}")
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(f"fusedops: {op}: labels must have hidden's shape without H, {list(hidden.shape[:-1])}, "
                         f"got {list(labels.shape)}")
    if grad_weight_buffer is not None and (grad_weight_buffer.shape != weight.shape
                                           or grad_weight_buffer.dtype != torch.float32):
        raise ValueError(f"fusedops: {op}: grad_weight_buffer must be float32 of the weight shard's shape "
                         f"{list(weight.shape)}, got {grad_weight_buffer.dtype} {list(grad_weight_buffer.shape)}")
    start = vocab_start_of(process_group, weight.shape[0], weight.device, vocab_start)
    h2, lab = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1).contiguous()
    N = h2.shape[0]
    if chunk_size:
        chunk = int(chunk_size)
    else:
        budget = memory_budget or _BUDGET["cuda" if hidden.is_cuda else "cpu"]
        chunk = max(1, min(N, budget // max(1, weight.shape[0] * 4)))
    lse, zy, sz, vocab = _LinearShardStats.apply(h2, weight, lab, process_group, start, int(ignore_index),
                                          float(logit_scale), None if softcap is None else float(softcap),
                                          max(1, chunk), grad_weight_buffer)
    loss, zl, valid = _row_losses(lse, zy, sz, lab, vocab, int(ignore_index), float(label_smoothing),
                                  float(lse_square_scale))
    norm = valid.sum().clamp_min(1).to(loss.dtype) if reduction == "mean" else torch.ones((), dtype=loss.dtype,
                                                                                          device=loss.device)
    if isinstance(alpha, Tensor):
        per_row = alpha.to(loss.dtype).reshape(-1)
        per_row = per_row.expand(N) if per_row.numel() == 1 else per_row.repeat_interleave(N // per_row.numel())
        norm = norm * per_row
    elif alpha is not None:
        norm = norm * float(alpha)
    w = None if loss_weight is None else loss_weight.reshape(-1).to(loss.dtype)
    out = ((loss if w is None else w * loss) / norm).sum()
    z_out = (zl / norm).sum()
    return (out, z_out.detach()) if return_z_loss else out
