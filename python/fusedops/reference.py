"""The float64 references (the ``ref`` backend: plain loops in C++), differentiable.

Each function takes the arguments of its ``fusedops.<op>`` counterpart, computes in float64 on
the CPU, and returns float64 tensors on the input's device. Gradients flow back in the input's
dtype. Meant for tests and for checking results; slow by design.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C
from ._backend import context, rows_view


def _cpu64(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else rows_view(t.detach().to("cpu", torch.float64))


class _RmsNormWithoutWeight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, eps: float):
        x64 = _cpu64(x)
        y = torch.empty(x64.shape, dtype=torch.float64)
        rstd = torch.empty(x64.shape[:-1], dtype=torch.float64)
        _C.rmsnorm_without_weight_fwd(context("rmsnorm_without_weight", x64, "ref"), x64, y, rstd, eps)
        ctx.save_for_backward(x64, rstd)
        ctx.device, ctx.dtype = x.device, x.dtype
        return y.to(x.device), rstd.to(x.device)

    @staticmethod
    def backward(ctx, dy, drstd):
        x64, rstd = ctx.saved_tensors
        dx = torch.empty(x64.shape, dtype=torch.float64)
        _C.rmsnorm_without_weight_bwd(
            context("rmsnorm_without_weight", x64, "ref"), x64, rstd, _cpu64(dy),
            None if drstd is None else drstd.detach().to("cpu", torch.float64).contiguous(), dx)
        return dx.to(ctx.device, ctx.dtype), None


def rmsnorm_without_weight(x: Tensor, norm_eps: float = 1e-6, return_normalized: bool = False):
    """float64 reference of :func:`fusedops.rmsnorm_without_weight` (same return convention,
    every output float64)."""
    y, rstd = _RmsNormWithoutWeight.apply(x, float(norm_eps))
    return (y, rstd.unsqueeze(-1)) if return_normalized else rstd.unsqueeze(-1)


class _L2Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, eps: float):
        x64 = _cpu64(x)
        y = torch.empty(x64.shape, dtype=torch.float64)
        rstd = torch.empty(x64.shape[:-1], dtype=torch.float64)
        _C.l2norm_fwd(context("l2norm", x64, "ref"), x64, y, rstd, eps)
        ctx.save_for_backward(y, rstd)
        ctx.device, ctx.dtype = x.device, x.dtype
        return y.to(x.device)

    @staticmethod
    def backward(ctx, dy):
        y, rstd = ctx.saved_tensors
        dx = torch.empty(y.shape, dtype=torch.float64)
        _C.l2norm_bwd(context("l2norm", y, "ref"), y, rstd, _cpu64(dy), dx)
        return dx.to(ctx.device, ctx.dtype), None


def l2norm(x: Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None) -> Tensor:
    """float64 reference of :func:`fusedops.l2norm` (``output_dtype`` is ignored: float64 out)."""
    return _L2Norm.apply(x, float(eps))


def _cpu_copy(t: Optional[Tensor]) -> Optional[Tensor]:
    """The permutation references copy values: floating tensors go to float64 (exact), other
    dtypes keep theirs."""
    if t is None:
        return None
    t = t.detach().to("cpu")
    return (t.to(torch.float64) if t.is_floating_point() else t).contiguous()


class _SortChunksByIdx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp: Tensor, split_sizes: Tensor, sorted_index: Tensor, probs: Optional[Tensor]):
        x = _cpu_copy(inp)
        p = _cpu_copy(probs)
        sizes = split_sizes.detach().to("cpu").contiguous()
        order = sorted_index.detach().to("cpu").contiguous()
        out = torch.empty_like(x)
        p_out = torch.empty_like(p) if p is not None else None
        row_id_map = torch.empty(x.shape[0], dtype=torch.int32)
        _C.sort_chunks_by_idx_fwd(context("sort_chunks_by_idx", x, "ref"), x, sizes, order, p, out,
                                  p_out, row_id_map, None)
        ctx.save_for_backward(row_id_map)
        ctx.meta = (inp.device, inp.dtype, None if probs is None else probs.dtype)
        return out.to(inp.device), (p_out.to(inp.device) if p_out is not None else None)

    @staticmethod
    def backward(ctx, d_out, d_probs_out):
        (row_id_map,) = ctx.saved_tensors
        device, dtype, pdtype = ctx.meta
        g = _cpu_copy(d_out)
        gp = _cpu_copy(d_probs_out) if pdtype is not None and d_probs_out is not None else None
        d_inp = torch.empty_like(g)
        d_probs = torch.empty_like(gp) if gp is not None else None
        _C.sort_chunks_by_idx_bwd(context("sort_chunks_by_idx", g, "ref"), g, gp, row_id_map, d_inp,
                                  d_probs)
        return (d_inp.to(device, dtype), None, None,
                d_probs.to(device, pdtype) if d_probs is not None else None)


def sort_chunks_by_idx(inp: Tensor, split_sizes: Tensor, sorted_index: Tensor,
                       probs: Optional[Tensor] = None):
    """Reference of :func:`fusedops.sort_chunks_by_idx` (plain loops over docs/specs/ops.md section 6.3):
    ``(out, probs_out)``, float64 for floating inputs (the values are copied exactly), the input
    dtype otherwise; gradients flow back in the input dtypes."""
    return _SortChunksByIdx.apply(inp, split_sizes, sorted_index, probs)


def matmul_add(grad_output: Tensor, input: Tensor, main_grad: Tensor) -> Tensor:
    """float64 reference of :func:`fusedops.matmul_add`: returns ``main_grad + grad_output^T @
    input`` as a new float64 tensor on main_grad's device (main_grad itself is not modified)."""
    g = _cpu64(grad_output)
    x = _cpu64(input)
    acc = main_grad.detach().to("cpu", torch.float64).contiguous().clone()
    _C.matmul_add_fwd(context("matmul_add", acc, "ref"), g, x, acc, None)
    return acc.to(main_grad.device)


