"""``fla.ops.kda.chunk``: ``chunk_kda``."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import contiguous_state, cp_plan, fla_kwargs, state_v_first_from
from fusedops.ops import kda as _kda

__all__ = ["chunk_kda"]


def chunk_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: Optional[float] = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    cp_context=None,
    use_graph: bool = False,
    max_num_seqs: Optional[int] = None,
    **kwargs,
):
    """FLA 0.6.0's ``chunk_kda``: :func:`fusedops.chunk_kda` (the same signature) with FLA's
    ``**kwargs`` handling: ``A_log``, ``dt_bias`` (read only with ``use_gate_in_kernel``) and
    ``chunk_size`` come from them, ``transpose_state_layout`` is the deprecated
    ``state_v_first``, other keywords are ignored. ``cp_context`` takes a plan of
    ``fusedops.distributed.context_parallel`` whose sequences replace cu_seqlens. Returns
    ``(o, final_state)``.
    """
    plan = cp_plan("fla", "chunk_kda", cp_context)
    state_v_first = state_v_first_from(state_v_first, kwargs)
    if plan is not None:
        cu_seqlens = cu_seqlens_cpu = None
    extra = fla_kwargs(kwargs, "chunk_size", *(("A_log", "dt_bias") if use_gate_in_kernel else ()))
    o, final_state = _kda.chunk_kda(
        q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
        disable_recompute, return_intermediate_states, state_v_first, cu_seqlens, cu_seqlens_cpu, plan,
        use_graph, max_num_seqs, **extra)
    return o, contiguous_state(final_state, state_v_first)
