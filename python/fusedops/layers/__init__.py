"""Model layers built from fusedops operators (flash-linear-attention's ``fla.layers`` forms)."""

from .kda import KimiDeltaAttention, StateCache

__all__ = ["KimiDeltaAttention", "StateCache"]
