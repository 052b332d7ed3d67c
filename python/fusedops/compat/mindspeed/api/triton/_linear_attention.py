"""The shared argument handling of MindSpeed's linear-attention call forms: the first eight
positions are common to every FLA-derived signature (q, k, v, g, beta, scale, initial_state,
output_final_state); the rest is keyword-only, with FLA's names."""

from __future__ import annotations

from fusedops.compat._util import unsupported

_GDN_KEYWORDS = frozenset({"cu_seqlens", "cu_seqlens_cpu", "chunk_indices", "chunk_size",
                           "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "A_log", "dt_bias",
                           "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "state_v_first"})
_KDA_KEYWORDS = _GDN_KEYWORDS | {"safe_gate", "lower_bound", "disable_recompute"}


def keywords(op: str, kwargs: dict, allowed: frozenset, head_first: bool) -> dict:
    """The keywords passed on to the native op (``chunk_indices`` and ``disable_recompute``
    are dropped: fusedops recomputes both); unknown names raise ``TypeError``."""
    if head_first:
        unsupported("mindspeed_ops", op, "head_first=True", "pass q, k, v as [B, T, H, D]")
    unknown = set(kwargs) - allowed
    if unknown:
        raise TypeError(f"fusedops.compat.mindspeed_ops: {op}() got unexpected keyword arguments "
                        f"{sorted(unknown)}")
    return {k: v for k, v in kwargs.items() if k not in ("chunk_indices", "disable_recompute")}


GDN_KEYWORDS = _GDN_KEYWORDS
KDA_KEYWORDS = _KDA_KEYWORDS
