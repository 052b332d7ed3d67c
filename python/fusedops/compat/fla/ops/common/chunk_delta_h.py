"""``fla.ops.common.chunk_delta_h``: the inter-chunk state recurrence and its backward."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import log2_to_natural, state_from_kv, state_to_kv
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
    """``(h [B,NT,HV,K,V], v_new or None, final_state or None)``; ``g``/``gk`` are chunk-local
    cumsums in FLA's log2 units; with ``state_v_first`` every state is ``[..., V, K]``.
    ``cu_seqlens_cpu``, ``chunk_indices`` and ``chunk_offsets`` are accepted and recomputed
    from ``cu_seqlens``."""
    h, v_new, ht = _gdn.chunk_gated_delta_rule_fwd_h(
        k, w, u, g=log2_to_natural(g), gk=log2_to_natural(gk),
        initial_state=state_to_kv(initial_state, state_v_first),
        output_final_state=output_final_state, chunk_size=chunk_size,
        save_new_value=save_new_value, cu_seqlens=cu_seqlens)
    return state_from_kv(h, state_v_first), v_new, state_from_kv(ht, state_v_first)


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
    """``(dh [B,NT,HV,K,V], dh0 or None, dv2)``; dh0 is produced when ``h0`` is given. Gates in
    log2 units; ``state_v_first`` states ``[..., V, K]``. ``chunk_indices``, ``chunk_offsets``
    and ``use_graph`` are accepted and ignored."""
    dh, dh0, dv2 = _gdn.chunk_gated_delta_rule_bwd_dhu(
        q, k, w, do, dv, g=log2_to_natural(g), gk=log2_to_natural(gk),
        h0=state_to_kv(h0, state_v_first), dht=state_to_kv(dht, state_v_first), scale=scale,
        cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    return state_from_kv(dh, state_v_first), state_from_kv(dh0, state_v_first), dv2
