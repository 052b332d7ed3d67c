"""``fla.ops.kda.wy_fast``: the KDA WY representation (``recompute_w_u_fwd``)."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import log2_to_natural
from fusedops.ops import kda as _kda

__all__ = ["recompute_w_u_fwd"]


def recompute_w_u_fwd(k: Tensor, v: Tensor, beta: Tensor, A: Tensor, gk: Tensor,
                      q: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                      chunk_indices: Optional[Tensor] = None, use_graph: bool = False):
    """``(w, u, qg or None, kg)``: ``w = A (beta exp2(gk) k)``, ``u = A (beta v)``,
    ``qg = q exp2(gk)`` (when q is given), ``kg = k exp2(gk_last - gk)``; ``gk`` the chunk-local
    cumsum in FLA's log2 units, ``A`` the solved Akk."""
    return _kda.kda_recompute_w_u_fwd(k, v, beta, A, log2_to_natural(gk), q=q,
                                      cu_seqlens=cu_seqlens)
