"""``fla.ops``: the linear-attention operators fusedops implements."""

from . import common, gated_delta_rule, kda, utils
from .gated_delta_rule import (
                               chunk_gated_delta_rule,
                               chunk_gdn,
                               fused_recurrent_gated_delta_rule,
                               fused_recurrent_gdn,
)
from .kda import chunk_kda, fused_recurrent_kda

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gdn",
    "chunk_kda",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gdn",
    "fused_recurrent_kda",
    "common",
    "gated_delta_rule",
    "kda",
    "utils",
]
