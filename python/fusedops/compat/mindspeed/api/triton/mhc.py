"""``mindspeed_ops.api.triton.mhc``: the mHC (hyper-connection) operators in MindSpeed-LLM
DeepSeek-V4's call forms: ``hc_split_sinkhorn``, ``sinkhorn``, ``MhcPreBmm.apply(pre, x)`` and
``MHCPostTriton.apply(x, residual, h_post, h_res)`` with the flattened ``[B, S, n*C]``
residual."""

from __future__ import annotations

from torch import Tensor

from fusedops.compat._util import autograd_function
from fusedops.ops import mhc as _mhc

__all__ = ["MHCPostTriton", "MhcPreBmm", "hc_split_sinkhorn", "mhc_post", "mhc_pre_bmm", "sinkhorn"]


def hc_split_sinkhorn(mixes: Tensor, hc_scale: Tensor, hc_base: Tensor, hc_mult: int = 4,
                      sinkhorn_iters: int = 20, eps: float = 1e-6):
    """``(pre [..., n], post [..., n], comb [..., n, n])`` from ``mixes [..., (2+n)n]``."""
    return _mhc.hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)


def sinkhorn(logits: Tensor, num_iters: int = 20, eps: float = 1e-6) -> Tensor:
    """MindSpeed's Sinkhorn-Knopp of every ``[n, n]`` matrix (row, then column normalisation,
    ``eps`` in every denominator)."""
    return _mhc.sinkhorn(logits, num_iters, eps, variant="mindspeed")


def mhc_pre_bmm(pre: Tensor, x_unflatten: Tensor) -> Tensor:
    """``y[..., c] = sum_i pre[..., i] x[..., i, c]`` in float32 (x ``[B, S, n, C]``)."""
    return _mhc.mhc_pre_bmm(pre, x_unflatten)


def mhc_post(x: Tensor, residual: Tensor, h_post: Tensor, h_res: Tensor) -> Tensor:
    """``out[..., k, :] = h_post[..., k] x + sum_j h_res[..., j, k] residual[..., j, :]`` with x
    ``[B, S, C]`` the sub-layer output and residual ``[B, S, n*C]`` (flattened streams); returns
    ``[B, S, n*C]``."""
    B, S, C = x.shape
    n = h_post.shape[-1]
    out = _mhc.mhc_post_mindspeed(x, residual.reshape(B, S, n, C), h_post, h_res)
    return out.reshape(B, S, n * C)


MhcPreBmm = autograd_function(
    "MhcPreBmm", mhc_pre_bmm,
    "MindSpeed-LLM's ``MhcPreBmm.apply(pre, x_unflatten)`` (a torch.autograd.Function): "
    ":func:`mhc_pre_bmm`.")
MHCPostTriton = autograd_function(
    "MHCPostTriton", mhc_post,
    "MindSpeed-LLM's ``MHCPostTriton.apply(x, residual, h_post, h_res)`` (a "
    "torch.autograd.Function): :func:`mhc_post` with the flattened ``[B, S, n*C]`` residual.")
