"""``mindspeed_ops.api.triton.kda``: ``chunk_kda`` and ``fused_recurrent_kda``."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.ops import kda as _kda

from ._linear_attention import KDA_KEYWORDS, keywords

__all__ = ["chunk_kda", "fused_recurrent_kda"]


def chunk_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
              scale: Optional[float] = None, initial_state: Optional[Tensor] = None,
              output_final_state: bool = False, *, head_first: bool = False, **kwargs):
    """``(o, final_state or None)``: :func:`fusedops.chunk_kda`, FLA's options by keyword."""
    kw = keywords("chunk_kda", kwargs, KDA_KEYWORDS, head_first)
    return _kda.chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state, **kw)


def fused_recurrent_kda(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None,
                        beta: Optional[Tensor] = None, scale: Optional[float] = None,
                        initial_state: Optional[Tensor] = None, output_final_state: bool = False,
                        *, head_first: bool = False, **kwargs):
    """``(o, final_state or None)``: :func:`fusedops.fused_recurrent_kda`, FLA's options by
    keyword."""
    kw = keywords("fused_recurrent_kda", kwargs,
                  frozenset({"use_qk_l2norm_in_kernel", "use_gate_in_kernel", "A_log", "dt_bias",
                             "lower_bound", "use_beta_sigmoid_in_kernel", "cu_seqlens",
                             "state_v_first"}), head_first)
    return _kda.fused_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                    output_final_state=output_final_state, **kw)
