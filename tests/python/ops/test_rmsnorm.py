"""rmsnorm_without_weight (docs/specs/ops.md section 2) through the torch layer.

Every registered backend is forced in turn (``backend_case``) and compared, forward and backward,
with a float64 PyTorch composite of r = rsqrt(mean(x^2) + eps) and y = x * r written here (the
oracle, differentiated by torch.autograd); the tolerance base is the same composite run in the
input dtype (tests/common/tolerance.py). What this file shares with test_l2norm.py is in
tests/common/row_ops.py.
"""

from __future__ import annotations

import functools

import fusedops
import pytest
import torch

from tests.common import row_ops
from tests.common.row_ops import bitwise_equal, close_to, grads_of, layout_pairs, shape_id
from tests.common.tolerance import assert_close

OP = "rmsnorm_without_weight"
EPS = 1e-6

SHAPES = [(1, 1), (1, 7), (3, 129), (2, 4097), (5, 3, 128), (7,), (1024, 256), (0, 16), (4, 0),
          (3, 0, 8)]
# Which outputs the loss uses: r (return_normalized=False), y only, or y and rstd (True).
MODES = ["r", "y", "both"]
forced = functools.partial(row_ops.forced, OP)


def composite(x: torch.Tensor, eps: float = EPS, return_normalized: bool = False):
    """The plain PyTorch composite, run in x's dtype. The mean over an empty row is 0 (D == 0
    gives rstd = eps**-0.5)."""
    if x.shape[-1] > 0:
        ms = x.square().mean(-1, keepdim=True)
    else:
        ms = x.square().sum(-1, keepdim=True)  # zeros, still connected to x for autograd
    r = torch.rsqrt(ms + eps)
    return (x * r, r) if return_normalized else r


def outputs_of(out, return_normalized: bool) -> list:
    """The op's (or the composite's) outputs as a list: [r], or [y, rstd]."""
    return list(out) if return_normalized else [out]


def picked(out, mode: str):
    """The output the loss of `mode` uses: r ("r"), y ("y") or rstd ("rstd")."""
    return out if mode == "r" else out[0 if mode == "y" else 1]


# ---------------------------------------------------------------------------------------------
# Forward and backward against the float64 oracle, every backend / dtype / shape / mode.


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
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


@row_ops.random_shapes_scales_and_eps()
def test_random_shapes_scales_and_eps_on_cpu(rows, D, log_scale, eps, seed):
    # Small and large inputs against eps: where eps dominates, and where it is negligible. The loss
    # uses y and rstd.
    row_ops.check_random_case(
        rows, D, log_scale, eps, seed, shift=0.3,
        fused=lambda t, e: fusedops.rmsnorm_without_weight(t, e, return_normalized=True),
        composite=lambda t, e: composite(t, e, True), differentiated=2)


@pytest.mark.parametrize("eps", [1e-6, 1e-2, 0.0])
def test_empty_rows_give_eps_to_the_minus_half(device, eps):
    # D == 0: the mean over an empty row is taken as 0, so r = eps**-0.5 (inf for eps == 0).
    row_ops.check_rstd_of_empty_rows(fusedops.rmsnorm_without_weight, device, eps, (4, 1))


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


@pytest.mark.parametrize("shape", [(1, 1), (3, 129), (2, 4097), (5, 3, 128), (7,), (4, 0)], ids=shape_id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("return_normalized", [False, True])
def test_reference_matches_own_float64_composite(shape, dtype, return_normalized, seed_of):
    rn = return_normalized
    row_ops.check_reference_matches(
        lambda t: outputs_of(fusedops.reference.rmsnorm_without_weight(t, 1e-5, rn), rn),
        lambda t64: outputs_of(composite(t64, 1e-5, rn), rn), shape, dtype, seed_of("ref", shape, str(dtype)))


# ---------------------------------------------------------------------------------------------
# Layout: non-contiguous inputs and expanded gradients give the contiguous results.


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("mode", ["r", "both"])
def test_non_contiguous_inputs_match_contiguous(backend_case, mode, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    rn = mode != "r"
    for name, x_nc, x_c in layout_pairs(fresh_normal, dt, dev, seed_of("layout", mode, str(dt))):
        results = []
        for x in (x_nc, x_c):
            with forced(case):
                outs = outputs_of(fusedops.rmsnorm_without_weight(x, EPS, rn), rn)
                gs = [fresh_normal(o.shape, o.dtype, dev, k) for k, o in enumerate(outs)]
                results.append(outs + [grads_of(outs, x, gs)])
        for i, (a, b) in enumerate(zip(*results)):
            close_to(a, b, dt, f"{case.id} {name} output {i}")
        # and the contiguous result is right
        want = outputs_of(composite(x_c.detach().cpu().double(), EPS, rn), rn)[0]
        base = outputs_of(composite(x_c.detach(), EPS, rn), rn)[0]
        assert_close(results[1][0], base, want, dt, f"{case.id} {name}")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("mode", ["r", "y", "rstd"])
def test_expanded_gradient_from_sum_backward(backend_case, mode, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    x = fresh_normal((17, 130), dt, dev, seed_of("expand", mode, str(dt)), mean=0.3, std=1.5)
    rn = mode != "r"

    def composite_of_mode(t):  # in float64 (the oracle) and in x's dtype (the base)
        return picked(composite(t, EPS, rn), mode)

    row_ops.check_expanded_gradient_from_sum_backward(
        OP, case, x, lambda t: picked(fusedops.rmsnorm_without_weight(t, EPS, rn), mode),
        composite_of_mode, composite_of_mode, dt, f"{case.id} {mode}")


# ---------------------------------------------------------------------------------------------
# Determinism.


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("shape", [(1024, 256), (2, 4097)], ids=shape_id)
def test_repeated_runs_are_bitwise_identical(backend_case, shape, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    seed = seed_of("det", shape, str(dt))
    x = fresh_normal(shape, dt, dev, seed, mean=0.3, std=1.5)
    g_y = fresh_normal(shape, dt, dev, seed + 1)
    g_r = fresh_normal(shape[:-1] + (1,), torch.float32, dev, seed + 2)  # the loss uses y and rstd
    row_ops.check_repeated_runs_are_bitwise_identical(
        OP, case, x, lambda t: fusedops.rmsnorm_without_weight(t, EPS, True), [g_y, g_r])


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


def _y_of(x):
    return fusedops.rmsnorm_without_weight(x, return_normalized=True)[0]


def test_backward_runs_on_the_backend_forced_around_it(device, monkeypatch, runnable_backends):
    row_ops.check_backward_runs_on_the_backend_forced_around_it(OP, _y_of, device, monkeypatch,
                                                                runnable_backends)


def test_float64_on_cuda_says_no_backend_can_run_it(device):
    if device != "cuda":
        pytest.skip("float64 runs on the CPU (ref backend); this checks the CUDA refusal")
    with pytest.raises(RuntimeError, match="no backend can run"):
        fusedops.rmsnorm_without_weight(torch.randn(4, 8, dtype=torch.float64, device=device))


def test_backward_on_another_thread_keeps_the_forward_forcing(monkeypatch):
    row_ops.check_backward_on_another_thread_keeps_the_forward_forcing(OP, _y_of, monkeypatch)
