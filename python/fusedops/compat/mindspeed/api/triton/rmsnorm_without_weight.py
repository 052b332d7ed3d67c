"""``mindspeed_ops.api.triton.rmsnorm_without_weight`` (MindSpeed-LLM DeepSeek-V4's form)."""

from __future__ import annotations

from torch import Tensor

from fusedops.ops.rmsnorm import rmsnorm_without_weight as _rms

__all__ = ["rmsnorm_without_weight"]


def rmsnorm_without_weight(x: Tensor, norm_eps: float = 1e-6) -> Tensor:
    """The per-row factor ``(mean(x**2, -1) + norm_eps) ** -0.5``, shape ``[..., 1]``, x's
    dtype; differentiable."""
    return _rms(x, norm_eps)
