"""``mindspeed_ops.api.triton.chunk_gated_delta_rule``."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.ops import gated_delta_rule as _gdn

from ._linear_attention import GDN_KEYWORDS, keywords

__all__ = ["chunk_gated_delta_rule"]


def chunk_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                           scale: Optional[float] = None, initial_state: Optional[Tensor] = None,
                           output_final_state: bool = False, *, head_first: bool = False,
                           **kwargs):
    """``(o, final_state or None)``: :func:`fusedops.chunk_gated_delta_rule`. After the eight
    positional arguments, FLA's options by keyword (``cu_seqlens``, ``chunk_size=64``,
    ``use_qk_l2norm_in_kernel``, ``use_gate_in_kernel`` / ``A_log`` / ``dt_bias``, ...);
    ``head_first=False`` is accepted, True rejected."""
    kw = keywords("chunk_gated_delta_rule", kwargs, GDN_KEYWORDS, head_first)
    return _gdn.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                       output_final_state=output_final_state, **kw)
