"""``fla.ops.gated_delta_rule``."""

from .chunk import chunk_gated_delta_rule, chunk_gdn
from .fused_recurrent import fused_recurrent_gated_delta_rule, fused_recurrent_gdn

__all__ = [
    "chunk_gated_delta_rule", "chunk_gdn",
    "fused_recurrent_gated_delta_rule", "fused_recurrent_gdn",
]
