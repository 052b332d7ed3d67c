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
