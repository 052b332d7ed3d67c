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
    """FLA 0.6.0's ``fused_recurrent_kda`` (``A_log``, ``dt_bias`` at positions 6 and 7) on
    :func:`fusedops.fused_recurrent_kda`; with ``allow_neg_eigval`` the same recurrence runs
    through :func:`fusedops.chunk_kda`, which has the flag. Differentiable (FLA's is forward
    only). Returns ``(o, final_state)``."""
    state_v_first = state_v_first_from(state_v_first, kwargs)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    common = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                  use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
                  lower_bound=lower_bound, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                  cu_seqlens=cu_seqlens, state_v_first=state_v_first)
    if allow_neg_eigval:
        o, final_state = _kda.chunk_kda(q, k, v, g, beta, allow_neg_eigval=True, **common)
    else:
        o, final_state = _kda.fused_recurrent_kda(q, k, v, g=g, beta=beta, **common)
    return o, contiguous_state(final_state, state_v_first)
