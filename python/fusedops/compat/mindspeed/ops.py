"""``torch.ops.mindspeed_ops.*``: the operators MindSpeed Ops registers with PyTorch through
ACLNN (ATB for the matmul-add), defined here on the fusedops operators (composite
implementations: autograd and torch.compile go through the fusedops ops they call).

Registered at import; a namespace that already has these names (the real MindSpeed Ops loaded
in the same process) is left alone.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.ops.clipped_swiglu import clipped_swiglu as _clipped_swiglu

from .api.atb.npu_matmul_add import npu_matmul_add_fp16, npu_matmul_add_fp32

__all__ = ["NAMES"]

_SCHEMAS = {
    "npu_matmul_add_fp32": ("npu_matmul_add_fp32(Tensor total_input, Tensor grad_output, "
                            "Tensor(a!) grad) -> ()", npu_matmul_add_fp32),
    "npu_matmul_add_fp16": ("npu_matmul_add_fp16(Tensor total_input, Tensor grad_output, "
                            "Tensor(a!) grad) -> ()", npu_matmul_add_fp16),
}


def _npu_clipped_swiglu(x: Tensor, group_index: Optional[Tensor] = None, dim: int = -1,
                        alpha: float = 1.702, limit: float = 7.0, bias: float = 1.0,
                        interleaved: bool = True) -> Tensor:
    return _clipped_swiglu(x, group_index=group_index, dim=dim, alpha=alpha, limit=limit,
                           bias=bias, interleaved=interleaved)


_SCHEMAS["npu_clipped_swiglu"] = (
    "npu_clipped_swiglu(Tensor x, Tensor? group_index=None, int dim=-1, float alpha=1.702, "
    "float limit=7.0, float bias=1.0, bool interleaved=True) -> Tensor", _npu_clipped_swiglu)

#: the names under torch.ops.mindspeed_ops
NAMES = tuple(_SCHEMAS)

_LIB = torch.library.Library("mindspeed_ops", "FRAGMENT")
for _name, (_schema, _fn) in _SCHEMAS.items():
    if hasattr(torch.ops.mindspeed_ops, _name):
        continue
    _LIB.define(_schema)
    _LIB.impl(_name, _fn, "CompositeImplicitAutograd")
