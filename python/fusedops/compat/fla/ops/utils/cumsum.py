"""``fla.ops.utils.cumsum``: chunk-local cumulative sums."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["chunk_local_cumsum", "chunk_local_cumsum_scalar", "chunk_local_cumsum_vector"]


def chunk_local_cumsum(g: Tensor, chunk_size: int, reverse: bool = False,
                       scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                       output_dtype: Optional[torch.dtype] = torch.float,
                       chunk_indices: Optional[Tensor] = None, use_graph: bool = False,
                       **kwargs) -> Tensor:
    """Cumulative sum within each chunk of ``chunk_size`` tokens (a true suffix sum with
    ``reverse``) of a scalar ``[B,T,H]`` or vector ``[B,T,H,S]`` gate, times ``scale``;
    ``output_dtype=None`` keeps g's dtype: the native function (the same signature) with FLA's
    ``**kwargs`` handling (``head_first`` raises, other keywords are ignored)."""
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in `[B, T, H, ...]` format.")
    if g.dim() not in (3, 4):
        raise ValueError(f"Unsupported input shape {g.shape}, which should be (B, T, H) or (B, T, H, D)")
    return _gdn.chunk_local_cumsum(g, chunk_size, reverse, scale, cu_seqlens, output_dtype, chunk_indices,
                                   use_graph)


def chunk_local_cumsum_scalar(g: Tensor, chunk_size: int, reverse: bool = False,
                              scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                              output_dtype: Optional[torch.dtype] = torch.float,
                              chunk_indices: Optional[Tensor] = None, use_graph: bool = False,
                              **kwargs) -> Tensor:
    """:func:`chunk_local_cumsum` of a scalar gate ``[B,T,H]``."""
    if g.dim() != 3:
        raise ValueError(f"chunk_local_cumsum_scalar: g must be [B, T, H], got {list(g.shape)}")
    return chunk_local_cumsum(g, chunk_size, reverse, scale, cu_seqlens, output_dtype, chunk_indices)


def chunk_local_cumsum_vector(g: Tensor, chunk_size: int, reverse: bool = False,
                              scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                              output_dtype: Optional[torch.dtype] = torch.float,
                              chunk_indices: Optional[Tensor] = None, use_graph: bool = False,
                              **kwargs) -> Tensor:
    """:func:`chunk_local_cumsum` of a vector gate ``[B,T,H,S]``."""
    if g.dim() != 4:
        raise ValueError(f"chunk_local_cumsum_vector: g must be [B, T, H, S], got {list(g.shape)}")
    return chunk_local_cumsum(g, chunk_size, reverse, scale, cu_seqlens, output_dtype, chunk_indices)
