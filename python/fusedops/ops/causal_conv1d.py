"""causal_conv1d (docs/specs/ops.md section 4): the C++ core behind autograd (see fusedops._op)."""

from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context
from .._op import DifferentiableOp, PlainOp

_OP = "causal_conv1d"
_ACTIVATIONS = {None: "", "silu": "silu", "swish": "swish"}
# Keyword arguments of the FLA / MindSpeed signatures that only steer their Triton launch
# (chunk bookkeeping); accepted and ignored.
_IGNORED_KWARGS = frozenset({"cu_seqlens_cpu", "chunk_indices", "chunk_size"})


def _seq_view(t: Optional[Tensor]) -> Optional[Tensor]:
    """`t` itself when its channel dims (after B, T) are dense, else a contiguous copy. B and T
    may have any strides (e.g. a q/k/v slice of a fused projection)."""
    if t is None or t.numel() == 0:
        return t
    expected = 1
    for d in range(t.dim() - 1, 1, -1):
        if t.size(d) != 1 and t.stride(d) != expected:
            return t.contiguous()
        expected *= t.size(d)
    return t


def _dense(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


def _num_seqs(x: Tensor, cu_seqlens: Optional[Tensor]) -> int:
    return x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def _channels(x: Tensor) -> int:
    d = 1
    for s in x.shape[2:]:
        d *= s
    return d


def _fwd_impl(x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
         initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], activation: str,
         output_final_state: bool) -> tuple[Tensor, Tensor]:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if output_final_state:
        final = torch.empty((_num_seqs(x, cu_seqlens), _channels(x), weight.shape[0]),
                            dtype=x.dtype, device=x.device)
    else:
        final = x.new_empty(0)
    _C.causal_conv1d_fwd(context(_OP, x), _seq_view(x), weight, bias, _seq_view(residual),
                         _dense(initial_state), cu_seqlens, y,
                         final if output_final_state else None, activation)
    return y, final


def _fwd_fake(x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
              initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], activation: str,
              output_final_state: bool) -> tuple[Tensor, Tensor]:
    y = x.new_empty(x.shape)
    if output_final_state:
        final = x.new_empty((_num_seqs(x, cu_seqlens), _channels(x), weight.shape[0]))
    else:
        final = x.new_empty(0)
    return y, final