class _ClippedSwiglu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group_index: Optional[Tensor], args: tuple):
        x64 = x.detach().to("cpu", torch.float64).contiguous()
        gi = None if group_index is None else group_index.detach().to("cpu").contiguous()
        dim = args[0]
        shape = list(x64.shape)
        shape[dim] //= 2
        y = torch.zeros(shape, dtype=torch.float64)
        if y.numel():
            _C.clipped_swiglu_fwd(context("clipped_swiglu", x64, "ref"), x64, gi, y, *args)
        ctx.save_for_backward(x64)
        ctx.gi, ctx.args, ctx.device, ctx.dtype = gi, args, x.device, x.dtype
        return y.to(x.device)

    @staticmethod
    def backward(ctx, dy):
        (x64,) = ctx.saved_tensors
        dx = torch.zeros(x64.shape, dtype=torch.float64)
        if dx.numel():
            _C.clipped_swiglu_bwd(context("clipped_swiglu", x64, "ref"),
                                  dy.detach().to("cpu", torch.float64).contiguous(), x64, ctx.gi, dx,
                                  *ctx.args)
        return dx.to(ctx.device, ctx.dtype), None, None


def clipped_swiglu(x: Tensor, *, group_index: Optional[Tensor] = None, dim: int = -1,
                   alpha: float = 1.702, limit: float = 7.0, bias: float = 1.0,
                   interleaved: bool = True, clamp_mode: int = 0) -> Tensor:
    """float64 reference of :func:`fusedops.clipped_swiglu` (same arguments, float64 out)."""
    args = (int(dim), float(alpha), float(limit), float(bias), bool(interleaved), int(clamp_mode))
    return _ClippedSwiglu.apply(x, group_index, args)


