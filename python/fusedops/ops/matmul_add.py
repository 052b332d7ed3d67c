"""matmul_add: the fused weight-gradient accumulation ``main_grad += grad_output^T @ input``
(MindSpeed's ``npu_matmul_add_fp32``, Megatron's gradient-accumulation fusion) as a
torch.library custom op (``fusedops::matmul_add``, used when traced; see fusedops._op) that
mutates ``main_grad``.

There is no autograd formula: the op is itself the weight-gradient step of a linear layer's
backward, called from inside a backward (or an optimizer hook) on tensors that do not require
grad. Calling it on tensors that require grad raises nothing, but nothing is recorded either.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from .._op import PlainOp

_OP = "matmul_add"
_ALIGN = 256  # cuBLASLt's default assumption for matrix addresses (see matmul_add_sm80.cu)


def _aligned(t: Tensor) -> Tensor:
    """`t` when its data starts on a 256-byte boundary, else an aligned copy (CUDA only)."""
    if t.is_cuda and t.numel() and t.data_ptr() % _ALIGN:
        return t.clone(memory_format=torch.contiguous_format)
    return t


def _operand(t: Tensor) -> Tensor:
    if t.dim() == 0:
        return t
    # rows_view also copies rows that overlap (a stride-0 token dim), which a GEMM cannot take.
    return _aligned(rows_view(t))


def _matmul_add_impl(grad_output: Tensor, input: Tensor, main_grad: Tensor) -> None:
    ctx = context(_OP, grad_output)  # the operands' device is the call's device
    go, x = _operand(grad_output), _operand(input)
    workspace = None
    if grad_output.is_cuda:
        workspace = torch.empty(_C.matmul_add_workspace_size(ctx), dtype=torch.uint8,
                                device=grad_output.device)
    target = main_grad
    if (main_grad.is_cuda and main_grad.is_contiguous() and main_grad.numel()
            and main_grad.data_ptr() % _ALIGN):
        target = main_grad.clone()  # accumulate into an aligned copy, then write it back
    _C.matmul_add_fwd(ctx, go, x, target, workspace)
    if target is not main_grad:
        main_grad.copy_(target)


def _matmul_add_fake(grad_output, input, main_grad):
    return None


# Eagerly the implementation itself; under torch.compile the custom op fusedops::matmul_add,
# which declares that it writes main_grad.
_matmul_add = PlainOp("matmul_add", _matmul_add_impl, _matmul_add_fake, mutates_args=("main_grad",))


def matmul_add(grad_output: Tensor, input: Tensor, main_grad: Tensor) -> Tensor:
    """``main_grad += grad_output^T @ input``, in place; returns ``main_grad``.

    Args:
        grad_output: ``[..., out]`` float32 / bfloat16 / float16 (the gradient of a linear
            layer's output); the leading dims are the tokens.
        input: ``[..., in]``, grad_output's dtype and leading dims (the layer's input).
        main_grad: ``[out, in]`` float32, contiguous: the weight's gradient accumulator.

    The products accumulate in fp32 inside one GEMM whose epilogue adds main_grad (cuBLASLt with
    beta = 1 on CUDA; on the CPU oneDNN's matmul with a sum post-op, fp32 and bf16 operands as
    they are (AMX for bf16 where the CPU has it), fp16 operands converted a block of tokens at a
    time). Not differentiable (it is a backward helper).
    """
    _matmul_add(grad_output, input, main_grad)
    return main_grad


def npu_matmul_add_fp32(total_input: Tensor, grad_output: Tensor, grad: Tensor) -> None:
    """MindSpeed's argument order: ``grad += grad_output^T @ total_input``."""
    matmul_add(grad_output, total_input, grad)
