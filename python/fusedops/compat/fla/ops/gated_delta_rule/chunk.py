"""``fla.ops.gated_delta_rule.chunk``: ``chunk_gated_delta_rule`` (alias ``chunk_gdn``)."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import contiguous_state, cp_plan, fla_kwargs, state_v_first_from
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
    """FLA 0.6.0's ``chunk_gated_delta_rule``: :func:`fusedops.chunk_gated_delta_rule` (the same
    signature) with FLA's ``**kwargs`` handling: ``chunk_size``, ``use_gate_in_kernel``,
    ``A_log`` and ``dt_bias`` are read from them, ``transpose_state_layout`` is the deprecated
    ``state_v_first``, ``head_first`` raises, other keywords are ignored. ``cp_context`` takes a
    plan of ``fusedops.distributed.context_parallel`` whose sequences replace cu_seqlens, as FLA's
    context does. Returns ``(o, final_state)`` (a contiguous ``[N,HV,V,K]`` state with
    ``state_v_first``).
    """
    plan = cp_plan("fla", "chunk_gated_delta_rule", cp_context)
    state_v_first = state_v_first_from(state_v_first, kwargs)
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in `[B, T, H, ...]` format.")
    if plan is not None:
        cu_seqlens = cu_seqlens_cpu = chunk_indices = None
    o, final_state = _gdn.chunk_gated_delta_rule(
        q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens, cu_seqlens_cpu,
        chunk_indices, plan, **fla_kwargs(kwargs, "chunk_size", "use_gate_in_kernel", "A_log", "dt_bias"))
    return o, contiguous_state(final_state, state_v_first)


chunk_gdn = chunk_gated_delta_rule