class _FusedCrossEntropyLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, loss_weight: Optional[Tensor], ignore_index: int,
                reduction: str, label_smoothing: float, logit_scale: float,
                logit_softcapping: Optional[float], lse_square_scale: float):
        x64 = _cpu64(logits)
        lab = labels.detach().to("cpu").contiguous()
        w64 = None if loss_weight is None else loss_weight.detach().to("cpu", torch.float64).contiguous()
        shape = tuple(lab.shape) if reduction == "none" else ()
        loss = torch.empty(shape, dtype=torch.float64)
        z_loss = torch.empty(shape, dtype=torch.float64)
        grad = torch.empty(x64.shape, dtype=torch.float64)
        glw = torch.empty(lab.shape, dtype=torch.float64)
        _C.fused_cross_entropy_loss_fwd(context("fused_cross_entropy_loss", x64, "ref"), x64, lab, w64, loss,
                                        z_loss, grad, glw, None, ignore_index, reduction, label_smoothing,
                                        logit_scale, logit_softcapping, lse_square_scale)
        ctx.save_for_backward(grad, glw)
        ctx.reduction = reduction
        ctx.meta = (logits.device, logits.dtype, None if loss_weight is None else loss_weight.dtype)
        z_loss = z_loss.to(logits.device)
        ctx.mark_non_differentiable(z_loss)
        return loss.to(logits.device), z_loss

    @staticmethod
    def backward(ctx, g_loss, _g_z):
        grad, glw = ctx.saved_tensors
        g = g_loss.detach().to("cpu", torch.float64).contiguous()
        dlogits, dlw = torch.empty_like(grad), torch.empty_like(glw)
        _C.fused_cross_entropy_loss_bwd(context("fused_cross_entropy_loss", grad, "ref"), g, grad, dlogits,
                                        glw, dlw, ctx.reduction)
        dev, dt, wdt = ctx.meta
        return (dlogits.to(dev, dt), None, None if wdt is None else dlw.to(dev, wdt),
                None, None, None, None, None, None)


def fused_cross_entropy_loss(logits: Tensor, labels: Tensor, loss_weight: Optional[Tensor] = None, *,
                             ignore_index: int = -100, reduction: Optional[str] = None,
                             label_smoothing: float = 0.0, logit_scale: float = 1.0,
                             logit_softcapping: Optional[float] = None, lse_square_scale: float = 0.0,
                             return_z_loss: bool = False, inplace_backward: bool = False):
    """float64 reference of :func:`fusedops.fused_cross_entropy_loss` (same arguments and return
    convention, float64 outputs; ``inplace_backward`` is ignored)."""
    if reduction is None:
        reduction = "sum" if loss_weight is not None else "mean"
    loss, z_loss = _FusedCrossEntropyLoss.apply(
        logits, labels, loss_weight, int(ignore_index), reduction, float(label_smoothing),
        float(logit_scale), None if logit_softcapping is None else float(logit_softcapping),
        float(lse_square_scale))
    return (loss, z_loss) if return_z_loss else loss


class _ChunkLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, labels: Tensor, loss_weight: Optional[Tensor],
                alpha: float, alpha_per_sample: Optional[Tensor], ignore_index: int, reduction: str,
                label_smoothing: float, logit_scale: float, softcap: Optional[float],
                lse_square_scale: float):
        h = _cpu64(hidden)
        w = weight.detach().to("cpu", torch.float64).contiguous()
        lab = labels.detach().to("cpu").contiguous()
        lw = None if loss_weight is None else loss_weight.detach().to("cpu", torch.float64).contiguous()
        ap = None if alpha_per_sample is None else alpha_per_sample.detach().to("cpu", torch.float64).contiguous()
        loss = torch.empty((), dtype=torch.float64)
        z_loss = torch.empty((), dtype=torch.float64)
        dh = torch.empty(h.shape, dtype=torch.float64)
        dw = torch.empty(w.shape, dtype=torch.float64)
        glw = torch.empty(lab.shape, dtype=torch.float64)
        _C.chunk_loss_fwd(context("chunk_loss", h, "ref"), h, w, None, lab, lw, alpha, ap, loss, z_loss, dh, dw,
                          False, glw, 0, 0, None, ignore_index, reduction, label_smoothing, logit_scale,
                          softcap, lse_square_scale)
        ctx.save_for_backward(dh, dw, glw)
        ctx.meta = [(t.device, t.dtype) if t is not None else None for t in (hidden, weight, loss_weight)]
        z_loss = z_loss.to(hidden.device)
        ctx.mark_non_differentiable(z_loss)
        return loss.to(hidden.device), z_loss

    @staticmethod
    def backward(ctx, g_loss, _g_z):
        saved = ctx.saved_tensors
        g = g_loss.detach().to("cpu", torch.float64).contiguous()
        outs = [torch.empty_like(t) for t in saved]
        _C.chunk_loss_bwd(context("chunk_loss", saved[0], "ref"), g, saved[0], outs[0], saved[1], outs[1],
                          saved[2], outs[2])
        dh, dw, dlw = (None if m is None else o.to(*m) for o, m in zip(outs, ctx.meta))
        return (dh, dw, None, dlw) + (None,) * 8


