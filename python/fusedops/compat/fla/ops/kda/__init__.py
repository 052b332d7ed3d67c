"""``fla.ops.kda``."""

from .chunk import chunk_kda
from .fused_recurrent import fused_recurrent_kda

__all__ = ["chunk_kda", "fused_recurrent_kda"]
