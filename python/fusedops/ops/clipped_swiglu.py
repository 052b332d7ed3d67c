"""clipped_swiglu (docs/specs/ops.md section 7),
as the ops of fusedops._op: an autograd.Function eagerly, torch.library custom ops under
torch.compile."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context
from .._op import DifferentiableOp, PlainOp

_OP = "clipped_swiglu"


def _out_shape(x: Tensor, dim: int) -> list[int]:
    shape = list(x.shape)
    shape[dim] //= 2
    return shape


def _check(x: Tensor, dim: int, limit: float, clamp_mode: int) -> None:
    """The value checks of the C++ entry point, repeated here for inputs that never reach it
    (empty tensors return without a kernel call)."""
    rank = x.dim()
    if rank == 0:
        raise ValueError("fusedops: clipped_swiglu: x must have rank >= 1, got rank 0")
    if not -rank <= dim < rank:
        raise ValueError(f"fusedops: clipped_swiglu: dim must be in [{-rank}, {rank}) for x of rank "
                         f"{rank}, got {dim}")
    if x.shape[dim] % 2:
        raise ValueError(f"fusedops: clipped_swiglu: x.shape[dim] (the split size) must be even, got "
                         f"{x.shape[dim]} at dim {dim} of shape {list(x.shape)}")
    if not (limit > 0 and limit != float("inf")):
        raise ValueError(f"fusedops: clipped_swiglu: limit must be a finite number > 0, got {limit}")
    if clamp_mode not in (0, 1):
        raise ValueError(f"fusedops: clipped_swiglu: clamp_mode must be 0 or 1, got {clamp_mode}")


def _fwd_impl(x: Tensor, group_index: Optional[Tensor], dim: int, alpha: float, limit: float, bias: float,
              interleaved: bool, clamp_mode: int) -> Tensor:
    y = torch.empty(_out_shape(x, dim), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        _check(x, dim, limit, clamp_mode)
        return y
    gi = group_index.contiguous() if group_index is not None else None
    _C.clipped_swiglu_fwd(context(_OP, x), x.contiguous(), gi, y, dim, alpha, limit, bias,
                          interleaved, clamp_mode)
    return y


def _fwd_fake(x, group_index, dim, alpha, limit, bias, interleaved, clamp_mode):
    return x.new_empty(_out_shape(x, dim))


def _bwd_impl(dy: Tensor, x: Tensor, group_index: Optional[Tensor], dim: int, alpha: float, limit: float,
              bias: float, interleaved: bool, clamp_mode: int) -> Tensor:
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if dx.numel() == 0:
        _check(x, dim, limit, clamp_mode)
        return dx
    gi = group_index.contiguous() if group_index is not None else None
    _C.clipped_swiglu_bwd(context(_OP, x), dy.to(x.dtype).contiguous(), x.contiguous(), gi, dx, dim,
                          alpha, limit, bias, interleaved, clamp_mode)
    return dx


def _bwd_fake(dy, x, group_index, dim, alpha, limit, bias, interleaved, clamp_mode):
    return x.new_empty(x.shape)


_bwd = PlainOp("clipped_swiglu_bwd", _bwd_impl, _bwd_fake)


def _setup(ctx, inputs, output):
    x, group_index, dim, alpha, limit, bias, interleaved, clamp_mode = inputs
    ctx.save_for_backward(x, group_index)
    ctx.args = (dim, alpha, limit, bias, interleaved, clamp_mode)


def _backward(ctx, dy):
    x, group_index = ctx.saved_tensors
    dx = _bwd(dy, x, group_index, *ctx.args) if ctx.needs_input_grad[0] else None
    return dx, None, None, None, None, None, None, None


_fwd = DifferentiableOp("clipped_swiglu_fwd", _fwd_impl, _fwd_fake, _setup, _backward)


def clipped_swiglu(x: Tensor, *, group_index: Optional[Tensor] = None, dim: int = -1,
                   alpha: float = 1.702, limit: float = 7.0, bias: float = 1.0,
                   interleaved: bool = True, clamp_mode: int = 0) -> Tensor:
    """GPT-OSS SwiGLU with clamped halves (CANN ``clipped_swiglu``'s signature).

    x is viewed as ``[M, K]`` with ``M = prod(shape[:dim])``, ``K = prod(shape[dim:])``; the
    halves are ``A = x[:, 0::2], B = x[:, 1::2]`` (``interleaved``) or the first and second half.

    * ``clamp_mode=0`` (GPT-OSS): ``a = A.clamp(max=limit)``, ``b = B.clamp(-limit, limit)``,
      ``y = a * sigmoid(alpha * a) * (b + bias)``.
    * ``clamp_mode=1`` (CANN V2): ``y = (A * sigmoid(A)).clamp(max=limit) * B.clamp(-limit, limit)``.

    With ``group_index`` (int64 ``[G]``, G <= 8192), rows ``>= sum(group_index)`` are zeros (and
    get zero gradient). Returns x's shape with ``shape[dim]`` halved, in x's dtype. Differentiable
    in x, with torch.clamp's gradient convention at exactly ``+-limit``.
    """
    _check(x, dim, limit, clamp_mode)
    return _fwd(x, group_index, int(dim), float(alpha), float(limit), float(bias), bool(interleaved),
                int(clamp_mode))


def clipped_swiglu_grad(grad_y: Tensor, x: Tensor, group_index: Optional[Tensor] = None,
                        dim: int = -1, alpha: float = 1.702, limit: float = 7.0, bias: float = 1.0,
                        interleaved: bool = True, clamp_mode: int = 0) -> Tensor:
    """CANN's ``clipped_swiglu_grad``: the gradient of :func:`clipped_swiglu` with respect to x."""
    _check(x, dim, limit, clamp_mode)
    return _bwd(grad_y, x, group_index, int(dim), float(alpha), float(limit), float(bias),
                bool(interleaved), int(clamp_mode))
