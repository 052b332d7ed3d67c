"""Shared pieces of the property-based tests (hypothesis): shape strategies that favour the sizes
where kernels switch paths, reproducible settings, and one check of outputs and gradients
against the float64 reference under the precision policy (tests/common/tolerance.py)."""

from __future__ import annotations

import importlib
from typing import Callable, Sequence

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.common.tolerance import assert_close, coarsest

# 1, small primes, and both sides of the vector widths (4/8/16 lanes), warp and block sizes and
# the chunk lengths (64) where kernels change path.
SPECIAL = (1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 31, 32, 33, 61, 63, 64, 65, 127, 128, 129, 257)


def dim(hi: int, lo: int = 1) -> st.SearchStrategy[int]:
    """A size in [lo, hi]: a special size half of the time, else any."""
    special = [v for v in SPECIAL if lo <= v <= hi] or [lo]
    return st.one_of(st.sampled_from(special), st.integers(lo, hi))


DTYPES = st.sampled_from([torch.float32, torch.bfloat16])

# Reproducible in CI (derandomize: the examples follow from the test itself; no database), no
# per-example deadline (the first call of a shape may allocate), and few examples: the whole
# property suite is bounded to well under a minute on two cores. A failure prints the drawn
# arguments (seed included), which reproduce it.
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


def composite_of(module: str, name: str = "composite") -> Callable:
    """The plain PyTorch composite a family's test module defines (the policy's base)."""
    return getattr(importlib.import_module(f"tests.python.ops.{module}"), name)


def normal(shape, dtype, device, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tuple(shape), generator=g, dtype=torch.float64) * scale).to(dtype).to(device)


def strided(t: torch.Tensor, how: str) -> torch.Tensor:
    """t's values in another layout: "rows" (rows padded: a row stride larger than the last dim),
    "cols" (the last dim strided: the Python layer copies), or "dense" (t itself)."""
    if how == "dense" or t.dim() < 2:
        return t
    if how == "rows":
        buf = torch.zeros(t.shape[:-1] + (t.shape[-1] + 3,), dtype=t.dtype, device=t.device)
        buf[..., : t.shape[-1]] = t
        return buf[..., : t.shape[-1]]
    buf = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
    buf[..., ::2] = t
    return buf[..., ::2]


LAYOUTS = st.sampled_from(["dense", "rows", "cols"])


def check_against_reference(what: str, ours: Callable, base: Callable, ref: Callable,
                            inputs: dict, grad_of: Sequence[str], seed: int, tol_dtype=None,
                            outputs: Sequence[int] | None = None):
    """Runs ours / base (the composite in the input dtype) / ref (float64) on `inputs`, each on
    its own leaves, and asserts every output (or those listed) and the gradients of the inputs
    named in `grad_of` (for random cotangents) under the precision policy."""

    def run(fn, cast):
        leaves = {k: (cast(v).detach().requires_grad_(k in grad_of) if isinstance(v, torch.Tensor)
                      and v.is_floating_point() else v) for k, v in inputs.items()}
        outs = fn(**leaves)
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        outs = [o for i, o in enumerate(outs) if o is not None and (outputs is None or i in outputs)]
        wanted = [leaves[k] for k in grad_of]
        grads = []
        if wanted:
            cots = [normal(o.shape, o.dtype, o.device, seed + 7 + i) for i, o in enumerate(outs)]
            loss = sum((o * c).sum() for o, c in zip(outs, cots))
            grads = [g if g is not None else torch.zeros_like(w)
                     for g, w in zip(torch.autograd.grad(loss, wanted, allow_unused=True), wanted)]
        return [o.detach() for o in outs], grads

    o_ours, g_ours = run(ours, lambda t: t)
    o_base, g_base = run(base, lambda t: t)
    o_ref, g_ref = run(ref, lambda t: t.double())
    for i, (a, b, r) in enumerate(zip(o_ours, o_base, o_ref)):
        dt = tol_dtype or coarsest(*(t.dtype for t in inputs.values()
                                     if isinstance(t, torch.Tensor) and t.is_floating_point()), a.dtype)
        assert_close(a, b, r, dt, f"{what} output {i}")
    for k, a, b, r in zip(grad_of, g_ours, g_base, g_ref):
        assert_close(a, b, r, tol_dtype or coarsest(inputs[k].dtype, a.dtype), f"{what} d{k}")
