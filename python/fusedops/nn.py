"""Module wrappers (torch.nn.Module) around the fusedops functional API."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .ops.causal_conv1d import causal_conv1d


class FusedCrossEntropyLoss(torch.nn.Module):
    """Cross-entropy with the gradient computed in the forward, backed by
    :func:`fusedops.fused_cross_entropy_loss` (the options of flash-linear-attention's
    ``FusedCrossEntropyLoss``, in its positional order, plus MindSpeed's per-token
    ``loss_weight``).

    ``forward(logits, target, loss_weight=None)`` returns the loss, or ``(loss, z_loss)`` with
    ``return_z_loss`` (keyword-only: FLA's 8th positional is ``process_group``).
    ``reduction=None`` means ``"sum"`` when a ``loss_weight`` is given and ``"mean"`` otherwise
    (FLA's default ``"mean"`` for calls without a weight).
    """

    def __init__(self, ignore_index: int = -100, reduction: Optional[str] = None,
                 label_smoothing: float = 0.0, logit_scale: float = 1.0,
                 lse_square_scale: float = 0.0, logit_softcapping: Optional[float] = None,
                 inplace_backward: bool = False, *, return_z_loss: bool = False) -> None:
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.logit_scale = logit_scale
        self.logit_softcapping = logit_softcapping
        self.lse_square_scale = lse_square_scale
        self.return_z_loss = return_z_loss
        self.inplace_backward = inplace_backward

    def forward(self, logits: Tensor, target: Tensor, loss_weight: Optional[Tensor] = None):
        from .ops.cross_entropy import fused_cross_entropy_loss

        return fused_cross_entropy_loss(
            logits, target, loss_weight, ignore_index=self.ignore_index, reduction=self.reduction,
            label_smoothing=self.label_smoothing, logit_scale=self.logit_scale,
            logit_softcapping=self.logit_softcapping, lse_square_scale=self.lse_square_scale,
            return_z_loss=self.return_z_loss, inplace_backward=self.inplace_backward)


class ChunkLoss(torch.nn.Module):
    """The LM head and cross-entropy without materialized logits, backed by
    :func:`fusedops.chunk_loss`: ``forward(hidden, weight, labels, loss_weight=None, alpha=None)``
    returns ``CE(hidden @ weight.T)`` (and the z-loss with ``return_z_loss``). The soft cap is
    ``logit_softcapping`` (``softcap=`` is an alias), as in :class:`FusedCrossEntropyLoss`."""

    def __init__(self, chunk_size: Optional[int] = None, ignore_index: int = -100,
                 reduction: str = "sum", label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
                 logit_softcapping: Optional[float] = None, logit_scale: float = 1.0,
                 memory_budget: Optional[int] = None, return_z_loss: bool = False, *,
                 softcap: Optional[float] = None) -> None:
        super().__init__()
        from .ops.cross_entropy import softcap_alias

        self.chunk_size = chunk_size
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.lse_square_scale = lse_square_scale
        self.logit_softcapping = softcap_alias("ChunkLoss", logit_softcapping, softcap)
        self.logit_scale = logit_scale
        self.memory_budget = memory_budget
        self.return_z_loss = return_z_loss

    def forward(self, hidden: Tensor, weight: Tensor, labels: Tensor,
                loss_weight: Optional[Tensor] = None, alpha=None):
        from .ops.chunk_loss import chunk_loss

        return chunk_loss(hidden, weight, labels, loss_weight, chunk_size=self.chunk_size,
                          ignore_index=self.ignore_index, reduction=self.reduction, alpha=alpha,
                          label_smoothing=self.label_smoothing,
                          lse_square_scale=self.lse_square_scale,
                          logit_softcapping=self.logit_softcapping,
                          logit_scale=self.logit_scale, memory_budget=self.memory_budget,
                          return_z_loss=self.return_z_loss)


class RMSNormGated(torch.nn.Module):
    """Gated RMSNorm with flash-linear-attention's ``RMSNormGated`` constructor and defaults
    (``fla.modules.layernorm_gated``), backed by :func:`fusedops.rms_norm_gated`.

    The default, as in FLA's ``RMSNormGated``, gates first and then normalises
    (``norm_before_gate=False``: ``y = u * r(u) * weight`` with ``u = x * silu(z)``), eps 1e-5, a
    weight initialised to ones and no bias. FLA's *other* module, ``FusedRMSNormGated``
    (normalise, then gate), is :class:`FusedRMSNormGated`: each fusedops module has the default
    math of the FLA module of the same name (docs/compat.md). With ``norm_before_gate=True`` the
    gate may be ``"sigmoid"`` and ``forward`` also takes FLA ``fused_norm_gate``'s residual /
    prenorm / residual_in_fp32.

    Args:
        hidden_size: D.
        eps: added to the mean of squares.
        group_size: columns per rstd group (None: one group per row).
        norm_before_gate: where the gate goes (see above).
        device, dtype: of the parameters.
        activation: ``"silu"``/``"swish"`` or ``"sigmoid"`` (norm_before_gate only); keyword-only.
        elementwise_affine: learn a weight (default True); keyword-only.
        bias: learn a bias (default False); keyword-only.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: Optional[int] = None,
                 norm_before_gate: bool = False, device=None, dtype=None, *,
                 activation: str = "silu", elementwise_affine: bool = True,
                 bias: bool = False) -> None:
        super().__init__()
        if activation not in ("silu", "swish", "sigmoid"):
            raise ValueError(f"fusedops: RMSNormGated: activation must be one of 'silu', 'swish', "
                             f"'sigmoid', got {activation!r}")
        if group_size is not None and (group_size <= 0 or hidden_size % group_size):
            raise ValueError(f"fusedops: RMSNormGated: group_size must divide hidden_size: "
                             f"hidden_size = {hidden_size}, group_size = {group_size}")
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.eps = eps
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.activation = activation
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, **factory)) if elementwise_affine else None
        self.bias = torch.nn.Parameter(torch.empty(hidden_size, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return (f"{self.hidden_size}, eps={self.eps}, group_size={self.group_size}, "
                f"norm_before_gate={self.norm_before_gate}, activation={self.activation}")

    def forward(self, x: Tensor, z: Optional[Tensor] = None, residual: Optional[Tensor] = None,
                prenorm: bool = False, residual_in_fp32: bool = False):
        from .ops.rmsnorm_gated import rms_norm_gated

        return rms_norm_gated(x, z, self.weight, self.bias, self.activation, residual, prenorm,
                              residual_in_fp32, self.eps, group_size=self.group_size,
                              norm_before_gate=self.norm_before_gate)


class FusedRMSNormGated(torch.nn.Module):
    """flash-linear-attention's ``FusedRMSNormGated`` (``fla.modules.fused_norm_gate``): normalise,
    then gate, ``y = x * r * weight * act(g)`` with ``act`` swish (default) or sigmoid, eps 1e-5,
    no bias; ``forward(x, g, residual=None, prenorm=False, residual_in_fp32=False)``. Backed by
    :func:`fusedops.rms_norm_gated`. (:class:`RMSNormGated` is FLA's other module, which gates
    first by default.)"""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 activation: str = "swish", device=None, dtype=None) -> None:
        super().__init__()
        if activation not in ("swish", "silu", "sigmoid"):
            raise ValueError(f"fusedops: FusedRMSNormGated: activation must be one of 'swish', "
                             f"'silu', 'sigmoid', got {activation!r}")
        self.hidden_size = hidden_size
        self.elementwise_affine = elementwise_affine
        self.eps = eps
        self.activation = activation
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            torch.nn.init.ones_(self.weight)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, activation={self.activation}"

    def forward(self, x: Tensor, g: Tensor, residual: Optional[Tensor] = None,
                prenorm: bool = False, residual_in_fp32: bool = False):
        from .ops.rmsnorm_gated import rms_norm_gated

        return rms_norm_gated(x, g, self.weight, self.bias, self.activation, residual, prenorm,
                              residual_in_fp32, self.eps)


class ShortConvolution(torch.nn.Conv1d):
    """Depthwise causal short convolution with optional SiLU and state caching
    (flash-linear-attention's ``ShortConvolution``), backed by :func:`fusedops.causal_conv1d`.

    Weight layout: ``self.weight`` is ``[hidden_size, 1, kernel_size]``, the ``nn.Conv1d``
    depthwise layout that FLA's module also holds, so its state dicts load unchanged;
    ``self.weight[d, 0, k]`` multiplies token ``t - (W-1) + k`` of channel d (``k = W-1`` is the
    current token). The op is given the ``[W, D]`` view ``self.weight[:, 0, :].t()`` (no copy).
    ``self.bias`` is ``[hidden_size]`` or None.

    Args:
        hidden_size: channels D.
        kernel_size: width W.
        bias: learn a channel bias (default False).
        activation: ``"silu"`` (default), ``"swish"`` or None.
        device, dtype: of the parameters.
    """

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False,
                 activation: Optional[str] = "silu", device=None, dtype=None, **kwargs) -> None:
        super().__init__(in_channels=hidden_size, out_channels=hidden_size,
                         kernel_size=kernel_size, padding=kernel_size - 1, groups=hidden_size,
                         bias=bias, device=device, dtype=dtype)
        if activation not in (None, "silu", "swish"):
            raise ValueError(f"fusedops: ShortConvolution: activation must be None, 'silu' or "
                             f"'swish', got {activation!r}")
        self.hidden_size = hidden_size
        self.activation = activation

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation}"

    @property
    def state_size(self) -> int:
        return self.hidden_size * self.kernel_size[0]

    def forward(self, x: Tensor, residual: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                cache: Optional[Tensor] = None, output_final_state: bool = False,
                cu_seqlens: Optional[Tensor] = None, cp=None, cp_context=None,
                **kwargs) -> tuple[Tensor, Optional[Tensor]]:
        """``x [B, T, D]`` (B == 1 with ``cu_seqlens``) -> ``(y, final_state or None)``.

        ``cache [N, D, W]`` is the initial state. As in FLA, a decoding call (one token per
        sequence, autograd off) with a cache writes the new state into ``cache`` in place; other
        calls leave it untouched and return the new state when ``output_final_state``.
        ``mask [B, T]`` zeroes padded positions of x first (not with ``cu_seqlens``).
        ``cp`` (alias ``cp_context``): a context-parallel plan (see ``causal_conv1d``).
        """
        B, T = x.shape[0], x.shape[1]
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        if mask is not None:
            if cu_seqlens is not None:
                raise ValueError("fusedops: ShortConvolution: `mask` and `cu_seqlens` cannot be "
                                 "given together")
            x = x * mask.unsqueeze(-1).to(x.dtype)
        decode = cache is not None and not torch.is_grad_enabled() and B * T == N
        y, final = causal_conv1d(x, self.weight[:, 0, :].t(), self.bias, residual, cache,
                                 output_final_state or decode, self.activation,
                                 cu_seqlens=cu_seqlens, cp=cp, cp_context=cp_context)
        if decode:
            cache.copy_(final)
            final = cache
        return y, (final if output_final_state else None)

    def step(self, x: Tensor, residual: Optional[Tensor], cache: Optional[Tensor],
             output_final_state: bool = False,
             cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        """One decoding step (FLA's ``step``): a zero cache when none is given; the cache is
        updated in place when autograd is off."""
        if cache is None:
            N = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
            cache = x.new_zeros(N, self.hidden_size, self.kernel_size[0])
        return self.forward(x, residual=residual, cache=cache,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens)


from .layers.kda import KimiDeltaAttention  # noqa: E402,F401  (a layer: fusedops/layers/kda.py)