def chunk_loss(hidden: Tensor, weight: Tensor, labels: Tensor, loss_weight: Optional[Tensor] = None, *,
               chunk_size: Optional[int] = None, ignore_index: int = -100, reduction: str = "sum",
               alpha=None, label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
               softcap: Optional[float] = None, bias: Optional[Tensor] = None, logit_scale: float = 1.0,
               memory_budget: Optional[int] = None, return_z_loss: bool = False):
    """float64 reference of :func:`fusedops.chunk_loss` (no chunking; float64 outputs)."""
    if bias is not None:
        raise ValueError("fusedops: chunk_loss: a bias is not supported")
    alpha_s, alpha_t = 1.0, None
    if isinstance(alpha, Tensor):
        alpha_t = alpha
        if alpha.dim() == 0:
            hidden = hidden.reshape(1, -1, hidden.shape[-1])
            labels = labels.reshape(1, -1)
            loss_weight = None if loss_weight is None else loss_weight.reshape(1, -1)
            alpha_t = alpha.reshape(1)
    elif alpha is not None:
        alpha_s = float(alpha)
    loss, z_loss = _ChunkLoss.apply(hidden, weight, labels, loss_weight, alpha_s, alpha_t, int(ignore_index),
                                    reduction, float(label_smoothing), float(logit_scale),
                                    None if softcap is None else float(softcap), float(lse_square_scale))
    return (loss, z_loss) if return_z_loss else loss


