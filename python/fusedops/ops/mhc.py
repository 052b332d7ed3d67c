"""mHC family (docs/specs/ops.md sections 3 and 9),
as the ops of fusedops._op: an autograd.Function eagerly, torch.library custom ops under
torch.compile.

* ``sinkhorn(logits, num_iters=20, eps=1e-6, variant="mindspeed")``: Sinkhorn-Knopp
  normalisation of every [n, n] matrix of ``logits`` [..., n, n] (n <= 16);
* ``hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-6)``:
  the fused (pre, post, comb) of DeepSeek-V4 / MindSpeed; ``hc_head_split`` its head variant;
* ``mhc_pre_bmm(h_pre, x, out_dtype=torch.float32)``: y = sum_i h_pre[..., i] * x[..., i, :];
* ``mhc_post(x, h_res, h_out, h_post)`` (torch_npu / CANN order) and ``mhc_post_mindspeed``
  (MindSpeed-LLM ``MHCPostTriton`` / DeepSeek-V4 ``hc_post`` order).

Every backward is the exact derivative of the forward (Sinkhorn: of the unrolled iterations).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from .._op import DifferentiableOp, PlainOp

_VARIANTS = ("mindspeed", "deepseek", "log")


def _check_variant(op: str, variant: str) -> str:
    if variant not in _VARIANTS:
        raise ValueError(f'fusedops: {op}: variant must be one of "mindspeed", "deepseek", "log", '
                         f'got "{variant}"')
    return variant


def _param_dtype(t: Tensor, like: Tensor) -> torch.dtype:
    """Coefficient tensors go to the kernels in float32 (float64 only with float64 data, for the
    reference backend)."""
    return torch.float64 if (t.dtype == torch.float64 and like.dtype == torch.float64) else torch.float32


def _token_rows(t: Optional[Tensor], dtype: torch.dtype, square: bool = False) -> Optional[Tensor]:
    """An output gradient of hc_split_sinkhorn as the kernels read it: each token's values
    contiguous, the tokens at one stride. Column slices of one [tokens, (2+n)n] gradient pass as
    views; anything else is copied."""
    if t is None:
        return None
    t = t.to(dtype)
    if square and t.dim() >= 2:
        return rows_view(t.flatten(-2)).unflatten(-1, t.shape[-2:])
    return rows_view(t)


# ---------------------------------------------------------------------------------------------
# sinkhorn


def _sinkhorn_fwd_impl(logits: Tensor, num_iters: int, eps: float, variant: str) -> Tensor:
    lg = logits.contiguous()
    out = torch.empty(lg.shape, dtype=lg.dtype, device=lg.device)
    _C.sinkhorn_fwd(context("sinkhorn", lg), lg, out, num_iters, eps, variant)
    return out


def _sinkhorn_fwd_fake(logits: Tensor, num_iters: int, eps: float, variant: str) -> Tensor:
    return logits.new_empty(logits.shape)


def _sinkhorn_bwd_impl(logits: Tensor, dout: Tensor, num_iters: int, eps: float, variant: str) -> Tensor:
    lg = logits.contiguous()
    g = dout.to(lg.dtype).contiguous()
    dl = torch.empty(lg.shape, dtype=lg.dtype, device=lg.device)
    _C.sinkhorn_bwd(context("sinkhorn", lg), lg, g, dl, num_iters, eps, variant)
    return dl


def _sinkhorn_bwd_fake(logits: Tensor, dout: Tensor, num_iters: int, eps: float, variant: str) -> Tensor:
    return logits.new_empty(logits.shape)


_sinkhorn_bwd = PlainOp("sinkhorn_bwd", _sinkhorn_bwd_impl, _sinkhorn_bwd_fake)


def _sinkhorn_setup(ctx, inputs, output):
    logits, num_iters, eps, variant = inputs
    ctx.args = (num_iters, eps, variant)
    ctx.save_for_backward(logits)


def _sinkhorn_backward(ctx, dout):
    (logits,) = ctx.saved_tensors
    return _sinkhorn_bwd(logits, dout, *ctx.args), None, None, None


_sinkhorn_fwd = DifferentiableOp("sinkhorn_fwd", _sinkhorn_fwd_impl, _sinkhorn_fwd_fake,
                                 _sinkhorn_setup, _sinkhorn_backward)


def sinkhorn(logits: Tensor, num_iters: int = 20, eps: float = 1e-6, variant: str = "mindspeed") -> Tensor:
    """Sinkhorn-Knopp normalisation of every [n, n] matrix of ``logits`` [..., n, n] (log-space
    input, n <= 16), computed in fp32 (fp64 on the reference backend) and returned in the input
    dtype. Rows are normalised along the last axis, columns along the second-to-last; the result
    ends on a column step (columns sum to ~1).

    ``variant``: ``"mindspeed"`` (K = exp(L - rowmax), then ``num_iters`` times row / column
    normalisation with ``eps`` added to every denominator), ``"deepseek"`` (softmax_row(L) + eps,
    a column step, then ``num_iters - 1`` row / column steps; DeepSeek-V4 / torch_npu) or
    ``"log"`` (log-domain potentials, no eps; TransformerEngine). Differentiable: the backward is
    the exact derivative of the unrolled iterations (rowmax treated as a constant).
    """
    _check_variant("sinkhorn", variant)
    if logits.dim() < 2:
        raise ValueError(f"fusedops: sinkhorn: logits must have rank >= 2 ([..., n, n]), got rank {logits.dim()}")
    return _sinkhorn_fwd(logits, int(num_iters), float(eps), variant)


# ---------------------------------------------------------------------------------------------
# hc_split_sinkhorn


def _split_fwd_impl(mixes: Tensor, hc_scale: Tensor, hc_base: Tensor, hc_mult: int, sinkhorn_iters: int,
                    eps: float, variant: str) -> tuple[Tensor, Tensor, Tensor]:
    m = rows_view(mixes)
    pdt = _param_dtype(hc_scale, mixes)
    lead = tuple(mixes.shape[:-1])
    pre = torch.empty(lead + (hc_mult,), dtype=mixes.dtype, device=mixes.device)
    post = torch.empty(lead + (hc_mult,), dtype=mixes.dtype, device=mixes.device)
    comb = torch.empty(lead + (hc_mult, hc_mult), dtype=mixes.dtype, device=mixes.device)
    _C.hc_split_sinkhorn_fwd(context("hc_split_sinkhorn", mixes), m, hc_scale.to(pdt).contiguous(),
                             hc_base.to(pdt).contiguous(), pre, post, comb, hc_mult, sinkhorn_iters,
                             eps, variant)
    return pre, post, comb


def _split_fwd_fake(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps, variant):
    lead = tuple(mixes.shape[:-1])
    return (mixes.new_empty(lead + (hc_mult,)), mixes.new_empty(lead + (hc_mult,)),
            mixes.new_empty(lead + (hc_mult, hc_mult)))


def _split_bwd_impl(mixes: Tensor, hc_scale: Tensor, hc_base: Tensor, dpre: Optional[Tensor],
                    dpost: Optional[Tensor], dcomb: Optional[Tensor], hc_mult: int, sinkhorn_iters: int,
                    eps: float, variant: str) -> tuple[Tensor, Tensor, Tensor]:
    m = rows_view(mixes)
    pdt = _param_dtype(hc_scale, mixes)
    dmixes = torch.empty(mixes.shape, dtype=mixes.dtype, device=mixes.device)
    dscale = torch.empty(3, dtype=pdt, device=mixes.device)
    dbase = torch.empty(hc_base.shape, dtype=pdt, device=mixes.device)
    ws_bytes = _C.hc_split_sinkhorn_bwd_workspace_size(m, hc_mult) if mixes.dim() >= 1 else 0
    ws = torch.empty(ws_bytes // 4, dtype=torch.float32, device=mixes.device) if ws_bytes else None
    _C.hc_split_sinkhorn_bwd(context("hc_split_sinkhorn", mixes), m, hc_scale.to(pdt).contiguous(),
                             hc_base.to(pdt).contiguous(), _token_rows(dpre, mixes.dtype),
                             _token_rows(dpost, mixes.dtype), _token_rows(dcomb, mixes.dtype, True), dmixes, dscale,
                             dbase, ws, hc_mult, sinkhorn_iters, eps, variant)
    return dmixes, dscale.to(hc_scale.dtype), dbase.to(hc_base.dtype)


def _split_bwd_fake(mixes, hc_scale, hc_base, dpre, dpost, dcomb, hc_mult, sinkhorn_iters, eps, variant):
    return mixes.new_empty(mixes.shape), hc_scale.new_empty(hc_scale.shape), hc_base.new_empty(hc_base.shape)


_split_bwd = PlainOp("hc_split_sinkhorn_bwd", _split_bwd_impl, _split_bwd_fake)


def _split_setup(ctx, inputs, output):
    mixes, hc_scale, hc_base, hc_mult, iters, eps, variant = inputs
    ctx.args = (hc_mult, iters, eps, variant)
    ctx.save_for_backward(mixes, hc_scale, hc_base)


def _split_backward(ctx, dpre, dpost, dcomb):
    mixes, hc_scale, hc_base = ctx.saved_tensors
    dm, ds, db = _split_bwd(mixes, hc_scale, hc_base, dpre, dpost, dcomb, *ctx.args)
    return dm, ds, db, None, None, None, None


_split_fwd = DifferentiableOp("hc_split_sinkhorn_fwd", _split_fwd_impl, _split_fwd_fake,
                              _split_setup, _split_backward)


def hc_split_sinkhorn(mixes: Tensor, hc_scale: Tensor, hc_base: Tensor, hc_mult: int = 4,
                      sinkhorn_iters: int = 20, eps: float = 1e-6, *, variant: str = "mindspeed"):
    """The fused mHC coefficient split of DeepSeek-V4 / MindSpeed (docs/specs/ops.md 3.4).

    ``mixes`` [..., (2+n)n] (layout ``[pre(n) | post(n) | res(n*n)]``), ``hc_scale`` [3] =
    (a_pre, a_post, a_res), ``hc_base`` [(2+n)n]. Returns ``(pre, post, comb)`` in mixes' dtype:

    * ``pre  = sigmoid(a_pre * m_pre + b_pre) + eps``            [..., n]
    * ``post = 2 * sigmoid(a_post * m_post + b_post)``          [..., n]
    * ``comb = sinkhorn(a_res * m_res + b_res, sinkhorn_iters, eps, variant)``   [..., n, n]

    ``n = hc_mult`` in [1, 16]. ``variant`` (keyword only, an extension) picks the Sinkhorn
    schedule as in :func:`sinkhorn`. Differentiable in mixes, hc_scale and hc_base; the
    parameter gradients are reduced over the rows deterministically (two fixed-order stages).
    """
    _check_variant("hc_split_sinkhorn", variant)
    if mixes.dim() < 1:
        raise ValueError("fusedops: hc_split_sinkhorn: mixes must have rank >= 1, got rank 0")
    return _split_fwd(mixes, hc_scale, hc_base, int(hc_mult), int(sinkhorn_iters), float(eps), variant)


def hc_head_split(mixes: Tensor, hc_scale: Tensor, hc_base: Tensor, eps: float = 1e-6) -> Tensor:
    """Head variant of :func:`hc_split_sinkhorn` (DeepSeek-V4 ``hc_head``, last layer): ``mixes``
    [..., n], ``hc_scale`` [1], ``hc_base`` [n]; returns ``pre = sigmoid(a * mixes + b) + eps`` in
    mixes' dtype. A plain PyTorch composite (n elements per token: nothing to fuse);
    differentiable through torch autograd."""
    if hc_scale.numel() != 1:
        raise ValueError(f"fusedops: hc_head_split: hc_scale must have shape [1], got {list(hc_scale.shape)}")
    if hc_base.dim() != 1 or hc_base.shape[0] != mixes.shape[-1]:
        raise ValueError(f"fusedops: hc_head_split: hc_base must have shape [n] = [{mixes.shape[-1]}], "
                         f"got {list(hc_base.shape)}")
    pdt = _param_dtype(hc_scale, mixes)
    u = hc_scale.to(pdt).reshape(()) * mixes.to(pdt) + hc_base.to(pdt)
    return (torch.sigmoid(u) + eps).to(mixes.dtype)


# ---------------------------------------------------------------------------------------------
# mhc_pre_bmm


def _streams_view(x: Tensor) -> Tensor:
    """x with its [tokens * n, C] rows addressable with one stride (else a contiguous copy)."""
    return rows_view(x)


def _pre_fwd_impl(h_pre: Tensor, x: Tensor, out_dtype: torch.dtype) -> Tensor:
    xs = _streams_view(x)
    y = torch.empty(x.shape[:-2] + x.shape[-1:], dtype=out_dtype, device=x.device)
    _C.mhc_pre_bmm_fwd(context("mhc_pre_bmm", x), h_pre.to(_param_dtype(h_pre, x)).contiguous(), xs, y)
    return y


def _pre_fwd_fake(h_pre: Tensor, x: Tensor, out_dtype: torch.dtype) -> Tensor:
    return x.new_empty(x.shape[:-2] + x.shape[-1:], dtype=out_dtype)


def _pre_bwd_impl(h_pre: Tensor, x: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
    pdt = _param_dtype(h_pre, x)
    dh = torch.empty(h_pre.shape, dtype=pdt, device=x.device)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.mhc_pre_bmm_bwd(context("mhc_pre_bmm", x), h_pre.to(pdt).contiguous(), _streams_view(x),
                       rows_view(dy), dh, dx)
    return dh.to(h_pre.dtype), dx


def _pre_bwd_fake(h_pre: Tensor, x: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
    return h_pre.new_empty(h_pre.shape), x.new_empty(x.shape)


_pre_bwd = PlainOp("mhc_pre_bmm_bwd", _pre_bwd_impl, _pre_bwd_fake)


def _pre_setup(ctx, inputs, output):
    h_pre, x, _ = inputs
    ctx.save_for_backward(h_pre, x)


def _pre_backward(ctx, dy):
    h_pre, x = ctx.saved_tensors
    dh, dx = _pre_bwd(h_pre, x, dy)
    return dh, dx, None


_pre_fwd = DifferentiableOp("mhc_pre_bmm_fwd", _pre_fwd_impl, _pre_fwd_fake, _pre_setup,
                            _pre_backward)


def mhc_pre_bmm(h_pre: Tensor, x: Tensor, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """mHC pre-mixing (docs/specs/ops.md 9.2): ``y[..., c] = sum_i h_pre[..., i] * x[..., i, c]``.

    ``x`` [B, T, n, C] or [T, n, C] (fp32/bf16/fp16), ``h_pre`` [..., n] (fp32; other float
    dtypes are upcast). Any n (n = 4 is the fast path). fp32 accumulation; ``y`` [..., C] in
    ``out_dtype`` (float32 by default, as MindSpeed returns it). Differentiable: ``dx`` in x's
    dtype, ``dh_pre`` per token in fp32 (cast to h_pre's dtype).
    """
    return _pre_fwd(h_pre, x, out_dtype)


# ---------------------------------------------------------------------------------------------
# mhc_post


def _post_fwd_impl(x: Tensor, h_res: Tensor, h_out: Tensor, h_post: Tensor) -> Tensor:
    pdt = _param_dtype(h_res, x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.mhc_post_fwd(context("mhc_post", x), _streams_view(x), h_res.to(pdt).contiguous(),
                    rows_view(h_out), h_post.to(pdt).contiguous(), out)
    return out


def _post_fwd_fake(x: Tensor, h_res: Tensor, h_out: Tensor, h_post: Tensor) -> Tensor:
    return x.new_empty(x.shape)


def _post_bwd_impl(x: Tensor, h_res: Tensor, h_out: Tensor, h_post: Tensor,
                   dy: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    pdt = _param_dtype(h_res, x)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dh_res = torch.empty(h_res.shape, dtype=pdt, device=x.device)
    dh_out = torch.empty(h_out.shape, dtype=h_out.dtype, device=x.device)
    dh_post = torch.empty(h_post.shape, dtype=pdt, device=x.device)
    _C.mhc_post_bwd(context("mhc_post", x), _streams_view(x), h_res.to(pdt).contiguous(),
                    rows_view(h_out), h_post.to(pdt).contiguous(), rows_view(dy.to(x.dtype)), dx,
                    dh_res, dh_out, dh_post)
    return dx, dh_res.to(h_res.dtype), dh_out, dh_post.to(h_post.dtype)


def _post_bwd_fake(x, h_res, h_out, h_post, dy):
    return x.new_empty(x.shape), h_res.new_empty(h_res.shape), h_out.new_empty(h_out.shape), \
        h_post.new_empty(h_post.shape)


_post_bwd = PlainOp("mhc_post_bwd", _post_bwd_impl, _post_bwd_fake)


def _post_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _post_backward(ctx, dy):
    return _post_bwd(*ctx.saved_tensors, dy)


_post_fwd = DifferentiableOp("mhc_post_fwd", _post_fwd_impl, _post_fwd_fake, _post_setup,
                             _post_backward)


def mhc_post(x: Tensor, h_res: Tensor, h_out: Tensor, h_post: Tensor) -> Tensor:
    """mHC post-mixing (docs/specs/ops.md 9.3, torch_npu / CANN argument order):

    ``out[..., k, c] = h_post[..., k] * h_out[..., c] + sum_j h_res[..., j, k] * x[..., j, c]``

    ``x`` [B, T, n, C] or [T, n, C] residual streams (fp32/bf16/fp16), ``h_res`` [..., n, n] (row
    j = source stream, column k = destination), ``h_out`` [..., C] the sub-layer output in x's
    dtype, ``h_post`` [..., n]; coefficients fp32 (other float dtypes upcast). fp32
    accumulation, output in x's dtype. Differentiable in all four; ``dh_res`` / ``dh_post`` are
    per token, computed in fp32.
    """
    return _post_fwd(x, h_res, h_out, h_post)


def mhc_post_mindspeed(h_out: Tensor, x: Tensor, h_post: Tensor, h_res: Tensor) -> Tensor:
    """:func:`mhc_post` with MindSpeed-LLM's ``MHCPostTriton.apply(x, residual, h_post, h_res)``
    argument order (also DeepSeek-V4's ``hc_post(x, residual, post, comb)``): the sub-layer
    output first, then the residual streams, h_post, h_res."""
    return _post_fwd(x, h_res, h_out, h_post)
