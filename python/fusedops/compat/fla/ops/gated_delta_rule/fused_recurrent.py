"""``fla.ops.gated_delta_rule.fused_recurrent``: ``fused_recurrent_gated_delta_rule`` (alias
``fused_recurrent_gdn``)."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import contiguous_state, state_v_first_from
from fusedops.ops import gated_delta_rule as _gdn

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
    """FLA 0.6.0's ``fused_recurrent_gated_delta_rule``: :func:`fusedops.fused_recurrent_gated_delta_rule`
    (the same signature) with FLA's ``**kwargs`` handling (``transpose_state_layout`` the
    deprecated ``state_v_first``, other keywords ignored). Unlike FLA's (forward only), the
    result is differentiable. Returns ``(o, final_state)``.
    """
    state_v_first = state_v_first_from(state_v_first, kwargs)
    o, ht = _gdn.fused_recurrent_gated_delta_rule(
        q, k, v, g, gk, gv, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
        cu_seqlens)
    return o, contiguous_state(ht, state_v_first)


fused_recurrent_gdn = fused_recurrent_gated_delta_rule
