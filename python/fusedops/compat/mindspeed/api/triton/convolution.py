"""``mindspeed_ops.api.triton.convolution``: ``causal_conv1d`` with MindSpeed's ``[W, D]``
weight."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.ops.causal_conv1d import causal_conv1d as _conv

__all__ = ["causal_conv1d"]


def causal_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                  residual: Optional[Tensor] = None, initial_state: Optional[Tensor] = None,
                  output_final_state: bool = False, activation: Optional[str] = None,
                  cu_seqlens: Optional[Tensor] = None, **kwargs):
    """``(y, final_state or None)``: x ``[B, T, D]``, weight ``[W, D]``, states ``[N, D, W]``
    (:func:`fusedops.causal_conv1d`). Keywords that only steer MindSpeed's kernel launch
    (``cu_seqlens_cpu``, ``chunk_indices``, ``chunk_size``) are accepted and ignored."""
    return _conv(x, weight, bias, residual, initial_state, output_final_state, activation,
                 cu_seqlens=cu_seqlens, **kwargs)
