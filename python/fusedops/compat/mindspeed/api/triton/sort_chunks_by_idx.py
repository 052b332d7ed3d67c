"""``mindspeed_ops.api.triton.sort_chunks_by_idx``: the MoE chunk permutation and its map
helpers (MindSpeed's / TransformerEngine's names)."""

from fusedops.ops import sort_chunks as _sort

__all__ = ["make_chunk_sort_map", "moe_sort_chunks_by_index", "moe_sort_chunks_by_index_with_probs",
           "sort_chunks_by_map"]

make_chunk_sort_map = _sort.make_chunk_sort_map
moe_sort_chunks_by_index = _sort.moe_sort_chunks_by_index
moe_sort_chunks_by_index_with_probs = _sort.moe_sort_chunks_by_index_with_probs
sort_chunks_by_map = _sort.sort_chunks_by_map
