"""rmsnorm_without_weight (docs/specs/ops.md section 2) through the torch layer.

Every registered backend is forced in turn (``backend_case``) and compared, forward and backward,
with a float64 PyTorch composite written here (the oracle, differentiated by torch.autograd); the
tolerance base is the same composite run in the input dtype (tests/common/tolerance.py).
"""

from __future__ import annotations

import threading

import fusedops
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.common.tolerance import assert_close, floor_for, max_abs_error, scale_of

OP = "rmsnorm_without_weight"
EPS = 1e-6

SHAPES = [(1, 1), (1, 7), (3, 129), (2, 4097), (5, 3, 128), (7,), (1024, 256), (0, 16), (4, 0),
          (3, 0, 8)]
# Which outputs the loss uses: r (return_normalized=False), y only, or y and rstd (True).
MODES = ["r", "y", "both"]
BITWISE_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}


def composite(x: torch.Tensor, eps: float = EPS, return_normalized: bool = False):
    """The plain PyTorch composite, run in x's dtype. The mean over an empty row is 0 (D == 0
    gives rstd = eps**-0.5)."""
    if x.shape[-1] > 0:
        ms = x.square().mean(-1, keepdim=True)
    else:
        ms = x.square().sum(-1, keepdim=True)  # zeros, still connected to x for autograd
    r = torch.rsqrt(ms + eps)
    return (x * r, r) if return_normalized else r


