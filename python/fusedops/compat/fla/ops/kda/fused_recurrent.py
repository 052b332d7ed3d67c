"""``fla.ops.kda.fused_recurrent``: ``fused_recurrent_kda``."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import contiguous_state, state_v_first_from
from fusedops.ops import kda as _kda

__all__ = ["fused_recurrent_kda"]


def fused_recurrent_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: Optional[float] = None,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    **kwargs,
):
    """FLA 0.6.0's ``fused_recurrent_kda``: :func:`fusedops.fused_recurrent_kda` (the same
    signature) with FLA's ``**kwargs`` handling. Differentiable (FLA's is forward only).
    Returns ``(o, final_state)``."""
    state_v_first = state_v_first_from(state_v_first, kwargs)
    o, final_state = _kda.fused_recurrent_kda(
        q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
        lower_bound, state_v_first, cu_seqlens)
    return o, contiguous_state(final_state, state_v_first)
