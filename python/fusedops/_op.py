"""Glue shared by every op module.

An op is written once as plain functions (the forward and backward implementations that call
the C++ core, their fake versions, and one setup_context/backward pair), and exposed twice:

* eagerly through a ``torch.autograd.Function`` that calls the implementation directly: a few
  microseconds of Python per call and no ``torch._dynamo`` import on the first call;
* under ``torch.compile`` through a ``torch.library.custom_op`` (schema, fake implementation,
  registered autograd), which the compiler keeps as one opaque node (fullgraph-safe, CUDA-graph
  safe, checked by ``torch.library.opcheck``).

Both paths run the same code, so they give bitwise-identical results.
"""

from __future__ import annotations

import contextvars
import inspect
from typing import Callable, Optional

import torch


def _traced(args) -> bool:
    """True under torch.compile and when any tensor argument is a tensor subclass (FakeTensor,
    FunctionalTensor, ...: AOT tracing, opcheck, tensor-subclass users): then the custom op
    path, which PyTorch knows how to trace."""
    if torch.compiler.is_compiling():
        return True
    for a in args:
        if isinstance(a, torch.Tensor) and type(a) is not torch.Tensor and not isinstance(a, torch.nn.Parameter):
            return True
    return False


class DifferentiableOp:
    """``fusedops::<name>``: a custom op with autograd plus its eager autograd.Function twin.

    ``impl(*args) -> outputs`` must have type annotations (they define the op schema);
    ``setup_context(ctx, inputs, outputs)`` and ``backward(ctx, *grads)`` follow
    ``torch.library.register_autograd``; gradients of outputs that did not receive one arrive as
    None (grads are not materialised).
    """

    def __init__(self, name: str, impl: Callable, fake: Callable, setup_context: Callable,
                 backward: Callable):
        self.name = name
        self.impl = impl
        self.custom_op = torch.library.custom_op(f"fusedops::{name}", mutates_args=())(impl)
        self.custom_op.register_fake(fake)

        def setup(ctx, inputs, output):
            ctx.set_materialize_grads(False)
            # Autograd may run the backward on another thread (CUDA's device thread), which would
            # not see the caller's use_backend()/validation() context variables: keep a snapshot.
            ctx.fusedops_context = contextvars.copy_context()
            setup_context(ctx, inputs, output)

        def backward_in_context(ctx, *grads):
            return ctx.fusedops_context.copy().run(backward, ctx, *grads)

        torch.library.register_autograd(f"fusedops::{name}", backward_in_context, setup_context=setup)

        def forward(ctx, *args):
            outputs = impl(*args)
            setup(ctx, args, outputs)
            return outputs

        self.function = type(
            f"{name}_function",
            (torch.autograd.Function,),
            {"forward": staticmethod(forward), "backward": staticmethod(backward_in_context)},
        )

    def __call__(self, *args):
        if _traced(args):
            return self.custom_op(*args)
        if not torch.is_grad_enabled() or not any(isinstance(a, torch.Tensor) and a.requires_grad
                                                  for a in args):
            # No graph is recorded (torch.no_grad / inference_mode, or no input requiring a
            # gradient): the implementation alone, as Function.apply would run it, without its
            # context object and saved tensors.
            return self.impl(*args)
        return self.function.apply(*args)


class PlainOp:
    """``fusedops::<name>`` without autograd (backward kernels, in-place updates): the
    implementation eagerly, the custom op under torch.compile. Eagerly, the tensors named in
    ``mutates_args`` get their autograd version counter bumped after the call, as the custom op's
    dispatch does: a graph that saved one of them then refuses a second backward instead of
    reading the changed values."""

    def __init__(self, name: str, impl: Callable, fake: Optional[Callable],
                 mutates_args: tuple = ()):
        self.name = name
        self.impl = impl
        self.custom_op = torch.library.custom_op(f"fusedops::{name}", mutates_args=mutates_args)(impl)
        if fake is not None:
            self.custom_op.register_fake(fake)
        names = list(inspect.signature(impl).parameters)
        self.mutated = tuple(names.index(n) for n in mutates_args)

    def __call__(self, *args):
        if _traced(args):
            return self.custom_op(*args)
        out = self.impl(*args)
        self.mark_mutated(*args)
        return out

    def mark_mutated(self, *args):
        """Bump the version counters of the ``mutates_args`` tensors among ``args``, as a call
        with these arguments does; for a caller that knows the call would change nothing and
        skips it (the loss backwards for an upstream gradient of 1)."""
        if self.mutated:
            torch.autograd.graph.increment_version(
                [args[i] for i in self.mutated if i < len(args) and isinstance(args[i], torch.Tensor)])