def grads_of(outputs, x, grad_outputs):
    (g,) = torch.autograd.grad(outputs, x, grad_outputs, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    iv = BITWISE_VIEW[a.dtype]
    return torch.equal(a.detach().contiguous().view(iv), b.detach().contiguous().view(iv))


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


# ---------------------------------------------------------------------------------------------
# Forward and backward against the float64 oracle, every backend / dtype / shape / mode.


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", MODES)
def test_forward_and_gradients_match_float64(backend_case, shape, mode, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    seed = seed_of(OP, shape, mode, str(dt))
    x = fresh_normal(shape, dt, dev, seed, mean=0.3, std=1.5).requires_grad_()
    lead = tuple(shape[:-1]) + (1,)
    g_y = fresh_normal(shape, dt, dev, seed + 1)
    # r (mode "r") is in x's dtype; rstd (return_normalized=True) is float32 (float64 for float64 x).
    rstd_dt = torch.float64 if dt == torch.float64 else torch.float32
    g_r = fresh_normal(lead, dt if mode == "r" else rstd_dt, dev, seed + 2, mean=0.2)

    with forced(case):
        out = fusedops.rmsnorm_without_weight(x, EPS, return_normalized=(mode != "r"))
        if mode == "r":
            r, outs, gs = out, [out], [g_r]
        else:
            y, r = out
            outs = {"y": [y], "both": [y, r]}[mode]
            gs = {"y": [g_y], "both": [g_y, g_r]}[mode]
        dx = grads_of(outs, x, gs)

    x64 = x.detach().cpu().double().requires_grad_()
    xb = x.detach().clone().requires_grad_()
    if mode == "r":
        r64 = composite(x64)
        rb = composite(xb)
        assert r.dtype == dt and tuple(r.shape) == lead and r.device.type == dev
        assert_close(r, rb, r64, dt, f"{case.id} {shape} r")
        outs64, outsb = [r64], [rb]
    else:
        y64, r64 = composite(x64, return_normalized=True)
        yb, rb = composite(xb, return_normalized=True)
        assert y.dtype == dt and y.shape == x.shape and y.device.type == dev
        assert r.dtype == rstd_dt and tuple(r.shape) == lead
        assert_close(y, yb, y64, dt, f"{case.id} {shape} y")
        # rstd is computed in its own dtype: its base is the composite in that dtype.
        r32 = composite(x.detach().to(rstd_dt), return_normalized=True)[1]
        assert_close(r, r32, r64, rstd_dt, f"{case.id} {shape} rstd")
        pick = {"y": [0], "both": [0, 1]}[mode]
        outs64, outsb = [(y64, r64)[i] for i in pick], [(yb, rb)[i] for i in pick]

    dx64 = grads_of(outs64, x64, [g.cpu().double() for g in gs])
    dxb = grads_of(outsb, xb, gs)
    assert dx.dtype == dt and dx.shape == x.shape
    assert_close(dx, dxb, dx64, dt, f"{case.id} {shape} {mode} dx")


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(rows=st.integers(1, 6), D=st.integers(2, 300), log_scale=st.floats(-4, 3),
       eps=st.sampled_from([0.0, 1e-12, 1e-6, 1e-2, 1.0]), seed=st.integers(0, 2**20))
def test_random_shapes_scales_and_eps_on_cpu(rows, D, log_scale, eps, seed):
    # Small and large inputs against eps: where eps dominates, and where it is negligible.
    scale = 10.0 ** log_scale
    g = torch.Generator().manual_seed(seed)
    x = ((torch.randn(rows, D, generator=g, dtype=torch.float64) + 0.3) * scale).float().requires_grad_()
    gy = torch.randn(rows, D, generator=g).float()
    gr = torch.randn(rows, 1, generator=g).float()
    y, r = fusedops.rmsnorm_without_weight(x, eps, return_normalized=True)
    dx = grads_of([y, r], x, [gy, gr])
    x64 = x.detach().double().requires_grad_()
    y64, r64 = composite(x64, eps, True)
    dx64 = grads_of([y64, r64], x64, [gy.double(), gr.double()])
    xb = x.detach().clone().requires_grad_()
    yb, rb = composite(xb, eps, True)
    dxb = grads_of([yb, rb], xb, [gy, gr])
    assert_close(y, yb, y64, torch.float32, f"hypothesis y {rows}x{D} scale {scale:.1e} eps {eps}")
    assert_close(r, rb, r64, torch.float32, "hypothesis rstd")
    assert_close(dx, dxb, dx64, torch.float32, "hypothesis dx")


@pytest.mark.parametrize("eps", [1e-6, 1e-2, 0.0])
def test_empty_rows_give_eps_to_the_minus_half(device, eps):
    # D == 0: the mean over an empty row is taken as 0, so r = eps**-0.5 (inf for eps == 0).
    x = torch.empty(4, 0, device=device)
    r = fusedops.rmsnorm_without_weight(x, eps)
    assert r.shape == (4, 1)
    expected = float("inf") if eps == 0 else eps ** -0.5
    torch.testing.assert_close(r.cpu(), torch.full((4, 1), expected), rtol=2e-7, atol=0)


@pytest.mark.parametrize("mode", ["r", "both"])
def test_empty_batch_returns_empty(device, mode):
    x = torch.randn(0, 16, device=device, requires_grad=True)
    out = fusedops.rmsnorm_without_weight(x, return_normalized=(mode != "r"))
    outs = [out] if mode == "r" else list(out)
    assert outs[0].shape == ((0, 1) if mode == "r" else (0, 16))
    sum(o.float().sum() for o in outs).backward()
    assert x.grad.shape == (0, 16)


# ---------------------------------------------------------------------------------------------
# fusedops.reference against the oracle written here.


@pytest.mark.parametrize("shape", [(1, 1), (3, 129), (2, 4097), (5, 3, 128), (7,), (4, 0)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("return_normalized", [False, True])
def test_reference_matches_own_float64_composite(shape, dtype, return_normalized, seed_of):
    g = torch.Generator().manual_seed(seed_of("ref", shape, str(dtype)))
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.3 - 0.4).to(dtype).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    out = fusedops.reference.rmsnorm_without_weight(x, 1e-5, return_normalized)
    want = composite(x64, 1e-5, return_normalized)
    outs = list(out) if return_normalized else [out]
    wants = list(want) if return_normalized else [want]
    gs = [torch.randn(w.shape, generator=g, dtype=torch.float64) for w in wants]
    for o, w in zip(outs, wants):
        assert o.dtype == torch.float64 and o.shape == w.shape
        bound = 1e-12 * max(1.0, float(w.detach().abs().max()) if w.numel() else 1.0)
        assert max_abs_error(o, w) <= bound
    dx = grads_of(outs, x, gs)
    dx64 = grads_of(wants, x64, gs)
    assert dx.dtype == dtype
    # float64 agrees to ~1e-12; a float32 input gets its gradient rounded to float32.
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


def _close_to(a, b, dtype, what):
    # The same numbers up to a rounding flip where a backend takes another (vector) path.
    bound = floor_for(dtype) * max(1.0, float(b.detach().abs().max().cpu()) if b.numel() else 1.0)
    err = max_abs_error(a, b)
    assert err <= bound, f"{what}: non-contiguous differs from contiguous by {err:.3e} (> {bound:.3e})"


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("mode", ["r", "both"])
def test_non_contiguous_inputs_match_contiguous(backend_case, mode, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    rn = mode != "r"
    for name, x_nc in _layouts(fresh_normal, dt, dev, seed_of("layout", mode, str(dt))):
        assert not x_nc.is_contiguous(), name
        x_nc = x_nc.detach().requires_grad_()
        x_c = x_nc.detach().contiguous().requires_grad_()
        results = []
        for x in (x_nc, x_c):
            with forced(case):
                out = fusedops.rmsnorm_without_weight(x, EPS, rn)
                outs = list(out) if rn else [out]
                gs = [fresh_normal(o.shape, o.dtype, dev, k) for k, o in enumerate(outs)]
                results.append(outs + [grads_of(outs, x, gs)])
        for i, (a, b) in enumerate(zip(*results)):
            _close_to(a, b, dt, f"{case.id} {name} output {i}")
        # and the contiguous result is right
        x64 = x_c.detach().cpu().double()
        want = composite(x64, EPS, rn)
        got = results[1][0]
        base = composite(x_c.detach(), EPS, rn)
        assert_close(got, base[0] if rn else base, want[0] if rn else want, dt, f"{case.id} {name}")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("mode", ["r", "y", "rstd"])
def test_expanded_gradient_from_sum_backward(backend_case, mode, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    x = fresh_normal((17, 130), dt, dev, seed_of("expand", mode, str(dt)), mean=0.3, std=1.5)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    with forced(case):
        out1 = fusedops.rmsnorm_without_weight(x1, EPS, mode != "r")
        o1 = out1 if mode == "r" else out1[0 if mode == "y" else 1]
        o1.sum().backward()  # the gradient of sum() is an expanded (stride-0) tensor
        out2 = fusedops.rmsnorm_without_weight(x2, EPS, mode != "r")
        o2 = out2 if mode == "r" else out2[0 if mode == "y" else 1]
        o2.backward(torch.ones(o2.shape, dtype=o2.dtype, device=dev))
    _close_to(x1.grad, x2.grad, dt, f"{case.id} {mode} expanded vs contiguous ones")
    x64 = x.cpu().double().requires_grad_()
    o64 = composite(x64, EPS, mode != "r")
    o64 = o64 if mode == "r" else o64[0 if mode == "y" else 1]
    o64.sum().backward()
    xb = x.clone().requires_grad_()
    ob = composite(xb, EPS, mode != "r")
    ob = ob if mode == "r" else ob[0 if mode == "y" else 1]
    ob.sum().backward()
    assert_close(x1.grad, xb.grad, x64.grad, dt, f"{case.id} {mode} dx from sum()")


# ---------------------------------------------------------------------------------------------
# Determinism.


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("shape", [(1024, 256), (2, 4097)], ids=lambda s: "x".join(map(str, s)))
def test_repeated_runs_are_bitwise_identical(backend_case, shape, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    seed = seed_of("det", shape, str(dt))
    x = fresh_normal(shape, dt, dev, seed, mean=0.3, std=1.5)
    g_y = fresh_normal(shape, dt, dev, seed + 1)
    g_r = fresh_normal(shape[:-1] + (1,), torch.float32, dev, seed + 2)
    runs = []
    for _ in range(2):
        xi = x.clone().requires_grad_()
        with forced(case):
            y, r = fusedops.rmsnorm_without_weight(xi, EPS, True)
            dx = grads_of([y, r], xi, [g_y, g_r])
        runs.append((y, r, dx))
    for name, a, b in zip(("y", "rstd", "dx"), *runs):
        assert bitwise_equal(a, b), f"{case.id}: {name} differs between two identical runs"


# ---------------------------------------------------------------------------------------------
# torch.library: opcheck and torch.compile.


@pytest.mark.parametrize("return_normalized", [False, True])
def test_opcheck_forward(device, return_normalized):
    # opcheck runs the op with and without autograd, under fake tensors and AOT dispatch.
    x = (torch.randn(5, 3, 40, device=device) + 0.3).requires_grad_()
    torch.library.opcheck(torch.ops.fusedops.rmsnorm_without_weight_fwd.default,
                          (x, 1e-5, return_normalized))


@pytest.mark.parametrize("which", ["dy", "drstd", "both"])
def test_opcheck_backward(device, which):
    x = torch.randn(6, 40, device=device) + 0.3
    rstd = torch.rsqrt(x.square().mean(-1) + 1e-6)
    dy = torch.randn(6, 40, device=device) if which != "drstd" else None
    drstd = torch.randn(6, device=device) if which != "dy" else None
    torch.library.opcheck(torch.ops.fusedops.rmsnorm_without_weight_bwd.default, (x, rstd, dy, drstd))


def _loss_fn(x, g_y, g_r):
    y, rstd = fusedops.rmsnorm_without_weight(x, 1e-5, return_normalized=True)
    r = fusedops.rmsnorm_without_weight(x * 2, 1e-5)
    return y, (y * g_y).sum() + (rstd * g_r).sum() + r.sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_compile_fullgraph_matches_eager(device, dtype):
    torch._dynamo.reset()
    x = torch.randn(9, 72, device=device, dtype=dtype) + 0.3
    g_y = torch.randn(9, 72, device=device, dtype=dtype)
    g_r = torch.randn(9, 1, device=device)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, le = _loss_fn(xe, g_y, g_r)
    le.backward()
    compiled = torch.compile(_loss_fn, fullgraph=True, backend="aot_eager")
    yc, lc = compiled(xc, g_y, g_r)
    lc.backward()
    assert bitwise_equal(yc, ye)
    assert bitwise_equal(xc.grad, xe.grad)


def test_torch_compile_inductor_matches_eager(device):
    torch._dynamo.reset()

    def f(x):
        return fusedops.rmsnorm_without_weight(x, 1e-5)

    x = torch.randn(8, 64, device=device) + 0.3
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    re = f(xe)
    re.sum().backward()
    rc = torch.compile(f, fullgraph=True)(xc)
    rc.sum().backward()
    torch.testing.assert_close(rc, re, rtol=2e-7, atol=0)
    torch.testing.assert_close(xc.grad, xe.grad, rtol=2e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Errors reach Python as Python exceptions that say what is wrong.


def test_integer_input_is_a_type_error(device):
    with pytest.raises(TypeError, match="int32"):
        fusedops.rmsnorm_without_weight(torch.ones(4, 8, dtype=torch.int32, device=device))


def test_rank_zero_is_a_value_error(device):
    with pytest.raises(ValueError, match="rank"):
        fusedops.rmsnorm_without_weight(torch.tensor(1.5, device=device))


@pytest.mark.parametrize("eps", [-1e-6, float("nan")])
def test_bad_eps_is_a_value_error(device, eps):
    with pytest.raises(ValueError, match="eps"):
        fusedops.rmsnorm_without_weight(torch.randn(4, 8, device=device), eps)


def test_unknown_forced_backend_is_a_value_error_naming_it(device):
    with fusedops.use_backend(**{OP: "nosuch"}), pytest.raises(ValueError, match="'nosuch'"):
        fusedops.rmsnorm_without_weight(torch.randn(4, 8, device=device))


def test_forced_cpu_backend_refuses_float64():
    with fusedops.use_backend(**{OP: "cpu"}), pytest.raises(RuntimeError, match="does not take float64"):
        fusedops.rmsnorm_without_weight(torch.randn(4, 8, dtype=torch.float64))


def test_forced_backend_of_another_device_says_so(device):
    other = "cuda_sm80" if device == "cpu" else "cpu"
    if other not in {e["backend"] for e in fusedops.backends(OP)}:
        pytest.skip(f"{other} is not registered in this build")
    with fusedops.use_backend(**{OP: other}), pytest.raises(RuntimeError, match="runs on"):
        fusedops.rmsnorm_without_weight(torch.randn(4, 8, device=device))


def test_backward_runs_on_the_backend_forced_around_it(device, monkeypatch, runnable_backends):
    # FUSEDOPS_BACKEND names a backend that does not exist, so a backward that misses the forcing of
    # the use_backend block around it fails (on CUDA autograd runs the backward on its device
    # thread, which does not see the caller's context variables by itself).
    monkeypatch.setenv("FUSEDOPS_BACKEND", f"{OP}=nosuch")
    x = (torch.randn(4, 8, device=device) + 0.3).requires_grad_()
    with fusedops.use_backend(**{OP: runnable_backends(OP, device)[0]}):
        y = fusedops.rmsnorm_without_weight(x, return_normalized=True)[0]
        y.sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


def test_float64_on_cuda_says_no_backend_can_run_it(device):
    if device != "cuda":
        pytest.skip("float64 runs on the CPU (ref backend); this checks the CUDA refusal")
    with pytest.raises(RuntimeError, match="no backend can run"):
        fusedops.rmsnorm_without_weight(torch.randn(4, 8, dtype=torch.float64, device=device))


def test_backward_on_another_thread_keeps_the_forward_forcing(monkeypatch):
    # What CUDA's autograd device thread does, on the CPU: the backward runs on a thread that never
    # entered the use_backend block; it runs under the forcing its forward saw.
    monkeypatch.setenv("FUSEDOPS_BACKEND", f"{OP}=nosuch")
    x = (torch.randn(4, 8) + 0.3).requires_grad_()
    with fusedops.use_backend(**{OP: "cpu"}):
        y = fusedops.rmsnorm_without_weight(x, return_normalized=True)[0]
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
