"""fusedops: fused and hot-spot operators for LLM training, on CPUs and NVIDIA GPUs.

Functional API (differentiable, torch.library custom ops):
    fusedops.rmsnorm_without_weight, fusedops.l2norm
Backends: fusedops.backends(op), fusedops.use_backend(...); float64 references in
fusedops.reference.
"""

import torch  # noqa: F401  (loads torch's CUDA runtime before the extension)

from . import _onednn  # noqa: F401  (libdnnl.so.3 where the extension's search path misses it)
from . import _C
from ._backend import backends, check_errors, debug_checks, use_backend, validation
from ._trace import dispatch_trace
from .ops.causal_conv1d import causal_conv1d
from .ops.l2norm import l2norm
from .ops.rmsnorm import rmsnorm_without_weight
from .ops.sort_chunks import (moe_sort_chunks_by_index, moe_sort_chunks_by_index_with_probs,
                               sort_chunks_by_idx, sort_chunks_by_idxs)
from .ops import sort_chunks
from .ops.matmul_add import matmul_add
from .ops.clipped_swiglu import clipped_swiglu, clipped_swiglu_grad
from .ops.cross_entropy import FusedCrossEntropyLossFunction, fused_cross_entropy_loss
from .ops.chunk_loss import chunk_loss
from .ops.rmsnorm_gated import rms_norm_gated, rmsnorm_fn
from .ops.mhc import (hc_head_split, hc_split_sinkhorn, mhc_post, mhc_post_mindspeed, mhc_pre_bmm,
                      sinkhorn)
from .ops import mhc
from .ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from .ops import gated_delta_rule
from .ops.kda import chunk_kda, fused_recurrent_kda
from .ops import kda
from . import reference
from . import nn

__version__ = "0.1.0"

__all__ = [
    "backends",
    "use_backend",
    "validation",
    "dispatch_trace",
    "debug_checks",
    "check_errors",
    "rmsnorm_without_weight",
    "l2norm",
    "causal_conv1d",
    "rms_norm_gated",
    "rmsnorm_fn",
    "clipped_swiglu",
    "clipped_swiglu_grad",
    "sort_chunks_by_idx",
    "sort_chunks_by_idxs",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
    "matmul_add",
    "fused_cross_entropy_loss",
    "FusedCrossEntropyLossFunction",
    "chunk_loss",
    "sinkhorn",
    "hc_split_sinkhorn",
    "hc_head_split",
    "mhc_pre_bmm",
    "mhc_post",
    "mhc_post_mindspeed",
    "mhc",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "gated_delta_rule",
    "chunk_kda",
    "fused_recurrent_kda",
    "kda",
    "reference",
    "nn",
    "built_with_cuda",
]


def built_with_cuda() -> bool:
    """Whether this build contains the CUDA backends."""
    return bool(_C.built_with_cuda())