def _bwd_impl(x: Tensor, weight: Tensor, bias: Optional[Tensor], initial_state: Optional[Tensor],
         cu_seqlens: Optional[Tensor], dy: Tensor, d_final_state: Optional[Tensor],
         activation: str, need_dweight: bool, need_dbias: bool,
         need_dinitial: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    W, D = weight.shape[0], _channels(x)
    need_dbias = need_dbias and bias is not None
    need_dinitial = need_dinitial and initial_state is not None
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = torch.empty((W, D), dtype=weight.dtype, device=x.device) if need_dweight else x.new_empty(0)
    db = torch.empty((D,), dtype=bias.dtype, device=x.device) if need_dbias else x.new_empty(0)
    dh0 = torch.empty(initial_state.shape, dtype=initial_state.dtype, device=x.device) \
        if need_dinitial else x.new_empty(0)
    ctx = context(_OP, x)
    xv = _seq_view(x)
    ws = _C.causal_conv1d_bwd_workspace_size(ctx, xv, weight, bias, cu_seqlens, need_dweight,
                                             need_dbias)
    workspace = torch.empty(ws, dtype=torch.uint8, device=x.device) if ws else None
    _C.causal_conv1d_bwd(ctx, xv, weight, bias, _dense(initial_state), cu_seqlens,
                         _seq_view(dy.to(x.dtype)), _dense(d_final_state), dx,
                         dw if need_dweight else None, db if need_dbias else None,
                         dh0 if need_dinitial else None, workspace, activation)
    return dx, dw, db, dh0


def _bwd_fake(x: Tensor, weight: Tensor, bias: Optional[Tensor], initial_state: Optional[Tensor],
              cu_seqlens: Optional[Tensor], dy: Tensor, d_final_state: Optional[Tensor],
              activation: str, need_dweight: bool, need_dbias: bool,
              need_dinitial: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    W, D = weight.shape[0], _channels(x)
    dx = x.new_empty(x.shape)
    dw = x.new_empty((W, D), dtype=weight.dtype) if need_dweight else x.new_empty(0)
    db = x.new_empty((D,), dtype=bias.dtype) if need_dbias and bias is not None else x.new_empty(0)
    dh0 = x.new_empty(initial_state.shape, dtype=initial_state.dtype) \
        if need_dinitial and initial_state is not None else x.new_empty(0)
    return dx, dw, db, dh0


_bwd = PlainOp("causal_conv1d_bwd", _bwd_impl, _bwd_fake)


def _setup(ctx, inputs, output):
    x, weight, bias, residual, initial_state, cu_seqlens, activation, output_final_state = inputs
    ctx.activation = activation
    ctx.output_final_state = output_final_state
    ctx.has_residual = residual is not None
    ctx.save_for_backward(x, weight, bias, initial_state, cu_seqlens)


def _backward(ctx, dy, d_final):
    x, weight, bias, initial_state, cu_seqlens = ctx.saved_tensors
    needs = ctx.needs_input_grad
    if not ctx.output_final_state:
        d_final = None
    if dy is None and d_final is None:
        return (None,) * 8
    if dy is None:
        dy = torch.zeros_like(x)
    dx, dw, db, dh0 = _bwd(x, weight, bias, initial_state, cu_seqlens, dy, d_final,
                           ctx.activation, bool(needs[1]), bool(needs[2]), bool(needs[4]))
    dres = dy if ctx.has_residual and needs[3] else None
    return (dx, dw if needs[1] else None, db if needs[2] and bias is not None else None, dres,
            dh0 if needs[4] and initial_state is not None else None, None, None, None)


_fwd = DifferentiableOp("causal_conv1d_fwd", _fwd_impl, _fwd_fake, _setup, _backward)


def causal_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                  residual: Optional[Tensor] = None, initial_state: Optional[Tensor] = None,
                  output_final_state: bool = False, activation: Optional[str] = None, *,
                  cu_seqlens: Optional[Tensor] = None, weight_layout: str = "WD",
                  cp=None, cp_context=None, **kwargs) -> tuple[Tensor, Optional[Tensor]]:
    """Depthwise causal short convolution (MindSpeed-Ops / flash-linear-attention
    ``causal_conv1d``).

    ``a[t] = sum_k weight[k] * x~[t-W+1+k] + bias``, ``y = act(a) + residual`` per channel, where
    ``x~`` is x preceded by the initial state's tokens (or zeros); ``weight[W-1]`` multiplies
    the current token (``F.conv1d`` cross-correlation with left padding W-1).

    The positional order is flash-linear-attention 0.6.0's and MindSpeed-Ops' ``(x, weight,
    bias, residual, initial_state, output_final_state, activation)``; the rest is keyword-only
    (FLA's 8th positional is ``backend``, MindSpeed's ``cu_seqlens``).

    Args:
        x: ``[B, T, D]`` (dims after T are flattened into D); varlen: ``[1, T_total, D]``.
        weight: ``[W, D]`` (MindSpeed-Ops' layout); ``weight_layout="DW"`` takes FLA's ``[D, W]``
            (``fusedops.compat.fla`` passes FLA's layout for you).
        bias: ``[D]`` or None.
        residual: like x, added after the activation, or None.
        initial_state: ``[N, D, W]`` (slot j = token j-W before the start; slot 0 is not read
            by the convolution) or None = zeros. N = B, or the number of sequences.
        output_final_state: also return ``final_state[n, :, j]`` = token ``L-W+j`` of sequence n
            (taken from the initial state, or 0, when L < W), dtype of x.
        activation: None, ``"silu"`` or ``"swish"`` (the same).
        cu_seqlens: int32/int64 ``[N+1]`` offsets of packed sequences (needs B == 1), or None.
        weight_layout: ``"WD"`` (default) or ``"DW"``.
        cu_seqlens_cpu, chunk_indices, chunk_size: accepted and ignored (they only steer the
            chunking of the FLA / MindSpeed Triton kernels).
        cp (alias cp_context): a context-parallel plan (``fusedops.distributed.context_parallel``
            with ``conv_width=W``): x is this rank's tokens; the ``W-1`` tokens before them come
            from the ranks that hold them; initial_state / final_state hold every global sequence.

    Returns ``(y, final_state or None)``. Differentiable in x, weight, bias, residual and
    initial_state, with a gradient flowing in through final_state. fp32/bf16/fp16 on CPU and
    CUDA (float64 through the reference backend); fp32 math.
    """
    unknown = set(kwargs) - _IGNORED_KWARGS
    if unknown:
        raise TypeError(f"causal_conv1d() got unexpected keyword arguments {sorted(unknown)}")
    if isinstance(output_final_state, str) or isinstance(activation, Tensor):
        raise TypeError("fusedops: causal_conv1d: the positional order is (x, weight, bias, "
                        "residual, initial_state, output_final_state, activation) (FLA 0.6.0's and "
                        "MindSpeed-Ops'); pass activation=..., cu_seqlens=... by keyword")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"fusedops: causal_conv1d: activation must be one of None, 'silu', "
                         f"'swish', got {activation!r}")
    layout = weight_layout.upper() if isinstance(weight_layout, str) else weight_layout
    if layout not in ("WD", "DW"):
        raise ValueError(f"fusedops: causal_conv1d: weight_layout must be 'WD' or 'DW', got "
                         f"{weight_layout!r}")
    if x.dim() < 3:
        raise ValueError(f"fusedops: causal_conv1d: x must have rank >= 3 ([B,T,D]), got rank "
                         f"{x.dim()} with shape {list(x.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"fusedops: causal_conv1d: weight must have shape [W,D], got "
                         f"{list(weight.shape)}")
    D = _channels(x)
    if layout == "WD" and weight.shape[1] != D and weight.shape[0] == D:
        raise ValueError(f"fusedops: causal_conv1d: weight must have shape [W,D] with D = {D}, got "
                         f"{list(weight.shape)}, which is FLA's [D,W] layout: pass "
                         f"weight_layout='DW' (or call fusedops.compat.fla's causal_conv1d)")
    if layout == "DW":
        weight = weight.t()
    if cp is not None or cp_context is not None:
        if cp is not None and cp_context is not None:
            raise ValueError("fusedops: causal_conv1d: pass cp or its alias cp_context, not both")
        from ..distributed._conv import causal_conv1d_cp
        return causal_conv1d_cp(x, weight, bias, residual, initial_state, _ACTIVATIONS[activation],
                                output_final_state, cp if cp is not None else cp_context, cu_seqlens)
    y, final = _fwd(x, weight, bias, residual, initial_state, cu_seqlens,
                    _ACTIVATIONS[activation], bool(output_final_state))
    return y, (final if output_final_state else None)
