"""``fla.ops.utils``: the utilities fusedops implements."""

from .cumsum import chunk_local_cumsum, chunk_local_cumsum_scalar, chunk_local_cumsum_vector
from .index import prepare_chunk_indices, prepare_chunk_offsets
from .sinkhorn import sinkhorn
from .solve_tril import solve_tril

__all__ = [
    "chunk_local_cumsum",
    "chunk_local_cumsum_scalar",
    "chunk_local_cumsum_vector",
    "prepare_chunk_indices",
    "prepare_chunk_offsets",
    "sinkhorn",
    "solve_tril",
]
