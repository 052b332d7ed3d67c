"""l2norm (docs/specs/ops.md section 8) through the torch layer, and MindSpeed's launcher forms
``fusedops.ops.l2norm.l2norm_fwd / l2norm_bwd``.

Every registered backend is forced in turn (``backend_case``) and compared, forward and backward,
with a float64 PyTorch composite of y = x * rsqrt(sum(x^2) + eps) written here (the oracle,
differentiated by torch.autograd); the tolerance base is the same composite run in the input dtype
(tests/common/tolerance.py). What this file shares with test_rmsnorm.py is in
tests/common/row_ops.py.
"""

from __future__ import annotations

import functools

import fusedops
import pytest
import torch
from fusedops.ops.l2norm import l2norm_bwd, l2norm_fwd

from tests.common import row_ops
from tests.common.row_ops import bitwise_equal, close_to, grads_of, layout_pairs, shape_id
from tests.common.tolerance import assert_close, coarsest

OP = "l2norm"
EPS = 1e-6

SHAPES = [(1, 1), (1, 7), (3, 129), (2, 4097), (4, 3, 128), (5,), (1024, 256), (0, 16), (4, 0),
          (3, 0, 8)]
OUTPUT_DTYPES = [None, torch.float32, torch.bfloat16]
forced = functools.partial(row_ops.forced, OP)


def composite(x: torch.Tensor, eps: float = EPS, output_dtype=None):
    """The plain PyTorch composite in x's dtype: (y, rstd[..., 1]); y cast to output_dtype."""
    r = torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)
    y = x * r
    return (y if output_dtype is None else y.to(output_dtype)), r


def y_and_rstd(x: torch.Tensor, eps: float = EPS):
    """The composite's (y, rstd) as l2norm_fwd returns them: rstd without its last dimension."""
    y, r = composite(x, eps)
    return y, r.squeeze(-1)


def dname(dt) -> str:
    return "same" if dt is None else str(dt).replace("torch.", "")


# ---------------------------------------------------------------------------------------------
# Forward and backward against the float64 oracle, every backend / dtype / shape / output dtype.


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
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


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
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
                         ids=shape_id)
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


@row_ops.random_shapes_scales_and_eps()
def test_random_shapes_scales_and_eps_on_cpu(rows, D, log_scale, eps, seed):
    # Small and large inputs against eps: where eps dominates, and where it is negligible. The loss
    # uses y.
    row_ops.check_random_case(rows, D, log_scale, eps, seed, shift=0.1, fused=l2norm_fwd,
                              composite=y_and_rstd, differentiated=1)


@pytest.mark.parametrize("eps", [1e-6, 1e-2, 0.0])
def test_empty_rows_give_eps_to_the_minus_half(device, eps):
    # D == 0: the sum over an empty row is 0, so rstd = eps**-0.5 (inf for eps == 0).
    row_ops.check_rstd_of_empty_rows(lambda t, e: l2norm_fwd(t, e)[1], device, eps, (4,))


# ---------------------------------------------------------------------------------------------
# fusedops.reference against the oracle written here.


@pytest.mark.parametrize("shape", [(1, 1), (3, 129), (2, 4097), (4, 3, 128), (5,), (4, 0)], ids=shape_id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_matches_own_float64_composite(shape, dtype, seed_of):
    row_ops.check_reference_matches(lambda t: [fusedops.reference.l2norm(t, 1e-5)],
                                    lambda t64: [composite(t64, 1e-5)[0]], shape, dtype,
                                    seed_of("ref", OP, shape, str(dtype)))


# ---------------------------------------------------------------------------------------------
# Layout: non-contiguous inputs and expanded gradients give the contiguous results.


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_non_contiguous_inputs_match_contiguous(backend_case, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    for name, x_nc, x_c in layout_pairs(fresh_normal, dt, dev, seed_of("layout", OP, str(dt))):
        g = fresh_normal(x_c.shape, dt, dev, 7)
        results = []
        for x in (x_nc, x_c):
            with forced(case):
                y, rstd = l2norm_fwd(x, EPS)
                results.append((y, rstd, grads_of([y], x, [g])))
        for what, a, b in zip(("y", "rstd", "dx"), *results):
            close_to(a, b, dt, f"{case.id} {name} {what}")
        y64 = composite(x_c.detach().cpu().double())[0]
        assert_close(results[1][0], composite(x_c.detach())[0], y64, dt, f"{case.id} {name} y")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("output_dtype", [None, torch.float32], ids=dname)
def test_expanded_gradient_from_sum_backward(backend_case, output_dtype, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    x = fresh_normal((17, 130), dt, dev, seed_of("expand", OP, str(dt)), mean=0.1, std=2.0)
    row_ops.check_expanded_gradient_from_sum_backward(
        OP, case, x, lambda t: fusedops.l2norm(t, EPS, output_dtype), lambda t64: composite(t64)[0],
        lambda t: composite(t, EPS, output_dtype)[0], coarsest(dt, output_dtype or dt), case.id)


# ---------------------------------------------------------------------------------------------
# Determinism.


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("shape", [(1024, 256), (2, 4097)], ids=shape_id)
def test_repeated_runs_are_bitwise_identical(backend_case, shape, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    seed = seed_of("det", OP, shape, str(dt))
    x = fresh_normal(shape, dt, dev, seed, mean=0.1, std=2.0)
    g = fresh_normal(shape, dt, dev, seed + 1)  # the loss uses y
    row_ops.check_repeated_runs_are_bitwise_identical(OP, case, x, lambda t: l2norm_fwd(t, EPS), [g])


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
    row_ops.check_backward_runs_on_the_backend_forced_around_it(OP, fusedops.l2norm, device, monkeypatch,
                                                                runnable_backends)


def test_backward_on_another_thread_keeps_the_forward_forcing(monkeypatch):
    row_ops.check_backward_on_another_thread_keeps_the_forward_forcing(OP, fusedops.l2norm, monkeypatch)
