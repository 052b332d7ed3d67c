"""``fla.ops.common.chunk_delta_h``: the inter-chunk state recurrence and its backward."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import log2_to_natural
from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["chunk_gated_delta_rule_fwd_h", "chunk_gated_delta_rule_bwd_dhu"]


def chunk_gated_delta_rule_fwd_h(
    k: Tensor,
    w: Tensor,
    u: Tensor,
    g: Optional[Tensor] = None,
    gk: Optional[Tensor] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    save_new_value: bool = True,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    chunk_indices: Optional[Tensor] = None,
    chunk_offsets: Optional[Tensor] = None,
) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """The native sub-operator (the same signature) with ``g``/``gk`` in FLA's log2 units."""
    return _gdn.chunk_gated_delta_rule_fwd_h(
        k, w, u, log2_to_natural(g), log2_to_natural(gk), initial_state, output_final_state, chunk_size,
        save_new_value, state_v_first, cu_seqlens, cu_seqlens_cpu, chunk_indices, chunk_offsets)


def chunk_gated_delta_rule_bwd_dhu(
    q: Tensor,
    k: Tensor,
    w: Tensor,
    do: Tensor,
    dv: Tensor,
    g: Optional[Tensor] = None,
    gk: Optional[Tensor] = None,
    h0: Optional[Tensor] = None,
    dht: Optional[Tensor] = None,
    scale: Optional[float] = None,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    chunk_size: int = 64,
    chunk_indices: Optional[Tensor] = None,
    chunk_offsets: Optional[Tensor] = None,
    use_graph: bool = False,
) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """The native sub-operator (the same signature) with ``g``/``gk`` in FLA's log2 units."""
    return _gdn.chunk_gated_delta_rule_bwd_dhu(
        q, k, w, do, dv, log2_to_natural(g), log2_to_natural(gk), h0, dht, scale, state_v_first,
        cu_seqlens, chunk_size, chunk_indices, chunk_offsets, use_graph)
