"""``fla.ops.gated_delta_rule.fused_recurrent``: ``fused_recurrent_gated_delta_rule`` (alias
``fused_recurrent_gdn``)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.compat._util import state_from_kv, state_to_kv, state_v_first_from, unsupported
from fusedops.ops import gated_delta_rule as _gdn
from fusedops.ops import kda as _kda

__all__ = ["fused_recurrent_gated_delta_rule", "fused_recurrent_gdn"]


def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Optional[Tensor] = None,
    gk: Optional[Tensor] = None,
    gv: Optional[Tensor] = None,
    beta: Optional[Tensor] = None,
    scale: float = None,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    **kwargs,
):
    """FLA 0.6.0's ``fused_recurrent_gated_delta_rule`` (note its positional order: ``gk`` and
    ``gv`` come before ``beta``) on the fusedops recurrences.

    ``g`` is a per-head log decay (the raw gate with ``use_gate_in_kernel``, through
    :func:`fusedops.gated_delta_rule.fused_gdn_gate`), run by
    :func:`fusedops.fused_recurrent_gated_delta_rule`; ``gk`` a per-key log decay
    ``[B,T,HV,K]``, run by :func:`fusedops.fused_recurrent_kda`. With
    ``use_beta_sigmoid_in_kernel`` (FLA's GatedDeltaNet layer decodes with it) the same
    recurrence runs through the chunked op, which has the flag (:func:`fusedops.chunk_gated_delta_rule`,
    or :func:`fusedops.chunk_kda` for ``allow_neg_eigval`` with ``gk``). ``gv``, ``g`` together
    with ``gk`` and a per-value beta ``[B,T,HV,V]`` are rejected. Unlike FLA's (forward only),
    the result is differentiable. Returns ``(o, final_state)``.
    """
    op = "fused_recurrent_gated_delta_rule"
    state_v_first = state_v_first_from(state_v_first, kwargs)
    if gv is not None:
        unsupported("fla", op, "gv (a per-value decay)",
                    "fusedops implements the per-head decay g and the per-key decay gk")
    if gk is not None and g is not None:
        unsupported("fla", op, "g together with gk",
                    "pass one decay: g [B,T,HV] or gk [B,T,HV,K] (e.g. gk + g[..., None])")
    if beta is not None and beta.dim() == 4:
        unsupported("fla", op, "a per-value beta [B,T,HV,V]", "pass a per-head beta [B,T,HV]")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True`.")
        if g is None:
            raise ValueError("`g` (raw pre-activation) must be provided when `use_gate_in_kernel=True`.")
    if scale is None:
        scale = k.shape[-1] ** -0.5
    if beta is None and use_beta_sigmoid_in_kernel:
        beta = torch.ones_like(v[..., 0])  # FLA: the logits 1, i.e. beta = sigmoid(1)
    h0 = state_to_kv(initial_state, state_v_first)
    common = dict(scale=scale, initial_state=h0, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)
    if gk is not None:
        if allow_neg_eigval:
            o, ht = _kda.chunk_kda(q, k, v, gk, beta, use_beta_sigmoid_in_kernel=True,
                                   allow_neg_eigval=True, **common)
        else:
            o, ht = _kda.fused_recurrent_kda(q, k, v, g=gk, beta=beta,
                                             use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                                             **common)
    elif use_beta_sigmoid_in_kernel:
        if g is None:
            g = torch.zeros_like(v[..., 0], dtype=torch.float32)  # no decay
        o, ht = _gdn.chunk_gated_delta_rule(
            q, k, v, g, beta, use_gate_in_kernel=use_gate_in_kernel,
            A_log=A_log if use_gate_in_kernel else None,
            dt_bias=dt_bias if use_gate_in_kernel else None, use_beta_sigmoid_in_kernel=True,
            allow_neg_eigval=allow_neg_eigval, **common)
    else:
        if use_gate_in_kernel:
            g = _gdn.fused_gdn_gate(g, A_log, dt_bias)
        o, ht = _gdn.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **common)
    return o, state_from_kv(ht, state_v_first)


fused_recurrent_gdn = fused_recurrent_gated_delta_rule
