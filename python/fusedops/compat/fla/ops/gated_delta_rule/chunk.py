"""``fla.ops.gated_delta_rule.chunk``: ``chunk_gated_delta_rule`` (alias ``chunk_gdn``)."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import contiguous_state, cp_plan, state_v_first_from
from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["chunk_gated_delta_rule", "chunk_gdn"]


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    chunk_indices: Optional[Tensor] = None,
    cp_context=None,
    **kwargs,
):
    """FLA 0.6.0's ``chunk_gated_delta_rule`` on :func:`fusedops.chunk_gated_delta_rule`.

    Keyword-only extras read from ``**kwargs`` as FLA does: ``chunk_size`` (16/32/64, default
    64), ``use_gate_in_kernel``, ``A_log``, ``dt_bias`` and the deprecated
    ``transpose_state_layout``; ``head_first`` raises; other keywords are ignored, as in FLA.
    ``chunk_indices`` is accepted and ignored (fusedops derives the chunks from cu_seqlens).
    ``cp_context`` takes a plan of ``fusedops.distributed.context_parallel`` (the call then runs
    context parallel on this rank's tokens). Returns ``(o, final_state)``.
    """
    op = "chunk_gated_delta_rule"
    plan = cp_plan("fla", op, cp_context)
    state_v_first = state_v_first_from(state_v_first, kwargs)
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in `[B, T, H, ...]` format.")
    use_gate_in_kernel = kwargs.get("use_gate_in_kernel", False)
    o, final_state = _gdn.chunk_gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=None if plan is not None else cu_seqlens,
        cu_seqlens_cpu=None if plan is not None else cu_seqlens_cpu,
        chunk_size=kwargs.get("chunk_size", 64), use_gate_in_kernel=use_gate_in_kernel,
        A_log=kwargs.get("A_log"), dt_bias=kwargs.get("dt_bias"),
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        state_v_first=state_v_first, cp=plan)
    return o, contiguous_state(final_state, state_v_first)


chunk_gdn = chunk_gated_delta_rule
