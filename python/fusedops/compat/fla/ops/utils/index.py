"""``fla.ops.utils.index``: chunk bookkeeping of packed (varlen) batches."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["prepare_chunk_indices", "prepare_chunk_offsets"]


def prepare_chunk_indices(cu_seqlens: Tensor, chunk_size: int,
                          cu_seqlens_cpu: Optional[Tensor] = None) -> Tensor:
    """``[NT, 2]`` (sequence, chunk within the sequence) for every chunk, in cu_seqlens' dtype
    and device."""
    return _gdn.prepare_chunk_indices(cu_seqlens, chunk_size, cu_seqlens_cpu).to(cu_seqlens)


def prepare_chunk_offsets(cu_seqlens: Tensor, chunk_size: int) -> Tensor:
    """``[N+1]`` cumulative chunk counts of the sequences, in cu_seqlens' dtype and device."""
    return _gdn.prepare_chunk_offsets(cu_seqlens, chunk_size).to(cu_seqlens)
