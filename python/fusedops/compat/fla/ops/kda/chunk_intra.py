"""``fla.ops.kda.chunk_intra``: the KDA intra-chunk forward and its backward."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import log2_to_natural
from fusedops.ops import kda as _kda

__all__ = ["chunk_kda_fwd_intra", "chunk_kda_bwd_intra"]


def chunk_kda_fwd_intra(q: Tensor, k: Tensor, v: Tensor, gk: Optional[Tensor] = None,
                        beta: Optional[Tensor] = None, scale: Optional[float] = None,
                        cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                        chunk_indices: Optional[Tensor] = None, safe_gate: bool = False,
                        lower_bound: Optional[float] = None, disable_recompute: bool = False,
                        use_graph: bool = False):
    """The native sub-operator (the same signature and outputs ``(w, u, qg, kg, Aqk, Akk)``) with
    ``gk`` in FLA's log2 units."""
    return _kda.chunk_kda_fwd_intra(q, k, v, log2_to_natural(gk), beta, scale, cu_seqlens, chunk_size,
                                    chunk_indices, safe_gate, lower_bound, disable_recompute, use_graph)


def chunk_kda_bwd_intra(q: Tensor, k: Tensor, g: Tensor, beta: Tensor, dAqk: Tensor, dAkk: Tensor,
                        dq: Tensor, dk: Tensor, db: Tensor, dg: Tensor,
                        cu_seqlens: Optional[Tensor] = None, chunk_indices: Optional[Tensor] = None,
                        chunk_size: int = 64, safe_gate: bool = False,
                        lower_bound: Optional[float] = None, use_graph: bool = False):
    """The native sub-operator (the same signature; dq, dk per value head) with ``g`` in FLA's
    log2 units."""
    return _kda.chunk_kda_bwd_intra(q, k, log2_to_natural(g), beta, dAqk, dAkk, dq, dk, db, dg, cu_seqlens,
                                    chunk_indices, chunk_size, safe_gate, lower_bound, use_graph)
