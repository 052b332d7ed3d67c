"""``fla.ops.common.chunk_o``: the chunk output and its local backward pieces."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.compat._util import log2_to_natural, state_to_kv, unsupported
from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["chunk_fwd_o", "chunk_bwd_dv_local", "chunk_bwd_dqkwg"]


def _gate(op: str, g: Optional[Tensor], g_gamma: Optional[Tensor], like: Tensor, chunk_size: int,
          cu_seqlens: Optional[Tensor]) -> Optional[Tensor]:
    """The natural-log chunk-local gate cumsum fusedops reads: from FLA's log2 ``g``, or from a
    fixed per-head log2 decay ``g_gamma [HV]`` (FLA: ``g_gamma * (i+1)`` at position i of each
    chunk), which is the chunk-local cumsum of ``g_gamma`` repeated at every token."""
    if g_gamma is None:
        return log2_to_natural(g)
    if g is not None:
        unsupported("fla", op, "g together with g_gamma", "pass one of them")
    B, T, HV = like.shape[:3]
    if g_gamma.shape != (HV,):
        raise ValueError(f"fusedops.compat.fla: {op}: g_gamma must have shape [HV] = [{HV}], got "
                         f"{list(g_gamma.shape)}")
    per_token = log2_to_natural(g_gamma).expand(B, T, HV).contiguous()
    return _gdn.chunk_local_cumsum(per_token, chunk_size, cu_seqlens=cu_seqlens,
                                   output_dtype=per_token.dtype)


def chunk_fwd_o(q: Tensor, k: Tensor, v: Tensor, h: Tensor, g: Optional[Tensor] = None,
                g_gamma: Optional[Tensor] = None, scale: Optional[float] = None,
                state_v_first: bool = False, cu_seqlens: Optional[Tensor] = None,
                chunk_size: int = 64, chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``o = scale (diag(exp2(g)) Q h[n] + (M>= . Gamma . Q K^T) v)`` per chunk (``v`` = v_new,
    ``g`` in log2 units, or the fixed decay ``g_gamma``). ``chunk_indices`` is recomputed."""
    return _gdn.chunk_fwd_o(q, k, v, state_to_kv(h, state_v_first),
                            g=_gate("chunk_fwd_o", g, g_gamma, v, chunk_size, cu_seqlens),
                            scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size)


def chunk_bwd_dv_local(q: Tensor, k: Tensor, do: Tensor, g: Optional[Tensor] = None,
                       g_gamma: Optional[Tensor] = None, A: Optional[Tensor] = None,
                       scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                       chunk_size: int = 64, chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``dv = scale (M>= . Gamma . Q K^T)^T dO`` per chunk. A precomputed attention matrix
    ``A`` is rejected. ``scale=None`` means ``K**-0.5``."""
    if A is not None:
        unsupported("fla", "chunk_bwd_dv_local", "a precomputed attention matrix A",
                    "pass q, k and the gate (g or g_gamma) instead")
    return _gdn.chunk_bwd_dv_local(q, k, do,
                                   g=_gate("chunk_bwd_dv_local", g, g_gamma, do, chunk_size, cu_seqlens),
                                   scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size)


def chunk_bwd_dqkwg(q: Tensor, k: Tensor, v: Tensor, do: Tensor, h: Tensor, dh: Tensor,
                    w: Optional[Tensor] = None, g: Optional[Tensor] = None,
                    g_gamma: Optional[Tensor] = None, dv: Optional[Tensor] = None,
                    scale: Optional[float] = None, state_v_first: bool = False,
                    cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                    chunk_indices: Optional[Tensor] = None):
    """``(dq, dk, dw or None, dg or None)`` (dq, dk summed over each group of value heads; dg
    the partial gradient w.r.t. the gate cumsum, None with ``g_gamma``, as in FLA). ``dv`` is
    needed with ``w``."""
    op = "chunk_bwd_dqkwg"
    if w is not None and dv is None:
        raise ValueError(f"fusedops.compat.fla: {op}: dv (the gradient of v_new) is required with w")
    gate = _gate(op, g, g_gamma, v, chunk_size, cu_seqlens)
    dq, dk, dw, dg = _gdn.chunk_bwd_dqkwg(
        q, k, v, do, state_to_kv(h, state_v_first), state_to_kv(dh, state_v_first), w=w, g=gate,
        dv=dv if dv is not None else torch.zeros_like(v), scale=scale, cu_seqlens=cu_seqlens,
        chunk_size=chunk_size)
    return dq, dk, dw, (dg if g is not None else None)
