"""rmsnorm_without_weight (docs/specs/ops.md section 2): the C++ core behind autograd (see fusedops._op)."""

from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from .._op import DifferentiableOp, PlainOp

_OP = "rmsnorm_without_weight"


def _rstd_dtype(x: Tensor) -> torch.dtype:
    # float64 inputs (the ref backend) keep rstd in float64; everything else computes it in fp32.
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _fwd_impl(x: Tensor, eps: float, return_normalized: bool) -> tuple[Tensor, Tensor]:
    rstd = torch.empty(x.shape[:-1], dtype=_rstd_dtype(x), device=x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if return_normalized else x.new_empty(0)
    _C.rmsnorm_without_weight_fwd(context(_OP, x), rows_view(x), y if return_normalized else None, rstd, eps)
    return y, rstd


def _fwd_fake(x: Tensor, eps: float, return_normalized: bool) -> tuple[Tensor, Tensor]:
    y = x.new_empty(x.shape) if return_normalized else x.new_empty(0)
    return y, x.new_empty(x.shape[:-1], dtype=_rstd_dtype(x))


def _bwd_impl(x: Tensor, rstd: Tensor, dy: Optional[Tensor], drstd: Optional[Tensor]) -> Tensor:
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dy = rows_view(dy.to(x.dtype)) if dy is not None else None
    drstd = drstd.to(rstd.dtype).contiguous() if drstd is not None else None
    _C.rmsnorm_without_weight_bwd(context(_OP, x), rows_view(x), rstd, dy, drstd, dx)
    return dx


def _bwd_fake(x: Tensor, rstd: Tensor, dy: Optional[Tensor], drstd: Optional[Tensor]) -> Tensor:
    return x.new_empty(x.shape)


_bwd = PlainOp("rmsnorm_without_weight_bwd", _bwd_impl, _bwd_fake)


def _setup(ctx, inputs, output):
    x, _, return_normalized = inputs
    ctx.return_normalized = return_normalized
    ctx.save_for_backward(x, output[1])


def _backward(ctx, dy, drstd):
    x, rstd = ctx.saved_tensors
    if not ctx.return_normalized:
        dy = None
    if dy is None and drstd is None:
        return None, None, None
    return _bwd(x, rstd, dy, drstd), None, None


_fwd = DifferentiableOp("rmsnorm_without_weight_fwd", _fwd_impl, _fwd_fake, _setup, _backward)


def rmsnorm_without_weight(x: Tensor, norm_eps: float = 1e-6, return_normalized: bool = False):
    """RMSNorm without a weight over the last dimension.

    ``r = (mean(x**2, -1) + norm_eps) ** -0.5``.

    * ``return_normalized=False`` (the DeepSeek-V4 use, MindSpeed-LLM's signature): returns ``r``
      of shape ``[..., 1]`` in x's dtype.
    * ``return_normalized=True``: returns ``(x * r, rstd)`` with ``rstd`` of shape ``[..., 1]``
      in float32 (float64 for float64 inputs).

    Differentiable in x through every returned tensor. fp32/bf16/fp16 (fp64 through the
    reference backend); any leading dims; fp32 math.
    """
    if x.dim() == 0:
        raise ValueError("fusedops: rmsnorm_without_weight: x must have rank >= 1, got rank 0")
    y, rstd = _fwd(x, float(norm_eps), bool(return_normalized))
    if return_normalized:
        return y, rstd.unsqueeze(-1)
    return rstd.unsqueeze(-1).to(x.dtype)
