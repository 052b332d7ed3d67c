"""rmsnorm_gated (docs/specs/ops.md section 5),
as the ops of fusedops._op: an autograd.Function eagerly, torch.library custom ops under
torch.compile.

Two entry points, as in flash-linear-attention:

* :func:`rms_norm_gated` — ``fla.modules.fused_norm_gate.rms_norm_gated``'s positional order
  (gate ``g``, activation silu/swish/sigmoid, residual / prenorm / residual_in_fp32, eps 1e-6)
  plus the keyword-only ``group_size`` and ``norm_before_gate``;
* :func:`rmsnorm_fn` — ``fla.modules.layernorm_gated.rmsnorm_fn(x, weight, bias, z=None, eps=1e-6,
  group_size=None, norm_before_gate=True)``.

The modules follow the FLA modules of the same names: :class:`fusedops.nn.RMSNormGated` (eps
1e-5, norm_before_gate=False: gate, then normalise) and :class:`fusedops.nn.FusedRMSNormGated`
(eps 1e-5, normalise, then gate with swish/sigmoid).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from .._op import DifferentiableOp, PlainOp

_OP = "rmsnorm_gated"
_ACTIVATIONS = {"silu": 0, "swish": 0, "sigmoid": 1}


def _groups(D: int, group_size: int) -> int:
    g = group_size if group_size > 0 else D
    return D // g if g > 0 else 0


def _rstd_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _opt_rows(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else rows_view(t)


def _opt_contig(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


def _fwd_impl(x: Tensor, z: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor],
              residual: Optional[Tensor], eps: float, group_size: int, norm_before_gate: bool,
              activation: int) -> tuple[Tensor, Tensor, Tensor]:
    D = x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(tuple(x.shape[:-1]) + (_groups(D, group_size),), dtype=_rstd_dtype(x), device=x.device)
    res_out = (torch.empty(x.shape, dtype=residual.dtype, device=x.device) if residual is not None
               else x.new_empty(0))
    if x.numel() == 0:
        return y, res_out, rstd
    _C.rmsnorm_gated_fwd(context(_OP, x), rows_view(x), _opt_rows(z), _opt_contig(weight),
                         _opt_contig(bias), _opt_rows(residual), y,
                         res_out if residual is not None else None, rstd, eps, group_size,
                         norm_before_gate, activation)
    return y, res_out, rstd


def _fwd_fake(x, z, weight, bias, residual, eps, group_size, norm_before_gate, activation):
    D = x.shape[-1]
    res_out = x.new_empty(x.shape, dtype=residual.dtype) if residual is not None else x.new_empty(0)
    rstd = x.new_empty(tuple(x.shape[:-1]) + (_groups(D, group_size),), dtype=_rstd_dtype(x))
    return x.new_empty(x.shape), res_out, rstd


def _bwd_impl(dy: Tensor, x: Tensor, z: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor],
              rstd: Tensor, dresidual: Optional[Tensor], group_size: int, norm_before_gate: bool,
              activation: int, want_dresidual_in: bool, want_dweight: bool,
              want_dbias: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    dt = dy.dtype
    want_dw = want_dweight and weight is not None
    want_db = want_dbias and bias is not None
    dx = torch.empty(x.shape, dtype=dt, device=x.device)
    dz = torch.empty(x.shape, dtype=dt, device=x.device) if z is not None else x.new_empty(0, dtype=dt)
    dw = torch.empty_like(weight) if want_dw else x.new_empty(0, dtype=dt)
    db = torch.empty_like(bias) if want_db else x.new_empty(0, dtype=dt)
    dres_in = torch.empty(x.shape, dtype=x.dtype, device=x.device) if want_dresidual_in else x.new_empty(0)
    if x.numel() == 0:
        # Sums over no rows are zeros.
        dw.zero_()
        db.zero_()
        return dx, dz, dw, db, dres_in
    dy_r = rows_view(dy)
    x_r = rows_view(x)
    w, b = _opt_contig(weight), _opt_contig(bias)
    dw_arg, db_arg = (dw if want_dw else None), (db if want_db else None)
    ws_bytes = _C.rmsnorm_gated_bwd_workspace_size(x_r, dw_arg, db_arg)
    workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=x.device) if ws_bytes > 0 else None
    _C.rmsnorm_gated_bwd(context(_OP, x), dy_r, x_r, _opt_rows(z), w, b, rstd,
                         _opt_rows(dresidual.to(x.dtype)) if dresidual is not None else None, dx,
                         dz if z is not None else None, dw_arg, db_arg,
                         dres_in if want_dresidual_in else None, workspace, group_size,
                         norm_before_gate, activation)
    return dx, dz, dw, db, dres_in


def _bwd_fake(dy, x, z, weight, bias, rstd, dresidual, group_size, norm_before_gate, activation,
              want_dresidual_in, want_dweight, want_dbias):
    dt = dy.dtype
    return (x.new_empty(x.shape, dtype=dt),
            x.new_empty(x.shape, dtype=dt) if z is not None else x.new_empty(0, dtype=dt),
            torch.empty_like(weight) if want_dweight and weight is not None else x.new_empty(0, dtype=dt),
            torch.empty_like(bias) if want_dbias and bias is not None else x.new_empty(0, dtype=dt),
            x.new_empty(x.shape) if want_dresidual_in else x.new_empty(0))


_bwd = PlainOp("rmsnorm_gated_bwd", _bwd_impl, _bwd_fake)


def _setup(ctx, inputs, output):
    x, z, weight, bias, residual, eps, group_size, norm_before_gate, activation = inputs
    _, res_out, rstd = output
    ctx.has = (z is not None, weight is not None, bias is not None, residual is not None)
    ctx.residual_dtype = residual.dtype if residual is not None else None
    ctx.args = (group_size, norm_before_gate, activation)
    ctx.save_for_backward(res_out if residual is not None else x, z, weight, bias, rstd)
    ctx.mark_non_differentiable(rstd)


def _backward(ctx, dy, dres_out, _drstd):
    x_saved, z, weight, bias, rstd = ctx.saved_tensors
    has_z, has_w, has_b, has_res = ctx.has
    dresidual = dres_out if has_res else None
    # The residual's gradient is dx; a copy in the residual's dtype when that differs.
    want_dres_in = has_res and ctx.residual_dtype != dy.dtype
    need = ctx.needs_input_grad
    dx, dz, dw, db, dres_in = _bwd(dy, x_saved, z, weight, bias, rstd, dresidual, *ctx.args,
                                   want_dres_in, bool(need[2]), bool(need[3]))
    d_residual = (dres_in if want_dres_in else dx) if has_res else None
    return (dx, dz if has_z else None, dw if has_w and need[2] else None,
            db if has_b and need[3] else None, d_residual, None, None, None, None)


_fwd = DifferentiableOp("rmsnorm_gated_fwd", _fwd_impl, _fwd_fake, _setup, _backward)


def _activation_code(activation: str) -> int:
    if activation not in _ACTIVATIONS:
        raise ValueError(f"fusedops: rmsnorm_gated: activation must be one of 'silu', 'swish', "
                         f"'sigmoid', got {activation!r}")
    return _ACTIVATIONS[activation]


def rms_norm_gated(x: Tensor, g: Optional[Tensor] = None, weight: Optional[Tensor] = None,
                   bias: Optional[Tensor] = None, activation: str = "swish",
                   residual: Optional[Tensor] = None, prenorm: bool = False,
                   residual_in_fp32: bool = False, eps: float = 1e-6, *,
                   group_size: Optional[int] = None, norm_before_gate: bool = True,
                   z: Optional[Tensor] = None):
    """Gated RMSNorm over the last dimension (docs/specs/ops.md section 5.2).

    The positional order and defaults are flash-linear-attention 0.6.0's
    ``fla.modules.fused_norm_gate.rms_norm_gated(x, g, weight, bias, activation="swish",
    residual=None, prenorm=False, residual_in_fp32=False, eps=1e-6)``; ``group_size`` and
    ``norm_before_gate`` (FLA's ``layernorm_gated`` options) are keyword-only, and ``z=`` is an
    alias of the gate ``g`` (this function's name for it before).

    * ``norm_before_gate=True`` (default): ``y = (x * r_G * weight + bias) * act(g)`` with
      ``r_G = (mean_G(x**2) + eps) ** -0.5`` per group of ``group_size`` columns (one group when
      None) and ``act`` silu/swish or sigmoid.
    * ``norm_before_gate=False`` (Mamba-2 ``RMSNormGated``): ``u = x * silu(g)``,
      ``y = u * r_G(u) * weight + bias``.

    ``g=None`` gives a plain (grouped) RMSNorm; weight and bias are optional ``[D]`` tensors (x's
    dtype or float32). With ``residual`` (norm_before_gate only) the norm applies to
    ``x + residual``, kept in the residual's dtype; ``prenorm=True`` returns ``(y, x + residual)``
    (``x`` itself without a residual, in float32 with ``residual_in_fp32``). Differentiable in x,
    g, weight, bias and residual; fp32 math; deterministic weight and bias gradients.
    """
    if z is not None:
        if g is not None:
            raise TypeError("fusedops: rmsnorm_gated: pass the gate as g or as its alias z, not both")
        g = z
    if not isinstance(activation, str) or (residual is not None and not isinstance(residual, Tensor)):
        raise TypeError("fusedops: rmsnorm_gated: the positional order is flash-linear-attention's "
                        "(x, g, weight, bias, activation, residual, prenorm, residual_in_fp32, eps); "
                        "pass eps=, group_size=, norm_before_gate= by keyword")
    act = _activation_code(activation)
    if not norm_before_gate:
        if act != 0:
            raise ValueError("fusedops: rmsnorm_gated: activation 'sigmoid' needs norm_before_gate=True "
                             "(the gate-first form uses silu)")
        if residual is not None or prenorm or residual_in_fp32:
            raise ValueError("fusedops: rmsnorm_gated: residual, prenorm and residual_in_fp32 need "
                             "norm_before_gate=True")
    if x.dim() == 0:
        raise ValueError("fusedops: rmsnorm_gated: x must have rank >= 1, got rank 0")
    D = x.shape[-1]
    gs = 0 if group_size is None else int(group_size)
    if group_size is not None and (gs <= 0 or D % gs):
        raise ValueError(f"fusedops: rmsnorm_gated: group_size must divide D: D = {D}, "
                         f"group_size = {group_size}")
    y, res_out, _ = _fwd(x, g, weight, bias, residual, float(eps), gs, bool(norm_before_gate), act)
    if not prenorm:
        return y
    if residual is None:
        res_out = x.float() if residual_in_fp32 else x
    return y, res_out


def rmsnorm_fn(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], z: Optional[Tensor] = None,
               eps: float = 1e-6, group_size: Optional[int] = None, norm_before_gate: bool = True) -> Tensor:
    """flash-linear-attention's ``layernorm_gated.rmsnorm_fn`` signature (silu gate)."""
    return rms_norm_gated(x, z, weight, bias, "silu", eps=eps, group_size=group_size,
                          norm_before_gate=norm_before_gate)
