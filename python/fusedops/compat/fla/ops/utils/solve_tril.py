"""``fla.ops.utils.solve_tril``: the native :func:`fusedops.gated_delta_rule.solve_tril`, whose
signature is FLA 0.6.0's (``A, cu_seqlens, chunk_indices, output_dtype``)."""

from fusedops.ops.gated_delta_rule import solve_tril

__all__ = ["solve_tril"]
