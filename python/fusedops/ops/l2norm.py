"""l2norm (docs/specs/ops.md section 8): the C++ core behind autograd (see fusedops._op)."""

from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from .._op import DifferentiableOp, PlainOp

_OP = "l2norm"


def _fwd_impl(x: Tensor, eps: float, output_dtype: Optional[torch.dtype]) -> tuple[Tensor, Tensor]:
    y = torch.empty(x.shape, dtype=output_dtype or x.dtype, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float64 if x.dtype == torch.float64 else torch.float32,
                       device=x.device)
    _C.l2norm_fwd(context(_OP, x), rows_view(x), y, rstd, eps)
    return y, rstd


def _fwd_fake(x: Tensor, eps: float, output_dtype: Optional[torch.dtype]) -> tuple[Tensor, Tensor]:
    rstd_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(x.shape, dtype=output_dtype or x.dtype), x.new_empty(x.shape[:-1], dtype=rstd_dtype)


def _bwd_impl(y: Tensor, rstd: Tensor, dy: Tensor, x_dtype: torch.dtype) -> Tensor:
    dx = torch.empty(y.shape, dtype=x_dtype, device=y.device)
    _C.l2norm_bwd(context(_OP, y), y, rstd, rows_view(dy.to(y.dtype)), dx)
    return dx


def _bwd_fake(y: Tensor, rstd: Tensor, dy: Tensor, x_dtype: torch.dtype) -> Tensor:
    return y.new_empty(y.shape, dtype=x_dtype)


_bwd = PlainOp("l2norm_bwd", _bwd_impl, _bwd_fake)


def _setup(ctx, inputs, output):
    ctx.x_dtype = inputs[0].dtype
    ctx.save_for_backward(output[0], output[1])
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, dy, _drstd):
    if dy is None:
        return None, None, None
    y, rstd = ctx.saved_tensors
    return _bwd(y, rstd, dy, ctx.x_dtype), None, None


_fwd = DifferentiableOp("l2norm_fwd", _fwd_impl, _fwd_fake, _setup, _backward)


def l2norm_fwd(x: Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None):
    """MindSpeed's arch32 launcher form: returns ``(y, rstd)`` with ``rstd`` float32 ``[...]``."""
    if x.dim() == 0:
        raise ValueError("fusedops: l2norm: x must have rank >= 1, got rank 0")
    return _fwd(x, float(eps), output_dtype)


def l2norm_bwd(y: Tensor, rstd: Tensor, dy: Tensor, eps: float = 1e-6, x_dtype: Optional[torch.dtype] = None):
    """MindSpeed's arch32 launcher form: ``dx = rstd * (dy - y * sum(dy * y, -1))``.
    ``eps`` is accepted for signature compatibility; the stored ``rstd`` already holds it."""
    return _bwd(y, rstd, dy, x_dtype or y.dtype)


def l2norm(x: Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None) -> Tensor:
    """``x / sqrt(sum(x**2, -1) + eps)`` over the last dimension (flash-linear-attention's
    signature). ``output_dtype`` sets y's dtype (default x's). Differentiable in x; the backward
    uses the saved y and rstd."""
    return l2norm_fwd(x, eps, output_dtype)[0]
