"""``fla.ops.kda.chunk``: ``chunk_kda``."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import contiguous_state, cp_plan, state_v_first_from, unsupported
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
    """FLA 0.6.0's ``chunk_kda`` on :func:`fusedops.chunk_kda`.

    ``A_log``, ``dt_bias`` and ``chunk_size`` (32/64) come through ``**kwargs`` as in FLA; other
    keywords are ignored, as in FLA (``transpose_state_layout`` is the deprecated
    ``state_v_first``). ``disable_recompute``, ``use_graph`` and ``max_num_seqs`` are accepted
    and ignored (the results are the same); ``return_intermediate_states`` is rejected;
    ``cp_context`` takes a plan of ``fusedops.distributed.context_parallel``. Returns
    ``(o, final_state)``.
    """
    op = "chunk_kda"
    plan = cp_plan("fla", op, cp_context)
    if return_intermediate_states:
        unsupported("fla", op, "return_intermediate_states",
                    "run chunk_gated_delta_rule_fwd_h on the outputs of chunk_kda_fwd_intra for the "
                    "per-chunk states")
    state_v_first = state_v_first_from(state_v_first, kwargs)
    A_log, dt_bias = (kwargs.get("A_log"), kwargs.get("dt_bias")) if use_gate_in_kernel else (None, None)
    o, final_state = _kda.chunk_kda(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, safe_gate=safe_gate,
        lower_bound=lower_bound, cu_seqlens=None if plan is not None else cu_seqlens,
        chunk_size=kwargs.get("chunk_size", 64),
        cu_seqlens_cpu=None if plan is not None else cu_seqlens_cpu, allow_neg_eigval=allow_neg_eigval,
        state_v_first=state_v_first, cp=plan)
    return o, contiguous_state(final_state, state_v_first)