class _RmsNormGated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, z: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor],
                residual: Optional[Tensor], args: tuple):
        eps, group_size, norm_before_gate, act = args
        x64, z64, w64, b64, r64 = (_cpu64(t) for t in (x, z, weight, bias, residual))
        D = x64.shape[-1]
        g = group_size if group_size > 0 else D
        y = torch.zeros(x64.shape, dtype=torch.float64)
        rstd = torch.zeros(tuple(x64.shape[:-1]) + ((D // g) if g else 0,), dtype=torch.float64)
        res_out = torch.zeros(x64.shape, dtype=torch.float64) if r64 is not None else None
        if x64.numel():
            _C.rmsnorm_gated_fwd(context("rmsnorm_gated", x64, "ref"), x64, z64, w64, b64, r64, y, res_out,
                                 rstd, eps, group_size, norm_before_gate, act)
        ctx.save_for_backward(res_out if r64 is not None else x64, z64, w64, b64, rstd)
        ctx.meta = (args, [(t.device, t.dtype) if t is not None else None for t in (x, z, weight, bias, residual)])
        return y.to(x.device)

    @staticmethod
    def backward(ctx, dy):
        xs, z64, w64, b64, rstd = ctx.saved_tensors
        (eps, group_size, norm_before_gate, act), meta = ctx.meta
        dy64 = dy.detach().to("cpu", torch.float64).contiguous()
        dx = torch.zeros(xs.shape, dtype=torch.float64)
        dz = torch.zeros(xs.shape, dtype=torch.float64) if z64 is not None else None
        dw = torch.zeros(w64.shape, dtype=torch.float64) if w64 is not None else None
        db = torch.zeros(b64.shape, dtype=torch.float64) if b64 is not None else None
        if xs.numel():
            _C.rmsnorm_gated_bwd(context("rmsnorm_gated", xs, "ref"), dy64, xs, z64, w64, b64, rstd, None, dx,
                                 dz, dw, db, None, None, group_size, norm_before_gate, act)
        out = []
        for g, m in zip((dx, dz, dw, db, dx), meta):
            out.append(None if m is None or g is None else g.to(m[0], m[1]))
        return (*out, None)


def rms_norm_gated(x: Tensor, g: Optional[Tensor] = None, weight: Optional[Tensor] = None,
                   bias: Optional[Tensor] = None, activation: str = "swish",
                   residual: Optional[Tensor] = None, *, eps: float = 1e-6,
                   group_size: Optional[int] = None, norm_before_gate: bool = True,
                   z: Optional[Tensor] = None) -> Tensor:
    """float64 reference of :func:`fusedops.rms_norm_gated` (y only; with a residual the norm
    applies to ``x + residual`` in float64; ``z`` is an alias of ``g``). Gradients flow back in
    the inputs' dtypes."""
    if z is not None:
        g = z
    act = {"silu": 0, "swish": 0, "sigmoid": 1}[activation]
    args = (float(eps), 0 if group_size is None else int(group_size), bool(norm_before_gate), act)
    return _RmsNormGated.apply(x, g, weight, bias, residual, args)


class _CausalConv1d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, residual, initial_state, cu_seqlens, activation,
                output_final_state):
        def c64(t):
            return None if t is None else t.detach().to("cpu", torch.float64).contiguous()

        x64, w64, b64, h64 = c64(x), c64(weight), c64(bias), c64(initial_state)
        cu = None if cu_seqlens is None else cu_seqlens.detach().cpu().contiguous()
        n = x.shape[0] if cu is None else cu.shape[0] - 1
        d = 1
        for s in x.shape[2:]:
            d *= s
        y = torch.empty(x64.shape, dtype=torch.float64)
        final = torch.empty((n, d, weight.shape[0]), dtype=torch.float64)
        _C.causal_conv1d_fwd(context("causal_conv1d", x64, "ref"), x64, w64, b64, c64(residual),
                             h64, cu, y, final if output_final_state else None, activation)
        ctx.save_for_backward(x64, w64, b64, h64, cu)
        ctx.activation, ctx.output_final_state = activation, output_final_state
        ctx.meta = [(t.device, t.dtype) if t is not None else None
                    for t in (x, weight, bias, residual, initial_state)]
        out_final = final if output_final_state else final.new_empty(0)
        return y.to(x.device), out_final.to(x.device)

    @staticmethod
    def backward(ctx, dy, d_final):
        x64, w64, b64, h64, cu = ctx.saved_tensors
        dx = torch.empty(x64.shape, dtype=torch.float64)
        dw = torch.empty(w64.shape, dtype=torch.float64)
        db = None if b64 is None else torch.empty(b64.shape, dtype=torch.float64)
        dh0 = None if h64 is None else torch.empty(h64.shape, dtype=torch.float64)
        dy64 = (torch.zeros_like(x64) if dy is None
                else dy.detach().to("cpu", torch.float64).contiguous())
        dfin = (d_final.detach().to("cpu", torch.float64).contiguous()
                if ctx.output_final_state and d_final is not None else None)
        _C.causal_conv1d_bwd(context("causal_conv1d", x64, "ref"), x64, w64, b64, h64, cu, dy64,
                             dfin, dx, dw, db, dh0, None, ctx.activation)
        mx, mw, mb, mr, mh = ctx.meta

        def back(t, m):
            return None if t is None or m is None else t.to(m[0], m[1])

        dres = back(dy64, mr)
        return (back(dx, mx), back(dw, mw), back(db, mb), dres, back(dh0, mh), None, None, None)


def causal_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                  residual: Optional[Tensor] = None, initial_state: Optional[Tensor] = None,
                  output_final_state: bool = False, activation: Optional[str] = None, *,
                  cu_seqlens: Optional[Tensor] = None, weight_layout: str = "WD"):
    """float64 reference of :func:`fusedops.causal_conv1d` (same arguments; y and final_state
    float64)."""
    if weight_layout.upper() == "DW":
        weight = weight.t()
    y, final = _CausalConv1d.apply(x, weight, bias, residual, initial_state, cu_seqlens,
                                   activation or "", bool(output_final_state))
    return y, (final if output_final_state else None)


# ---- mHC family: sinkhorn, hc_split_sinkhorn, mhc_pre_bmm, mhc_post (docs/specs/ops.md 3 and 9) ----------


def _cpu64c(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.detach().to("cpu", torch.float64).contiguous()


class _Sinkhorn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, args: tuple):
        l64 = _cpu64c(logits)
        out = torch.empty(l64.shape, dtype=torch.float64)
        _C.sinkhorn_fwd(context("sinkhorn", l64, "ref"), l64, out, *args)
        ctx.save_for_backward(l64)
        ctx.args, ctx.device, ctx.dtype = args, logits.device, logits.dtype
        return out.to(logits.device)

    @staticmethod
    def backward(ctx, dout):
        (l64,) = ctx.saved_tensors
        dl = torch.empty(l64.shape, dtype=torch.float64)
        _C.sinkhorn_bwd(context("sinkhorn", l64, "ref"), l64, _cpu64c(dout), dl, *ctx.args)
        return dl.to(ctx.device, ctx.dtype), None


def sinkhorn(logits: Tensor, num_iters: int = 20, eps: float = 1e-6, variant: str = "mindspeed") -> Tensor:
    """float64 reference of :func:`fusedops.sinkhorn` (float64 out)."""
    return _Sinkhorn.apply(logits, (int(num_iters), float(eps), str(variant)))


class _HcSplitSinkhorn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mixes: Tensor, hc_scale: Tensor, hc_base: Tensor, args: tuple):
        m64, s64, b64 = _cpu64c(mixes), _cpu64c(hc_scale), _cpu64c(hc_base)
        n = args[0]
        lead = tuple(m64.shape[:-1])
        pre = torch.empty(lead + (n,), dtype=torch.float64)
        post = torch.empty(lead + (n,), dtype=torch.float64)
        comb = torch.empty(lead + (n, n), dtype=torch.float64)
        _C.hc_split_sinkhorn_fwd(context("hc_split_sinkhorn", m64, "ref"), m64, s64, b64, pre, post,
                                 comb, *args)
        ctx.save_for_backward(m64, s64, b64)
        ctx.args = args
        ctx.meta = [(t.device, t.dtype) for t in (mixes, hc_scale, hc_base)]
        dev = mixes.device
        return pre.to(dev), post.to(dev), comb.to(dev)

    @staticmethod
    def backward(ctx, dpre, dpost, dcomb):
        m64, s64, b64 = ctx.saved_tensors
        dm = torch.empty(m64.shape, dtype=torch.float64)
        ds = torch.empty(3, dtype=torch.float64)
        db = torch.empty(b64.shape, dtype=torch.float64)
        ws_bytes = _C.hc_split_sinkhorn_bwd_workspace_size(m64, ctx.args[0])
        ws = torch.empty(ws_bytes // 4, dtype=torch.float32) if ws_bytes else None
        _C.hc_split_sinkhorn_bwd(context("hc_split_sinkhorn", m64, "ref"), m64, s64, b64,
                                 _cpu64c(dpre), _cpu64c(dpost), _cpu64c(dcomb), dm, ds, db, ws,
                                 *ctx.args)
        grads = [g.to(dev, dt) for g, (dev, dt) in zip((dm, ds, db), ctx.meta)]
        return grads[0], grads[1], grads[2], None


def hc_split_sinkhorn(mixes: Tensor, hc_scale: Tensor, hc_base: Tensor, hc_mult: int = 4,
                      sinkhorn_iters: int = 20, eps: float = 1e-6, *, variant: str = "mindspeed"):
    """float64 reference of :func:`fusedops.hc_split_sinkhorn`: ``(pre, post, comb)`` in float64."""
    return _HcSplitSinkhorn.apply(mixes, hc_scale, hc_base,
                                  (int(hc_mult), int(sinkhorn_iters), float(eps), str(variant)))


class _MhcPreBmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_pre: Tensor, x: Tensor):
        h64, x64 = _cpu64c(h_pre), _cpu64c(x)
        y = torch.empty(x64.shape[:-2] + x64.shape[-1:], dtype=torch.float64)
        _C.mhc_pre_bmm_fwd(context("mhc_pre_bmm", x64, "ref"), h64, x64, y)
        ctx.save_for_backward(h64, x64)
        ctx.meta = [(t.device, t.dtype) for t in (h_pre, x)]
        return y.to(x.device)

    @staticmethod
    def backward(ctx, dy):
        h64, x64 = ctx.saved_tensors
        dh = torch.empty(h64.shape, dtype=torch.float64)
        dx = torch.empty(x64.shape, dtype=torch.float64)
        _C.mhc_pre_bmm_bwd(context("mhc_pre_bmm", x64, "ref"), h64, x64, _cpu64c(dy), dh, dx)
        return tuple(g.to(dev, dt) for g, (dev, dt) in zip((dh, dx), ctx.meta))


