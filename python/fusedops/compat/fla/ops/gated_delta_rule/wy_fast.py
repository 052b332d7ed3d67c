"""``fla.ops.gated_delta_rule.wy_fast``: the WY representation and its backward."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import log2_to_natural
from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["recompute_w_u_fwd", "prepare_wy_repr_bwd"]


def recompute_w_u_fwd(k: Tensor, v: Tensor, beta: Tensor, A: Tensor, g: Optional[Tensor] = None,
                      cu_seqlens: Optional[Tensor] = None,
                      chunk_indices: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """``(w, u) = (A (beta exp2(g) k), A (beta v))`` per chunk (``A`` the solved
    ``(I + A)^{-1}``, ``g`` in log2 units)."""
    return _gdn.recompute_w_u_fwd(k, v, beta, A, g=log2_to_natural(g), cu_seqlens=cu_seqlens)


def prepare_wy_repr_bwd(k: Tensor, v: Tensor, beta: Tensor, A: Tensor, dw: Tensor, du: Tensor,
                        g: Tensor = None, cu_seqlens: Optional[Tensor] = None,
                        chunk_indices: Optional[Tensor] = None):
    """``(dk, dv, db, dg or None)``: the backward of :func:`recompute_w_u_fwd` and of the
    solve (dk summed over each group of value heads)."""
    return _gdn.prepare_wy_repr_bwd(k, v, beta, A, dw, du, g=log2_to_natural(g),
                                    cu_seqlens=cu_seqlens)
