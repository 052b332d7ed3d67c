"""rmsnorm_without_weight (ops.md section 2) as torch.library custom ops with autograd."""


from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view

_OP = "rmsnorm_without_weight"


@torch.library.custom_op("fusedops::rmsnorm_without_weight_fwd", mutates_args=())
def _fwd(x: Tensor, eps: float, return_normalized: bool) -> tuple[Tensor, Tensor]:
    xr = rows_view(x)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if return_normalized else x.new_empty(0)
    _C.rmsnorm_without_weight_fwd(context(_OP, x), xr, y if return_normalized else None, rstd, eps)
    return y, rstd


@_fwd.register_fake
def _(x: Tensor, eps: float, return_normalized: bool) -> tuple[Tensor, Tensor]:
    y = x.new_empty(x.shape) if return_normalized else x.new_empty(0)
    return y, x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("fusedops::rmsnorm_without_weight_bwd", mutates_args=())
def _bwd(x: Tensor, rstd: Tensor, dy: Optional[Tensor], drstd: Optional[Tensor]) -> Tensor:
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dy = rows_view(dy.to(x.dtype)) if dy is not None else None
    drstd = drstd.to(torch.float32).contiguous() if drstd is not None else None
    _C.rmsnorm_without_weight_bwd(context(_OP, x), rows_view(x), rstd, dy, drstd, dx)
    return dx


@_bwd.register_fake
def _(x: Tensor, rstd: Tensor, dy: Optional[Tensor], drstd: Optional[Tensor]) -> Tensor:
    return x.new_empty(x.shape)


def _setup(ctx, inputs, output):
    x, _, return_normalized = inputs
    ctx.return_normalized = return_normalized
    ctx.save_for_backward(x, output[1])


def _backward(ctx, dy, drstd):
    x, rstd = ctx.saved_tensors
    if not ctx.return_normalized:
        dy = None
    return _bwd(x, rstd, dy, drstd), None, None


torch.library.register_autograd("fusedops::rmsnorm_without_weight_fwd", _backward, setup_context=_setup)


def rmsnorm_without_weight(x: Tensor, norm_eps: float = 1e-6, return_normalized: bool = False):
    """RMSNorm without a weight over the last dimension.

    ``r = (mean(x**2, -1) + norm_eps) ** -0.5``.

    * ``return_normalized=False`` (the DeepSeek-V4 use, MindSpeed-LLM's signature): returns ``r``
      of shape ``[..., 1]`` in x's dtype.
    * ``return_normalized=True``: returns ``(x * r, rstd)`` with ``rstd`` of shape ``[..., 1]``
      in float32.

    Differentiable in x through every returned tensor. fp32/bf16/fp16 (fp64 through the
    reference backend); any leading dims; fp32 math.
    """
    if x.dim() == 0:
        raise ValueError("fusedops: rmsnorm_without_weight: x must have rank >= 1, got rank 0")
    y, rstd = _fwd(x, float(norm_eps), bool(return_normalized))
    if return_normalized:
        return y, rstd.unsqueeze(-1)
    return rstd.unsqueeze(-1).to(x.dtype)
