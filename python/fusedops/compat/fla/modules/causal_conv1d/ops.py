"""``fla.modules.causal_conv1d.ops``: ``causal_conv1d``, ``causal_conv1d_update`` and
``ShortConvolution`` (weight ``[D, W]``, states ``[N, D, W]``)."""

from __future__ import annotations

import os
import warnings
from typing import Optional

import torch
from torch import Tensor

from fusedops import nn as _nn
from fusedops.compat._util import cp_plan, unsupported
from fusedops.ops.causal_conv1d import causal_conv1d as _conv

__all__ = ["ShortConvolution", "causal_conv1d", "causal_conv1d_update"]

_BACKENDS = ("triton", "cuda", "mix")


def causal_conv1d(
    x: Tensor,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    residual: Optional[Tensor] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: Optional[bool] = False,
    activation: Optional[str] = None,
    backend: Optional[str] = "triton",
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    chunk_indices: Optional[Tensor] = None,
    cp_context=None,
    **kwargs,
) -> tuple[Tensor, Optional[Tensor]]:
    """FLA 0.6.0's ``causal_conv1d`` (weight ``[D, W]``) on :func:`fusedops.causal_conv1d`.
    ``backend`` ("triton", "cuda", "mix"), ``cu_seqlens_cpu``, ``chunk_indices`` and other
    keywords (e.g. ``seq_idx``) are accepted and ignored; ``weight=None`` is rejected;
    ``cp_context`` takes a plan of ``fusedops.distributed.context_parallel`` (with
    ``conv_width``). Returns ``(y, final_state or None)``."""
    op = "causal_conv1d"
    plan = cp_plan("fla", op, cp_context)
    if backend not in _BACKENDS:
        raise ValueError(f"Unsupported backend: {backend}")
    if weight is None:
        unsupported("fla", op, "weight=None (an unweighted window sum)",
                    "pass a [D, W] weight of ones")
    return _conv(x, weight, bias, residual, initial_state, bool(output_final_state), activation,
                 cu_seqlens=None if plan is not None else cu_seqlens, weight_layout="DW", cp=plan)


def causal_conv1d_update(x: Tensor, cache: Tensor, residual: Optional[Tensor] = None,
                         weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                         activation: Optional[str] = None) -> tuple[Tensor, Tensor]:
    """One decoding step per sequence: ``x`` ``[N, D]``, ``[1, N, D]`` or ``[N, 1, D]``;
    ``cache [N, D, W]`` is shifted by one token and takes x **in place**. Returns ``(y, cache)``
    with y in x's shape."""
    if weight is None:
        unsupported("fla", "causal_conv1d_update", "weight=None", "pass a [D, W] weight")
    shape = x.shape
    D = weight.shape[0]
    steps = x.reshape(-1, 1, D)
    res = None if residual is None else residual.reshape(-1, 1, D)
    y, final = _conv(steps, weight, bias, res, cache, cache is not None, activation,
                     weight_layout="DW")
    if cache is not None:
        with torch.no_grad():
            cache.copy_(final)
    return y.reshape(shape), cache


class ShortConvolution(_nn.ShortConvolution):
    """FLA 0.6.0's ``ShortConvolution`` (``nn.Conv1d`` depthwise weight ``[D, 1, W]``, so state
    dicts load unchanged) on :class:`fusedops.nn.ShortConvolution`. ``backend`` (and the
    ``FLA_CONV_BACKEND`` environment variable) must be "cuda" or "triton" and is otherwise
    ignored; so are ``chunk_indices`` and extra keywords of ``forward``. A ``mask`` multiplies x
    out of place (FLA's multiplies the caller's x in place)."""

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False,
                 activation: Optional[str] = "silu", backend: Optional[str] = "triton",
                 device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None,
                 **kwargs) -> None:
        super().__init__(hidden_size, kernel_size, bias=bias, activation=activation, device=device,
                         dtype=dtype)
        if "use_fast_conv1d" in kwargs:
            warnings.warn("The `use_fast_conv1d` parameter is deprecated and will be ignored. "
                          "Please use the `backend` parameter instead.", stacklevel=2)
        self.backend = os.environ.get("FLA_CONV_BACKEND", backend)
        if self.backend not in ("cuda", "triton"):
            raise ValueError(f"Invalid backend: {self.backend}, must be one of ['cuda', 'triton']")

    def forward(self, x: Tensor, residual: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                cache: Optional[Tensor] = None, output_final_state: bool = False,
                cu_seqlens: Optional[Tensor] = None, chunk_indices: Optional[Tensor] = None,
                **kwargs) -> tuple[Tensor, Optional[Tensor]]:
        return super().forward(x, residual=residual, mask=mask, cache=cache,
                               output_final_state=output_final_state, cu_seqlens=cu_seqlens)

    def step(self, x: Tensor, residual: Optional[Tensor], cache: Optional[Tensor],
             output_final_state: bool = False,
             cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        return super().step(x, residual, cache, output_final_state, cu_seqlens)
