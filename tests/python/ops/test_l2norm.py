"""l2norm (docs/specs/ops.md section 8) through the torch layer, and MindSpeed's launcher forms
``fusedops.ops.l2norm.l2norm_fwd / l2norm_bwd``.

Every registered backend is forced in turn (``backend_case``) and compared, forward and backward,
with a float64 PyTorch composite written here (the oracle, differentiated by torch.autograd); the
tolerance base is the same composite run in the input dtype (tests/common/tolerance.py).
"""

from __future__ import annotations

import threading

import fusedops
import pytest
import torch
from fusedops.ops.l2norm import l2norm_bwd, l2norm_fwd
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.common.tolerance import assert_close, coarsest, floor_for, max_abs_error, scale_of

OP = "l2norm"
EPS = 1e-6

SHAPES = [(1, 1), (1, 7), (3, 129), (2, 4097), (4, 3, 128), (5,), (1024, 256), (0, 16), (4, 0),
          (3, 0, 8)]
OUTPUT_DTYPES = [None, torch.float32, torch.bfloat16]
BITWISE_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}

def composite(x: torch.Tensor, eps: float = EPS, output_dtype=None):
    """The plain PyTorch composite in x's dtype: (y, rstd[..., 1]); y cast to output_dtype."""
    r = torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)
    y = x * r
    return (y if output_dtype is None else y.to(output_dtype)), r


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


def dname(dt) -> str:
    return "same" if dt is None else str(dt).replace("torch.", "")


