"""Shared pieces of the compat layer: errors for unsupported arguments and the gate-unit
conversion of FLA's sub-operators (no operator math lives here)."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

#: FLA 0.6 keeps chunk-cumulative gates in log2 units (scaled by 1/ln 2) inside its pipelines and
#: its sub-operators read them with exp2; fusedops' sub-operators read natural-log gates.
LN2 = math.log(2.0)
RCP_LN2 = 1.0 / LN2


def unsupported(lib: str, op: str, what: str, alternative: str, exc=NotImplementedError):
    """Raise ``exc`` naming the library form, the argument and what to do instead."""
    raise exc(f"fusedops.compat.{lib}: {op}: {what} is not supported; {alternative}")


def cp_plan(lib: str, op: str, cp_context):
    """FLA's ``cp_context`` as fusedops takes it: None, or the context-parallel plan of
    ``fusedops.distributed.context_parallel`` (FLA's own FLACPContext is not read). With a plan
    the call runs context parallel and, as in FLA, the plan's sequences replace cu_seqlens."""
    if cp_context is None:
        return None
    from fusedops.distributed import ContextParallel
    if isinstance(cp_context, ContextParallel):
        return cp_context
    unsupported(lib, op, f"cp_context of type {type(cp_context).__name__} (context parallelism)",
                "pass the plan of fusedops.distributed.context_parallel(cu_seqlens, group, conv_width=W), "
                "made once per packed batch (docs/distributed.md)")


def log2_to_natural(g: Optional[Tensor]) -> Optional[Tensor]:
    """A gate FLA's sub-operators read as exp2(g), in the natural-log units fusedops' read
    (float32, float64 kept)."""
    if g is None:
        return None
    dt = torch.float64 if g.dtype == torch.float64 else torch.float32
    return g.to(dt) * LN2


def state_v_first_from(state_v_first: bool, kwargs: dict) -> bool:
    """FLA's handling of the deprecated ``transpose_state_layout`` keyword (popped from
    ``kwargs``): a DeprecationWarning, an error when given with ``state_v_first``."""
    if "transpose_state_layout" not in kwargs:
        return state_v_first
    if state_v_first:
        raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
    import warnings

    warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                  DeprecationWarning, stacklevel=3)
    return kwargs.pop("transpose_state_layout")


def contiguous_state(state: Optional[Tensor], state_v_first: bool) -> Optional[Tensor]:
    """A native op's ``[..., V, K]`` final state (a transposed view) as FLA allocates it."""
    return state.contiguous() if state is not None and state_v_first else state


def process_group_kwargs(lib: str, op: str, native, process_group) -> dict:
    """``{"process_group": group}`` when a group is given and the native function takes one
    (vocab parallelism); a clear error when it does not."""
    if process_group is None:
        return {}
    import inspect

    if "process_group" not in inspect.signature(native).parameters:
        unsupported(lib, op, "process_group (vocab parallelism)",
                    "this fusedops build has no vocab-parallel loss; compute the loss on the "
                    "gathered logits with process_group=None")
    return {"process_group": process_group}


def autograd_function(name: str, fn, doc: str) -> type:
    """A ``torch.autograd.Function`` named ``name`` whose ``apply(*args)`` returns ``fn(*args)``
    (one tensor) and whose backward is ``fn``'s own (``fn`` is a differentiable fusedops call):
    the call forms of libraries whose entry points are autograd Functions."""

    def forward(ctx, *args):
        leaves = [a.detach().requires_grad_(a.requires_grad)
                  if isinstance(a, Tensor) and a.is_floating_point() else a for a in args]
        with torch.enable_grad():
            out = fn(*leaves)
        ctx.leaves, ctx.out = leaves, out
        return out.detach()

    def backward(ctx, grad):
        idx = [i for i, a in enumerate(ctx.leaves) if isinstance(a, Tensor) and a.requires_grad]
        grads = [None] * len(ctx.leaves)
        if idx and ctx.out.requires_grad:
            got = torch.autograd.grad(ctx.out, [ctx.leaves[i] for i in idx], grad,
                                      allow_unused=True)
            for i, gr in zip(idx, got):
                grads[i] = gr
        ctx.leaves = ctx.out = None
        return tuple(grads)

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward),
                 "__doc__": doc, "__module__": "fusedops.compat"})


def fla_kwargs(kwargs: dict, *names: str) -> dict:
    """The keywords FLA reads from a function's ``**kwargs`` (the others it ignores), for the
    native function, which takes them as keyword-only arguments."""
    return {n: kwargs[n] for n in names if n in kwargs}
