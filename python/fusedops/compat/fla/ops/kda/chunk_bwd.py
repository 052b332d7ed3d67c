"""``fla.ops.kda.chunk_bwd``: ``chunk_kda_bwd_dAv`` and ``chunk_kda_bwd_wy_dqkg_fused``."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import log2_to_natural
from fusedops.ops import kda as _kda
from fusedops.ops.kda import chunk_kda_bwd_dAv  # the same signature (no gate in its inputs)

__all__ = ["chunk_kda_bwd_dAv", "chunk_kda_bwd_wy_dqkg_fused"]


def chunk_kda_bwd_wy_dqkg_fused(q: Tensor, k: Tensor, v: Tensor, v_new: Tensor, g: Tensor,
                                beta: Tensor, A: Tensor, h: Tensor, do: Tensor, dh: Tensor,
                                dv: Tensor, scale: Optional[float] = None,
                                state_v_first: bool = False, cu_seqlens: Optional[Tensor] = None,
                                chunk_size: int = 64, chunk_indices: Optional[Tensor] = None,
                                chunk_offsets: Optional[Tensor] = None, use_graph: bool = False):
    """The native sub-operator (the same signature; dq, dk per value head) with ``g`` in FLA's
    log2 units."""
    return _kda.chunk_kda_bwd_wy_dqkg_fused(q, k, v, v_new, log2_to_natural(g), beta, A, h, do, dh, dv, scale,
                                            state_v_first, cu_seqlens, chunk_size, chunk_indices,
                                            chunk_offsets, use_graph)
