"""TEMPORARY: the flash-linear-attention 0.6.0 / causal_conv1d call forms that fusedops.transformers
and fusedops.layers use, until ``fusedops.compat`` (issue 36) is on main; then this module goes
and its users import the same names from ``fusedops.compat.fla.ops.gated_delta_rule``,
``fusedops.compat.fla.ops.kda``, ``fusedops.compat.causal_conv1d`` and ``fusedops.nn``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

import fusedops


def chunk_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                           scale: Optional[float] = None, initial_state: Optional[Tensor] = None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                           use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                           state_v_first: bool = False, cu_seqlens: Optional[Tensor] = None,
                           cu_seqlens_cpu: Optional[Tensor] = None, chunk_indices=None, cp_context=None,
                           **kwargs):
    return fusedops.chunk_gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        state_v_first=state_v_first, cu_seqlens=cu_seqlens)


def fused_recurrent_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None,
                                     gk=None, gv=None, beta: Optional[Tensor] = None,
                                     scale: Optional[float] = None,
                                     initial_state: Optional[Tensor] = None,
                                     output_final_state: bool = False,
                                     use_qk_l2norm_in_kernel: bool = False,
                                     cu_seqlens: Optional[Tensor] = None, **kwargs):
    return fusedops.fused_recurrent_gated_delta_rule(
        q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens)


def chunk_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: Optional[float] = None,
              initial_state: Optional[Tensor] = None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
              use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
              safe_gate: bool = False, lower_bound: Optional[float] = None,
              disable_recompute: bool = False, return_intermediate_states: bool = False,
              state_v_first: bool = False, cu_seqlens: Optional[Tensor] = None,
              cu_seqlens_cpu: Optional[Tensor] = None, cp_context=None, use_graph: bool = False,
              max_num_seqs=None, **kwargs):
    return fusedops.chunk_kda(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel, A_log=kwargs.get("A_log"),
        dt_bias=kwargs.get("dt_bias"), use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
        state_v_first=state_v_first, cu_seqlens=cu_seqlens)


def fused_recurrent_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                        A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                        scale: Optional[float] = None, initial_state: Optional[Tensor] = None,
                        output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                        use_gate_in_kernel: bool = False, use_beta_sigmoid_in_kernel: bool = False,
                        allow_neg_eigval: bool = False, lower_bound: Optional[float] = None,
                        state_v_first: bool = False, cu_seqlens: Optional[Tensor] = None, **kwargs):
    if allow_neg_eigval:
        beta = 2 * torch.sigmoid(beta) if use_beta_sigmoid_in_kernel else 2 * beta
        use_beta_sigmoid_in_kernel = False
    return fusedops.fused_recurrent_kda(
        q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
        lower_bound=lower_bound, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        cu_seqlens=cu_seqlens, state_v_first=state_v_first)


def _seq_idx_to_cu_seqlens(seq_idx: Tensor) -> Tensor:
    if seq_idx.shape[0] != 1:
        raise ValueError("causal_conv1d_fn: seq_idx needs batch size 1 (packed sequences)")
    s = seq_idx[0]
    starts = torch.nonzero(torch.diff(s, prepend=s[:1] - 1) != 0).flatten()
    return torch.cat([starts, starts.new_tensor([s.numel()])]).to(torch.int32)


def causal_conv1d_fn(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                     seq_idx: Optional[Tensor] = None, initial_states: Optional[Tensor] = None,
                     return_final_states: bool = False, final_states_out: Optional[Tensor] = None,
                     activation: Optional[str] = None):
    """causal_conv1d package: x [B, D, T], weight [D, W] -> [B, D, T]."""
    init = None
    if initial_states is not None:
        init = torch.nn.functional.pad(initial_states, (1, 0))
    cu = _seq_idx_to_cu_seqlens(seq_idx) if seq_idx is not None else None
    y, final = fusedops.causal_conv1d(x.transpose(1, 2), weight.t(), bias=bias, initial_state=init,
                                      activation=activation, cu_seqlens=cu,
                                      output_final_state=return_final_states)
    y = y.transpose(1, 2)
    if not return_final_states:
        return y
    final = final[..., 1:]
    if final_states_out is not None:
        final_states_out.copy_(final)
        final = final_states_out
    return y, final


def causal_conv1d_update(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                         activation: Optional[str] = None, cache_seqlens=None, conv_state_indices=None):
    """causal_conv1d package: x [B, D] or [B, D, T], conv_state [B, D, S >= W-1] updated in place."""
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    W, S = weight.shape[-1], conv_state.shape[-1]
    init = conv_state[..., S - (W - 1):]
    init = torch.nn.functional.pad(init, (1, 0))
    y, _ = fusedops.causal_conv1d(x.transpose(1, 2), weight.t(), bias=bias, initial_state=init,
                                  activation=activation)
    with torch.no_grad():
        conv_state.copy_(torch.cat([conv_state, x.to(conv_state.dtype)], -1)[..., -S:])
    y = y.transpose(1, 2)
    return y.squeeze(-1) if squeeze else y


class FusedRMSNormGated(torch.nn.Module):
    """FLA's ``FusedRMSNormGated``: ``y = x * r * weight * act(g)`` (normalise, then gate)."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 activation: str = "swish", device=None, dtype=None) -> None:
        super().__init__()
        self.hidden_size, self.eps, self.activation = hidden_size, eps, activation
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.register_parameter("bias", None)

    def forward(self, x: Tensor, g: Tensor, residual: Optional[Tensor] = None, prenorm: bool = False,
                residual_in_fp32: bool = False):
        return fusedops.rms_norm_gated(x, g, self.weight, self.bias, eps=self.eps, norm_before_gate=True,
                                       activation=self.activation, residual=residual, prenorm=prenorm,
                                       residual_in_fp32=residual_in_fp32)
