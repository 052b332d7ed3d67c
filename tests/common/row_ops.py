"""What the torch-layer tests of the two row-normalisation ops, l2norm (test_l2norm.py) and
rmsnorm_without_weight (test_rmsnorm.py), share: gradients, bitwise comparison and backend
forcing, the non-contiguous layouts, and the bodies of the tests that are the same up to the op.

Each op file keeps its math (the float64 composite, the oracle), its cases, seeds and tolerances,
and every test function: ``backend_case`` is parametrized by the module's ``OP``
(tests/python/conftest.py), so the tests stay defined there and call the bodies here. A body
takes the op's name and callables that run the op (fused) or its composite, each returning the
op's outputs as the op file chooses to compare them.
"""

from __future__ import annotations

import threading

import fusedops
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.common.tolerance import assert_close, floor_for, max_abs_error, scale_of

BITWISE_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}


def shape_id(shape) -> str:
    return "x".join(map(str, shape))


def grads_of(outputs, x, grad_outputs):
    (g,) = torch.autograd.grad(outputs, x, grad_outputs, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    iv = BITWISE_VIEW[a.dtype]
    return torch.equal(a.detach().contiguous().view(iv), b.detach().contiguous().view(iv))


def forced(op: str, case):
    return fusedops.use_backend(**{op: case.backend})


# ---------------------------------------------------------------------------------------------
# Random shapes, scales and eps on the CPU (hypothesis).


def random_shapes_scales_and_eps():
    """The hypothesis cases of test_random_shapes_scales_and_eps_on_cpu: rows x D inputs of scale
    10**log_scale and an eps from 0 to 1, with a seed for the values; 30 cases, derandomized (the
    same cases on every run)."""
    cases = given(rows=st.integers(1, 6), D=st.integers(2, 300), log_scale=st.floats(-4, 3),
                  eps=st.sampled_from([0.0, 1e-12, 1e-6, 1e-2, 1.0]), seed=st.integers(0, 2**20))
    once = settings(max_examples=30, deadline=None, derandomize=True, database=None)
    return lambda test: once(cases(test))


def check_random_case(rows, D, log_scale, eps, seed, *, shift, fused, composite, differentiated):
    """fused(x, eps) and composite(x, eps) give (y, rstd); the loss uses the first `differentiated`
    of them, with float32 randoms drawn after x from the case's generator. y, rstd and dx in
    float32 against the float64 composite, the composite in float32 the base."""
    scale = 10.0 ** log_scale
    g = torch.Generator().manual_seed(seed)
    x = ((torch.randn(rows, D, generator=g, dtype=torch.float64) + shift) * scale).float().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    xb = x.detach().clone().requires_grad_()
    outs, outs64, outsb = fused(x, eps), composite(x64, eps), composite(xb, eps)
    gs = [torch.randn(o.shape, generator=g).float() for o in outs64[:differentiated]]
    dx = grads_of(list(outs[:differentiated]), x, gs)
    dx64 = grads_of(list(outs64[:differentiated]), x64, [t.double() for t in gs])
    dxb = grads_of(list(outsb[:differentiated]), xb, gs)
    assert_close(outs[0], outsb[0], outs64[0], torch.float32,
                 f"hypothesis y {rows}x{D} scale {scale:.1e} eps {eps}")
    assert_close(outs[1], outsb[1], outs64[1], torch.float32, "hypothesis rstd")
    assert_close(dx, dxb, dx64, torch.float32, "hypothesis dx")


def check_rstd_of_empty_rows(rstd_of, device, eps, shape):
    """rstd_of(x, eps) for x of 4 rows and D == 0 is eps**-0.5 (inf for eps == 0), of `shape`."""
    x = torch.empty(4, 0, device=device)
    r = rstd_of(x, eps)
    assert r.shape == shape
    expected = float("inf") if eps == 0 else eps ** -0.5
    torch.testing.assert_close(r.cpu(), torch.full(shape, expected), rtol=2e-7, atol=0)


# ---------------------------------------------------------------------------------------------
# fusedops.reference against the op file's float64 composite.


def check_reference_matches(reference, composite, shape, dtype, seed):
    """reference(x) and composite(x64) give lists of outputs: each reference output float64 and
    within 1e-12 (relative to max(1, max|want|)) of the composite's; the gradient, for float64
    randoms drawn after x from the same generator, within 1e-12 (float64) or half float32's floor
    (a float32 input gets its gradient rounded to float32)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.3 - 0.4).to(dtype).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    outs, wants = reference(x), composite(x64)
    gs = [torch.randn(w.shape, generator=g, dtype=torch.float64) for w in wants]
    for o, w in zip(outs, wants):
        assert o.dtype == torch.float64 and o.shape == w.shape
        bound = 1e-12 * max(1.0, float(w.detach().abs().max()) if w.numel() else 1.0)
        assert max_abs_error(o, w) <= bound
    dx = grads_of(outs, x, gs)
    dx64 = grads_of(wants, x64, gs)
    assert dx.dtype == dtype
    tol = 1e-12 if dtype == torch.float64 else floor_for(torch.float32) / 2
    assert max_abs_error(dx, dx64) <= tol * scale_of(dx64)


# ---------------------------------------------------------------------------------------------
# Layout: non-contiguous inputs and expanded gradients give the contiguous results.


def _layouts(fresh_normal, dt, dev, seed):
    D = 96
    yield "transposed", fresh_normal((D, 33), dt, dev, seed).t()  # last dim has stride 33
    yield "column_slice", fresh_normal((33, 2 * D), dt, dev, seed)[:, :D]
    yield "column_slice_3d", fresh_normal((4, 3, 2 * D), dt, dev, seed)[..., 1:D + 1]
    yield "permuted_leading", fresh_normal((3, 4, D), dt, dev, seed).transpose(0, 1)
    yield "expanded_rows", fresh_normal((1, D), dt, dev, seed).expand(6, D)


def layout_pairs(fresh_normal, dt, dev, seed):
    """(name, x_nc, x_c) for every layout: x_nc not contiguous (asserted), x_c its contiguous copy;
    both leaves that require grad."""
    for name, x_nc in _layouts(fresh_normal, dt, dev, seed):
        assert not x_nc.is_contiguous(), name
        yield name, x_nc.detach().requires_grad_(), x_nc.detach().contiguous().requires_grad_()


def close_to(a, b, dtype, what):
    # The same numbers up to a rounding flip where a backend takes another (vector) path.
    bound = floor_for(dtype) * max(1.0, float(b.detach().abs().max().cpu()) if b.numel() else 1.0)
    err = max_abs_error(a, b)
    assert err <= bound, f"{what}: non-contiguous differs from contiguous by {err:.3e} (> {bound:.3e})"


def check_expanded_gradient_from_sum_backward(op, case, x, fused, composite64, composite, tol_dtype, tag):
    """fused(x), composite64(x64) and composite(x) give the one output whose sum() is the loss: the
    gradient through sum()'s expanded (stride-0) dy is the one of a contiguous dy of ones, and
    within the tolerance of tol_dtype of the float64 composite's (the base: `composite`)."""
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    with forced(op, case):
        fused(x1).sum().backward()  # the gradient of sum() is an expanded (stride-0) tensor
        o2 = fused(x2)
        o2.backward(torch.ones(o2.shape, dtype=o2.dtype, device=case.device))
    close_to(x1.grad, x2.grad, case.dtype, f"{tag} expanded vs contiguous ones")
    x64 = x.cpu().double().requires_grad_()
    composite64(x64).sum().backward()
    xb = x.clone().requires_grad_()
    composite(xb).sum().backward()
    assert_close(x1.grad, xb.grad, x64.grad, tol_dtype, f"{tag} dx from sum()")


# ---------------------------------------------------------------------------------------------
# Determinism.


def check_repeated_runs_are_bitwise_identical(op, case, x, fused, grads):
    """Two runs of fused(x) -> (y, rstd), the loss on its first len(grads) outputs: y, rstd and dx
    bit for bit the same."""
    runs = []
    for _ in range(2):
        xi = x.clone().requires_grad_()
        with forced(op, case):
            y, rstd = fused(xi)
            runs.append((y, rstd, grads_of([y, rstd][:len(grads)], xi, grads)))
    for name, a, b in zip(("y", "rstd", "dx"), *runs):
        assert bitwise_equal(a, b), f"{case.id}: {name} differs between two identical runs"


# ---------------------------------------------------------------------------------------------
# The backward runs under the forcing of its forward.


def check_backward_runs_on_the_backend_forced_around_it(op, y_of, device, monkeypatch, runnable_backends):
    # FUSEDOPS_BACKEND names a backend that does not exist, so a backward that misses the forcing of
    # the use_backend block around it fails (on CUDA autograd runs the backward on its device
    # thread, which does not see the caller's context variables by itself).
    monkeypatch.setenv("FUSEDOPS_BACKEND", f"{op}=nosuch")
    x = (torch.randn(4, 8, device=device) + 0.3).requires_grad_()
    with fusedops.use_backend(**{op: runnable_backends(op, device)[0]}):
        y = y_of(x)
        y.sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


def check_backward_on_another_thread_keeps_the_forward_forcing(op, y_of, monkeypatch):
    # What CUDA's autograd device thread does, on the CPU: the backward runs on a thread that never
    # entered the use_backend block; it runs under the forcing its forward saw.
    monkeypatch.setenv("FUSEDOPS_BACKEND", f"{op}=nosuch")
    x = (torch.randn(4, 8) + 0.3).requires_grad_()
    with fusedops.use_backend(**{op: "cpu"}):
        y = y_of(x)
    errors = []

    def run_backward():
        try:
            y.sum().backward()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=run_backward)
    t.start()
    t.join()
    assert not errors, f"backward on another thread lost the forcing: {errors[0]!r}"
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
