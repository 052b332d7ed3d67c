"""``causal_conv1d.causal_conv1d_interface`` (the ``causal-conv1d`` package, 1.x):
``causal_conv1d_fn`` and ``causal_conv1d_update`` on :func:`fusedops.causal_conv1d`.

The package's layout is channels-first: ``x [B, D, T]``, weight ``[D, W]``, states
``[B, D, W-1]`` (fusedops' ``[N, D, W]`` without its unused slot 0).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fusedops.compat._util import unsupported
from fusedops.ops.causal_conv1d import causal_conv1d as _conv

__all__ = ["causal_conv1d_fn", "causal_conv1d_update"]

_ACTIVATIONS = (None, "silu", "swish")


def _check_activation(activation) -> None:
    if activation not in _ACTIVATIONS:
        raise NotImplementedError("activation must be None, silu, or swish")


def _segments(seq_idx: Tensor, B: int, T: int):
    """cu_seqlens (int32, on the host) over the flattened ``[1, B*T]`` tokens for the runs of
    equal ``seq_idx`` within each batch row, and the index of each row's first run (a host
    tensor). One copy of seq_idx to the host (the kernels' sequence tables are built there);
    the runs are found with tensor operations."""
    if seq_idx.shape != (B, T):
        raise ValueError(f"fusedops.compat.causal_conv1d: seq_idx must have shape [B, T] = "
                         f"[{B}, {T}], got {list(seq_idx.shape)}")
    if T == 0:  # B empty sequences
        return torch.zeros(B + 1, dtype=torch.int32), torch.arange(B)
    s = seq_idx.detach().to("cpu", torch.int64)
    if bool((s < 0).any()):
        unsupported("causal_conv1d", "causal_conv1d_fn", "negative seq_idx (padding tokens)",
                    "give padding tokens their own non-negative index and ignore their outputs")
    starts = torch.ones(B, T, dtype=torch.bool)
    starts[:, 1:] = s[:, 1:] != s[:, :-1]
    starts = starts.reshape(-1)
    cu = torch.cat([starts.nonzero().reshape(-1), torch.tensor([B * T])]).to(torch.int32)
    firsts = starts.cumsum(0).reshape(B, T)[:, 0] - 1
    return cu, firsts


def causal_conv1d_fn(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                     seq_idx: Optional[Tensor] = None, initial_states: Optional[Tensor] = None,
                     return_final_states: bool = False, final_states_out: Optional[Tensor] = None,
                     activation: Optional[str] = None):
    """``x [B, D, T]``, ``weight [D, W]``, ``bias [D]``; ``seq_idx [B, T]`` (runs of equal,
    non-negative indices are separate sequences; the package's negative "padding" index is
    rejected); ``initial_states [B, D, W-1]`` (with seq_idx: the state of each row's first
    sequence). Returns ``out [B, D, T]``, or ``(out, final_states [B, D, W-1])`` with
    ``return_final_states`` (written into ``final_states_out`` when given). Differentiable in
    x, weight, bias and initial_states."""
    _check_activation(activation)
    if seq_idx is not None and return_final_states:
        raise AssertionError("If seq_idx is not None, we don't return final_states_out")
    if x.dim() != 3:
        raise ValueError(f"fusedops.compat.causal_conv1d: x must have shape [B, D, T], got "
                         f"{list(x.shape)}")
    B, D, T = x.shape
    xt = x.transpose(1, 2)  # [B, T, D]
    h0 = None if initial_states is None else F.pad(initial_states, (1, 0))  # [B, D, W]
    if seq_idx is None:
        y, final = _conv(xt, weight, bias, None, h0, return_final_states, activation,
                         weight_layout="DW")
    else:
        cu_host, firsts = _segments(seq_idx, B, T)
        cu = cu_host.to(x.device)
        if h0 is not None:
            states = h0.new_zeros(cu_host.shape[0] - 1, D, weight.shape[1])
            h0 = states.index_copy(0, firsts.to(x.device), h0)
        y, final = _conv(xt.reshape(1, B * T, D), weight, bias, None, h0, False, activation,
                         cu_seqlens=cu, weight_layout="DW")
        y = y.reshape(B, T, D)
    out = y.transpose(1, 2)
    if not return_final_states:
        return out
    final = final[..., 1:]
    if final_states_out is not None:
        final_states_out.copy_(final)
        final = final_states_out
    return out, final


def causal_conv1d_update(x: Tensor, conv_state: Tensor, weight: Tensor,
                         bias: Optional[Tensor] = None, activation: Optional[str] = None,
                         cache_seqlens: Optional[Tensor] = None,
                         conv_state_indices: Optional[Tensor] = None) -> Tensor:
    """Decoding: ``x [B, D]`` or ``[B, D, L]``, ``conv_state [B, D, S]`` with ``S >= W-1``
    holding the last S inputs; it is updated **in place** (the newest L inputs appended).
    ``conv_state_indices [B]`` selects the state rows of a larger cache. A circular buffer
    (``cache_seqlens``) is rejected. Returns out in x's shape."""
    _check_activation(activation)
    if cache_seqlens is not None:
        unsupported("causal_conv1d", "causal_conv1d_update", "cache_seqlens (a circular state "
                    "buffer)", "keep the state linear (the newest input last) and pass "
                    "cache_seqlens=None")
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(-1) if squeeze else x
    B, D, L = x3.shape
    W = weight.shape[1]
    rows = conv_state if conv_state_indices is None else conv_state.index_select(
        0, conv_state_indices.long())
    S = rows.shape[-1]
    if rows.shape[:2] != (B, D) or S < W - 1:
        raise ValueError(f"fusedops.compat.causal_conv1d: conv_state must have shape [B, D, S] = "
                         f"[{B}, {D}, >= {W - 1}], got {list(rows.shape)}")
    h0 = F.pad(rows[..., S - (W - 1):], (1, 0)).to(x3.dtype)  # [B, D, W], slot 0 unused
    y, _ = _conv(x3.transpose(1, 2), weight, bias, None, h0, False, activation,
                 weight_layout="DW")
    with torch.no_grad():
        new_rows = torch.cat([rows, x3.to(rows.dtype)], dim=-1)[..., -S:]
        if conv_state_indices is None:
            conv_state.copy_(new_rows)
        else:
            conv_state.index_copy_(0, conv_state_indices.long(), new_rows)
    out = y.transpose(1, 2)
    return out.squeeze(-1) if squeeze else out