# ---------------------------------------------------------------------------------------------
# Forward and backward against the float64 oracle, every backend / dtype / shape / output dtype.


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("output_dtype", OUTPUT_DTYPES, ids=dname)
def test_forward_matches_float64(backend_case, shape, output_dtype, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    x = fresh_normal(shape, dt, dev, seed_of(OP, "fwd", shape, str(dt), dname(output_dtype)),
                     mean=0.1, std=2.0)
    with forced(case):
        y, rstd = l2norm_fwd(x, EPS, output_dtype)
        y_api = fusedops.l2norm(x, EPS, output_dtype)
    out_dt = output_dtype or dt
    assert y.dtype == out_dt and y.shape == x.shape and y.device.type == dev
    rstd_dt = torch.float64 if dt == torch.float64 else torch.float32  # float64 x keeps float64 rstd
    assert rstd.dtype == rstd_dt and tuple(rstd.shape) == tuple(shape[:-1])
    assert bitwise_equal(y_api, y), "fusedops.l2norm and l2norm_fwd disagree"

    y64, r64 = composite(x.cpu().double())
    yb, _ = composite(x, EPS, output_dtype)
    assert_close(y, yb, y64, coarsest(dt, out_dt), f"{case.id} {shape} ->{dname(output_dtype)} y")
    # rstd is computed in its own dtype: its base is the composite in that dtype.
    r32 = composite(x.to(rstd_dt))[1].squeeze(-1)
    assert_close(rstd, r32, r64.squeeze(-1), rstd_dt, f"{case.id} {shape} rstd")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("output_dtype", OUTPUT_DTYPES, ids=dname)
def test_gradient_matches_float64(backend_case, shape, output_dtype, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    seed = seed_of(OP, "bwd", shape, str(dt), dname(output_dtype))
    x = fresh_normal(shape, dt, dev, seed, mean=0.1, std=2.0).requires_grad_()
    out_dt = output_dtype or dt
    g = fresh_normal(shape, out_dt, dev, seed + 1)
    with forced(case):
        y = fusedops.l2norm(x, EPS, output_dtype)
        dx = grads_of([y], x, [g])
    x64 = x.detach().cpu().double().requires_grad_()
    dx64 = grads_of([composite(x64)[0]], x64, [g.cpu().double()])
    xb = x.detach().clone().requires_grad_()
    dxb = grads_of([composite(xb, EPS, output_dtype)[0]], xb, [g])
    assert dx.dtype == dt and dx.shape == x.shape
    assert_close(dx, dxb, dx64, coarsest(dt, out_dt), f"{case.id} {shape} ->{dname(output_dtype)} dx")


@pytest.mark.parametrize("shape", [(1, 1), (3, 129), (2, 4097), (4, 3, 128), (0, 16)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("y_dtype", ["x", "float32"])
def test_launcher_backward_matches_float64(backend_case, shape, y_dtype, fresh_normal, seed_of):
    # l2norm_bwd(y, rstd, dy, eps, x_dtype): dx = rstd * (dy - y * sum(dy * y)) from the stored y.
    case = backend_case
    dt, dev = case.dtype, case.device
    y_dt = dt if y_dtype == "x" else torch.float32
    seed = seed_of(OP, "launcher", shape, str(dt), y_dtype)
    x64 = fresh_normal(shape, torch.float64, "cpu", seed, mean=0.0, std=1.7)
    y64, r64 = composite(x64)
    r64 = r64.squeeze(-1)
    y = y64.to(y_dt).to(dev)  # the saved output, rounded to its dtype
    rstd = r64.to(torch.float64 if dt == torch.float64 else torch.float32).to(dev)
    dy = fresh_normal(shape, y_dt, dev, seed + 1)
    with forced(case):
        dx = l2norm_bwd(y, rstd, dy, EPS, x_dtype=dt)
    assert dx.dtype == dt and dx.shape == y.shape
    dy64 = dy.cpu().double()
    ref = r64.unsqueeze(-1) * (dy64 - y64 * (dy64 * y64).sum(-1, keepdim=True))
    tol_dt = coarsest(dt, y_dt)
    ys, dys, rs = y.to(tol_dt), dy.to(tol_dt), rstd.to(tol_dt).unsqueeze(-1)
    base = rs * (dys - ys * (dys * ys).sum(-1, keepdim=True))
    assert_close(dx, base, ref, tol_dt, f"{case.id} {shape} y {y_dt} launcher dx")


def test_launcher_defaults(fresh_normal):
    x = fresh_normal((6, 40), torch.float32, "cpu", 3, mean=0.2)
    y, rstd = l2norm_fwd(x)  # eps=1e-6, output dtype of x
    dy = fresh_normal((6, 40), torch.float32, "cpu", 4)
    dx = l2norm_bwd(y, rstd, dy)  # x_dtype defaults to y's dtype; eps is accepted and unused
    assert dx.dtype == torch.float32
    assert bitwise_equal(dx, l2norm_bwd(y, rstd, dy, eps=0.5))
    x64 = x.double().requires_grad_()
    want = grads_of([composite(x64)[0]], x64, [dy.double()])
    xb = x.clone().requires_grad_()
    base = grads_of([composite(xb)[0]], xb, [dy])
    assert_close(dx, base, want, torch.float32, "launcher defaults dx")


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(rows=st.integers(1, 6), D=st.integers(2, 300), log_scale=st.floats(-4, 3),
       eps=st.sampled_from([0.0, 1e-12, 1e-6, 1e-2, 1.0]), seed=st.integers(0, 2**20))
def test_random_shapes_scales_and_eps_on_cpu(rows, D, log_scale, eps, seed):
    # Small and large inputs against eps: where eps dominates, and where it is negligible.
    scale = 10.0 ** log_scale
    g = torch.Generator().manual_seed(seed)
    x = ((torch.randn(rows, D, generator=g, dtype=torch.float64) + 0.1) * scale).float().requires_grad_()
    gy = torch.randn(rows, D, generator=g).float()
    y, rstd = l2norm_fwd(x, eps)
    dx = grads_of([y], x, [gy])
    x64 = x.detach().double().requires_grad_()
    y64, r64 = composite(x64, eps)
    dx64 = grads_of([y64], x64, [gy.double()])
    xb = x.detach().clone().requires_grad_()
    yb, rb = composite(xb, eps)
    dxb = grads_of([yb], xb, [gy])
    assert_close(y, yb, y64, torch.float32, f"hypothesis y {rows}x{D} scale {scale:.1e} eps {eps}")
    assert_close(rstd, rb.squeeze(-1), r64.squeeze(-1), torch.float32, "hypothesis rstd")
    assert_close(dx, dxb, dx64, torch.float32, "hypothesis dx")


@pytest.mark.parametrize("eps", [1e-6, 1e-2, 0.0])
def test_empty_rows_give_eps_to_the_minus_half(device, eps):
    # D == 0: the sum over an empty row is 0, so rstd = eps**-0.5 (inf for eps == 0).
    x = torch.empty(4, 0, device=device)
    _, rstd = l2norm_fwd(x, eps)
    expected = float("inf") if eps == 0 else eps ** -0.5
    torch.testing.assert_close(rstd.cpu(), torch.full((4,), expected), rtol=2e-7, atol=0)


# ---------------------------------------------------------------------------------------------
# fusedops.reference against the oracle written here.


@pytest.mark.parametrize("shape", [(1, 1), (3, 129), (2, 4097), (4, 3, 128), (5,), (4, 0)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_matches_own_float64_composite(shape, dtype, seed_of):
    g = torch.Generator().manual_seed(seed_of("ref", OP, shape, str(dtype)))
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.3 - 0.4).to(dtype).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y = fusedops.reference.l2norm(x, 1e-5)
    want = composite(x64, 1e-5)[0]
    assert y.dtype == torch.float64 and y.shape == want.shape
    bound = 1e-12 * max(1.0, float(want.detach().abs().max()) if want.numel() else 1.0)
    assert max_abs_error(y, want) <= bound
    gy = torch.randn(shape, generator=g, dtype=torch.float64)
    dx, dx64 = grads_of([y], x, [gy]), grads_of([want], x64, [gy])
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


def _close_to(a, b, dtype, what):
    # The same numbers up to a rounding flip where a backend takes another (vector) path.
    bound = floor_for(dtype) * max(1.0, float(b.detach().abs().max().cpu()) if b.numel() else 1.0)
    err = max_abs_error(a, b)
    assert err <= bound, f"{what}: non-contiguous differs from contiguous by {err:.3e} (> {bound:.3e})"


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_non_contiguous_inputs_match_contiguous(backend_case, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    for name, x_nc in _layouts(fresh_normal, dt, dev, seed_of("layout", OP, str(dt))):
        assert not x_nc.is_contiguous(), name
        x_nc = x_nc.detach().requires_grad_()
        x_c = x_nc.detach().contiguous().requires_grad_()
        g = fresh_normal(x_c.shape, dt, dev, 7)
        results = []
        for x in (x_nc, x_c):
            with forced(case):
                y, rstd = l2norm_fwd(x, EPS)
                results.append((y, rstd, grads_of([y], x, [g])))
        for what, a, b in zip(("y", "rstd", "dx"), *results):
            _close_to(a, b, dt, f"{case.id} {name} {what}")
        y64 = composite(x_c.detach().cpu().double())[0]
        assert_close(results[1][0], composite(x_c.detach())[0], y64, dt, f"{case.id} {name} y")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("output_dtype", [None, torch.float32], ids=dname)
def test_expanded_gradient_from_sum_backward(backend_case, output_dtype, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    x = fresh_normal((17, 130), dt, dev, seed_of("expand", OP, str(dt)), mean=0.1, std=2.0)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    with forced(case):
        fusedops.l2norm(x1, EPS, output_dtype).sum().backward()  # an expanded (stride-0) dy
        y2 = fusedops.l2norm(x2, EPS, output_dtype)
        y2.backward(torch.ones(y2.shape, dtype=y2.dtype, device=dev))
    _close_to(x1.grad, x2.grad, dt, f"{case.id} expanded vs contiguous ones")
    x64 = x.cpu().double().requires_grad_()
    composite(x64)[0].sum().backward()
    xb = x.clone().requires_grad_()
    composite(xb, EPS, output_dtype)[0].sum().backward()
    assert_close(x1.grad, xb.grad, x64.grad, coarsest(dt, output_dtype or dt), f"{case.id} dx from sum()")


# ---------------------------------------------------------------------------------------------
# Determinism.


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("shape", [(1024, 256), (2, 4097)], ids=lambda s: "x".join(map(str, s)))
def test_repeated_runs_are_bitwise_identical(backend_case, shape, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    seed = seed_of("det", OP, shape, str(dt))
    x = fresh_normal(shape, dt, dev, seed, mean=0.1, std=2.0)
    g = fresh_normal(shape, dt, dev, seed + 1)
    runs = []
    for _ in range(2):
        xi = x.clone().requires_grad_()
        with forced(case):
            y, rstd = l2norm_fwd(xi, EPS)
            runs.append((y, rstd, grads_of([y], xi, [g])))
    for name, a, b in zip(("y", "rstd", "dx"), *runs):
        assert bitwise_equal(a, b), f"{case.id}: {name} differs between two identical runs"


# ---------------------------------------------------------------------------------------------
# torch.library: opcheck and torch.compile.


@pytest.mark.parametrize("output_dtype", [None, torch.bfloat16], ids=dname)
def test_opcheck_forward(device, output_dtype):
    x = (torch.randn(5, 3, 40, device=device) + 0.1).requires_grad_()
    torch.library.opcheck(torch.ops.fusedops.l2norm_fwd.default, (x, 1e-5, output_dtype))


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=dname)
def test_opcheck_backward(device, x_dtype):
    x = torch.randn(6, 40, device=device) + 0.1
    rstd = torch.rsqrt(x.square().sum(-1) + 1e-6)
    y = x * rstd.unsqueeze(-1)
    dy = torch.randn(6, 40, device=device)
    torch.library.opcheck(torch.ops.fusedops.l2norm_bwd.default, (y, rstd, dy, x_dtype))


def _loss_fn(x, g):
    y = fusedops.l2norm(x, 1e-5)
    yb, rstd = l2norm_fwd(x * 0.5, 1e-5, torch.bfloat16)
    return y, (y * g).sum() + yb.float().sum() + rstd.sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dname)
def test_torch_compile_fullgraph_matches_eager(device, dtype):
    torch._dynamo.reset()
    x = torch.randn(9, 72, device=device, dtype=dtype) + 0.1
    g = torch.randn(9, 72, device=device, dtype=dtype)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, le = _loss_fn(xe, g)
    le.backward()
    yc, lc = torch.compile(_loss_fn, fullgraph=True, backend="aot_eager")(xc, g)
    lc.backward()
    assert bitwise_equal(yc, ye)
    assert bitwise_equal(xc.grad, xe.grad)


# ---------------------------------------------------------------------------------------------
# Errors reach Python as Python exceptions that say what is wrong.


def test_integer_input_is_a_type_error(device):
    with pytest.raises(TypeError, match="int64"):
        fusedops.l2norm(torch.ones(4, 8, dtype=torch.int64, device=device))


def test_rank_zero_is_a_value_error(device):
    with pytest.raises(ValueError, match="rank"):
        fusedops.l2norm(torch.tensor(1.5, device=device))
    with pytest.raises(ValueError, match="rank"):
        l2norm_fwd(torch.tensor(1.5, device=device))


@pytest.mark.parametrize("eps", [-1e-6, float("nan")])
def test_bad_eps_is_a_value_error(device, eps):
    with pytest.raises(ValueError, match="eps"):
        fusedops.l2norm(torch.randn(4, 8, device=device), eps)


def test_unknown_forced_backend_is_a_value_error_naming_it(device):
    with fusedops.use_backend(**{OP: "nosuch"}), pytest.raises(ValueError, match="'nosuch'"):
        fusedops.l2norm(torch.randn(4, 8, device=device))


def test_forced_cpu_backend_refuses_float64():
    with fusedops.use_backend(**{OP: "cpu"}), pytest.raises(RuntimeError, match="does not take float64"):
        fusedops.l2norm(torch.randn(4, 8, dtype=torch.float64))


def test_backward_dy_of_another_shape_is_a_value_error(device):
    y, rstd = l2norm_fwd(torch.randn(4, 8, device=device) + 0.1)
    with pytest.raises(ValueError, match="dy must have shape"):
        l2norm_bwd(y, rstd, torch.randn(4, 7, device=device))


def test_backward_runs_on_the_backend_forced_around_it(device, monkeypatch, runnable_backends):
    # FUSEDOPS_BACKEND names a backend that does not exist, so a backward that misses the forcing of
    # the use_backend block around it fails (on CUDA autograd runs the backward on its device
    # thread, which does not see the caller's context variables by itself).
    monkeypatch.setenv("FUSEDOPS_BACKEND", f"{OP}=nosuch")
    x = (torch.randn(4, 8, device=device) + 0.3).requires_grad_()
    with fusedops.use_backend(**{OP: runnable_backends(OP, device)[0]}):
        y = fusedops.l2norm(x)
        y.sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


def test_backward_on_another_thread_keeps_the_forward_forcing(monkeypatch):
    # What CUDA's autograd device thread does, on the CPU: the backward runs on a thread that never
    # entered the use_backend block; it runs under the forcing its forward saw.
    monkeypatch.setenv("FUSEDOPS_BACKEND", f"{OP}=nosuch")
    x = (torch.randn(4, 8) + 0.3).requires_grad_()
    with fusedops.use_backend(**{OP: "cpu"}):
        y = fusedops.l2norm(x)
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