def mhc_pre_bmm(h_pre: Tensor, x: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """float64 reference of :func:`fusedops.mhc_pre_bmm` (``out_dtype`` ignored: float64 out)."""
    return _MhcPreBmm.apply(h_pre, x)


class _MhcPost(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, h_res: Tensor, h_out: Tensor, h_post: Tensor):
        ts = [_cpu64c(t) for t in (x, h_res, h_out, h_post)]
        out = torch.empty(ts[0].shape, dtype=torch.float64)
        _C.mhc_post_fwd(context("mhc_post", ts[0], "ref"), *ts, out)
        ctx.save_for_backward(*ts)
        ctx.meta = [(t.device, t.dtype) for t in (x, h_res, h_out, h_post)]
        return out.to(x.device)

    @staticmethod
    def backward(ctx, dy):
        ts = ctx.saved_tensors
        grads = [torch.empty(t.shape, dtype=torch.float64) for t in ts]
        _C.mhc_post_bwd(context("mhc_post", ts[0], "ref"), *ts, _cpu64c(dy), *grads)
        return tuple(g.to(dev, dt) for g, (dev, dt) in zip(grads, ctx.meta))


def mhc_post(x: Tensor, h_res: Tensor, h_out: Tensor, h_post: Tensor) -> Tensor:
    """float64 reference of :func:`fusedops.mhc_post` (float64 out)."""
    return _MhcPost.apply(x, h_res, h_out, h_post)


def _to64(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.to("cpu", torch.float64)


def _linear_attention64(op: str, args: tuple, kwargs: dict, backends: tuple):
    """The float64 reference of a linear-attention top level: the fusedops function ``op`` called
    with the same arguments (bound to its signature, so every positional form means what it means
    there), its floating tensors as float64 CPU copies and its integer ones (cu_seqlens) on the
    CPU, under the ``ref`` backend of ``backends``. Returns float64 ``(o, final_state)`` on q's
    device; gradients flow back in the inputs' dtypes."""
    import inspect

    from ._backend import use_backend
    from .ops import gated_delta_rule as gdn
    from .ops import kda

    fn = getattr(gdn if hasattr(gdn, op) else kda, op)
    bound = inspect.signature(fn).bind(*args, **kwargs)

    def cpu64(t):
        if not isinstance(t, Tensor):
            return t
        return t.to("cpu", torch.float64) if t.is_floating_point() else t.cpu()

    for name, value in bound.arguments.items():
        bound.arguments[name] = ({n: cpu64(t) for n, t in value.items()} if isinstance(value, dict) else cpu64(value))
    with use_backend(**{n: "ref" for n in backends}):
        o, ht = fn(*bound.args, **bound.kwargs)
    device = args[0].device if args else kwargs["q"].device
    return o.to(device), (None if ht is None else ht.to(device))


def chunk_gated_delta_rule(*args, **kwargs):
    """float64 reference of :func:`fusedops.chunk_gated_delta_rule` (its arguments): the same
    chunked pipeline run by the ``ref`` backend (float64 loops) on float64 copies of the inputs.
    Returns float64 ``(o, final_state)`` on the input's device; gradients flow back in the inputs'
    dtypes."""
    return _linear_attention64("chunk_gated_delta_rule", args, kwargs, ("chunk_gated_delta_rule", "l2norm"))


def fused_recurrent_gated_delta_rule(*args, **kwargs):
    """float64 reference of :func:`fusedops.fused_recurrent_gated_delta_rule` (its arguments):
    the per-token recurrence of the ``ref`` backend on float64 copies."""
    return _linear_attention64("fused_recurrent_gated_delta_rule", args, kwargs,
                               ("fused_recurrent_gated_delta_rule", "fused_recurrent_kda", "l2norm", "gdn_gate"))


def chunk_kda(*args, **kwargs):
    """float64 reference of :func:`fusedops.chunk_kda` (its arguments): the same chunked pipeline
    run by the ``ref`` backend (float64 loops) on float64 copies of the inputs. Returns float64
    ``(o, final_state)`` on the input's device; gradients flow back in the inputs' dtypes."""
    return _linear_attention64("chunk_kda", args, kwargs, ("chunk_kda", "l2norm"))


def fused_recurrent_kda(*args, **kwargs):
    """float64 reference of :func:`fusedops.fused_recurrent_kda` (its arguments): the per-token
    recurrence of the ``ref`` backend on float64 copies."""
    return _linear_attention64("fused_recurrent_kda", args, kwargs, ("fused_recurrent_kda", "l2norm", "kda_gate"))
