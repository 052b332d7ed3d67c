"""``mindspeed_ops.api.triton.fused_recurrent_gated_delta_rule``."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import unsupported
from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["fused_recurrent_gated_delta_rule"]


def fused_recurrent_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None,
                                     beta: Optional[Tensor] = None, scale: Optional[float] = None,
                                     initial_state: Optional[Tensor] = None,
                                     output_final_state: bool = False, *,
                                     use_qk_l2norm_in_kernel: bool = False,
                                     cu_seqlens: Optional[Tensor] = None,
                                     head_first: bool = False):
    """``(o, final_state or None)``: :func:`fusedops.fused_recurrent_gated_delta_rule`."""
    if head_first:
        unsupported("mindspeed_ops", "fused_recurrent_gated_delta_rule", "head_first=True",
                    "pass q, k, v as [B, T, H, D]")
    return _gdn.fused_recurrent_gated_delta_rule(
        q, k, v, g, beta=beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens)
