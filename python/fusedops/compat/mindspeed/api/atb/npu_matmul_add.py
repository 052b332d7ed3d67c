"""``mindspeed_ops.api.atb.npu_matmul_add``: the weight-gradient accumulation of Megatron's
gradient-accumulation fusion, ``grad += grad_output^T @ total_input``."""

from __future__ import annotations

import torch
from torch import Tensor

from fusedops.ops.matmul_add import matmul_add as _matmul_add

__all__ = ["npu_matmul_add_fp32", "npu_matmul_add_fp16"]


def npu_matmul_add_fp32(total_input: Tensor, grad_output: Tensor, grad: Tensor) -> None:
    """``grad += grad_output^T @ total_input`` in place, ``grad`` a float32 main_grad
    (:func:`fusedops.matmul_add`)."""
    _matmul_add(grad_output, total_input, grad)


def npu_matmul_add_fp16(total_input: Tensor, grad_output: Tensor, grad: Tensor) -> None:
    """The same for a bfloat16 / float16 ``grad`` (main_grad): the product is accumulated in
    float32 onto an fp32 copy of ``grad`` and rounded back once."""
    if grad.dtype == torch.float32:
        _matmul_add(grad_output, total_input, grad)
        return
    acc = grad.float()
    _matmul_add(grad_output, total_input, acc)
    grad.copy_(acc)
