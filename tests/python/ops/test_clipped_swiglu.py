"""clipped_swiglu (docs/specs/ops.md section 7) through the torch layer.

Every registered backend is forced in turn (``backend_case``) and compared, forward and backward,
with a float64 PyTorch composite written here (the GPT-OSS / CANN golden formula, differentiated by
torch.autograd); the tolerance base is the same composite in the input dtype
(tests/common/tolerance.py). Inputs cross +-limit and contain values exactly at +-limit, where
the spec's masks pass the gradient (closed intervals; see clamp_closed).
"""

from __future__ import annotations

import math

import fusedops
import pytest
import torch

from tests.common.bad_input import expect_rejected
from tests.common.tolerance import assert_close, max_abs_error, scale_of

OP = "clipped_swiglu"
LIMIT = 7.0
BITWISE_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}


def clamp_closed(v, lo=None, hi=None):
    """v.clamp(lo, hi) whose gradient passes on the closed interval [lo, hi] (docs/specs/ops.md section 7.4:
    1[A <= limit], 1[-limit <= B <= limit]). The scalar torch.clamp of the torch in use blocks the
    gradient at exactly the bounds, so the composite spells the spec's masks out."""
    inside = torch.ones_like(v, dtype=torch.bool)
    if lo is not None:
        inside &= v >= lo
    if hi is not None:
        inside &= v <= hi
    return torch.where(inside, v, v.detach().clamp(lo, hi))


def composite(x, group_index=None, dim=-1, alpha=1.702, limit=LIMIT, bias=1.0, interleaved=True,
              clamp_mode=0):
    """The plain PyTorch composite (CANN's golden), in x's dtype."""
    d = dim % x.dim()
    M, K = math.prod(x.shape[:d]), math.prod(x.shape[d:])
    x2 = x.reshape(M, K)
    if interleaved:
        A, B = x2[:, 0::2], x2[:, 1::2]
    else:
        A, B = x2[:, : K // 2], x2[:, K // 2:]
    if clamp_mode == 0:
        a = clamp_closed(A, hi=limit)
        y = a * torch.sigmoid(alpha * a) * (clamp_closed(B, -limit, limit) + bias)
    else:
        y = clamp_closed(A * torch.sigmoid(A), hi=limit) * clamp_closed(B, -limit, limit)
    if group_index is not None:
        m = min(max(int(group_index.sum()), 0), M)
        keep = (torch.arange(M, device=x.device) < m).unsqueeze(1)
        y = torch.where(keep, y, torch.zeros_like(y))
    shape = list(x.shape)
    shape[d] //= 2
    return y.reshape(shape)


def make_x(shape, dtype, device, seed):
    """Normals wide enough to cross +-limit, every 5th and 11th value exactly at +-limit."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 4.5 + 0.5
    flat = x.view(-1)
    flat[0::5] = LIMIT
    flat[1::11] = -LIMIT
    flat[3::10] = -LIMIT
    return x.to(dtype).to(device)


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


def bitwise_equal(a, b):
    iv = BITWISE_VIEW[a.dtype]
    return a.shape == b.shape and torch.equal(a.contiguous().view(iv), b.contiguous().view(iv))


def grad_of(y, x, g):
    (dx,) = torch.autograd.grad(y, x, g)
    return dx


# (shape, dim): odd halves (scalar path), vector-width halves, dim != -1, rank 1 and 3, many rows.
GEOMETRIES = [((1, 2), -1), ((3, 130), -1), ((5, 256), -1), ((4, 6, 20), 1), ((10,), 0),
              ((2, 3, 8), 0), ((129, 72), -1), ((48, 1152), -1)]
# (interleaved, clamp_mode, group_index as a function of M)
VARIANTS = [(True, 0, None), (False, 0, None), (True, 1, None), (False, 1, None),
            (True, 0, lambda M: [M // 3, 0, M // 4]), (False, 1, lambda M: [M, 3])]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g[0])) + f"_d{g[1]}")
def test_forward_and_gradient_match_float64(backend_case, geometry, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    shape, dim = geometry
    d = dim % len(shape)
    M = math.prod(shape[:d])
    for interleaved, mode, groups in VARIANTS:
        seed = seed_of(OP, shape, dim, interleaved, mode, str(dt))
        gi = None if groups is None else torch.tensor(groups(M), dtype=torch.int64, device=dev)
        kw = dict(group_index=gi, dim=dim, interleaved=interleaved, clamp_mode=mode)
        name = f"{case.id} {shape} dim {dim} {'il' if interleaved else 'split'} mode {mode} gi {groups is not None}"
        x = make_x(shape, dt, dev, seed).requires_grad_()
        out_shape = list(shape)
        out_shape[d] //= 2
        g = fresh_normal(out_shape, dt, dev, seed + 1)
        with forced(case):
            y = fusedops.clipped_swiglu(x, **kw)
            dx = grad_of(y, x, g)
        assert y.dtype == dt and list(y.shape) == out_shape and y.device.type == dev
        assert dx.dtype == dt and dx.shape == x.shape
        gi64 = None if gi is None else gi.cpu()
        x64 = x.detach().cpu().double().requires_grad_()
        y64 = composite(x64, **{**kw, "group_index": gi64})
        dx64 = grad_of(y64, x64, g.cpu().double())
        xb = x.detach().clone().requires_grad_()
        yb = composite(xb, **kw)
        dxb = grad_of(yb, xb, g)
        assert_close(y, yb, y64, dt, f"{name} y")
        assert_close(dx, dxb, dx64, dt, f"{name} dx")


def test_gradient_at_exactly_the_limit_passes(device):
    # pairs (A, B): A = limit passes, B = +-limit pass, just outside they are blocked.
    x = torch.tensor([[LIMIT, LIMIT, LIMIT, -LIMIT, 8.0, 1.0, 1.0, 8.0, 1.0, -8.0]], device=device,
                     requires_grad=True)
    y = fusedops.clipped_swiglu(x)
    y.sum().backward()
    g = x.grad.cpu()[0]
    x64 = x.detach().cpu().double().requires_grad_()
    composite(x64).sum().backward()
    assert ((g == 0) == (x64.grad[0] == 0)).all(), (g, x64.grad)
    assert g[0] != 0 and g[1] != 0 and g[3] != 0
    assert g[4] == 0 and g[7] == 0 and g[9] == 0
    torch.testing.assert_close(g.double(), x64.grad[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(0, 8), (3, 0), (0,), (2, 0, 4)], ids=lambda s: "x".join(map(str, s)))
def test_empty_inputs(device, shape):
    x = torch.randn(shape, device=device, requires_grad=True)
    y = fusedops.clipped_swiglu(x, dim=-1 if len(shape) < 3 else 1)
    assert y.numel() == 0
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_rows_past_the_group_total_are_zero_and_get_no_gradient(device):
    x = make_x((9, 16), torch.float32, device, 3).requires_grad_()
    gi = torch.tensor([2, 3], dtype=torch.int64, device=device)
    y = fusedops.clipped_swiglu(x, group_index=gi)
    assert torch.all(y[5:] == 0) and torch.all(y[:5] != 0)
    y.sum().backward()
    assert torch.all(x.grad[5:] == 0)


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_non_contiguous_input_matches_contiguous(backend_case, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    base = make_x((40, 33), dt, dev, seed_of("nc", str(dt)))
    x_nc = base.t()  # [33, 40], last dim strided
    x_c = x_nc.contiguous()
    outs = []
    for x in (x_nc, x_c):
        x = x.detach().requires_grad_()
        with forced(case):
            y = fusedops.clipped_swiglu(x, interleaved=False)
            g = torch.ones_like(y)
            outs.append((y, grad_of(y, x, g)))
    assert bitwise_equal(outs[0][0], outs[1][0])
    assert bitwise_equal(outs[0][1], outs[1][1])


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_repeated_runs_are_bitwise_identical(backend_case, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    x = make_x((65, 576), dt, dev, seed_of("det", str(dt)))
    g = fresh_normal((65, 288), dt, dev, 5)
    runs = []
    for _ in range(2):
        xi = x.clone().requires_grad_()
        with forced(case):
            y = fusedops.clipped_swiglu(xi)
            runs.append((y, grad_of(y, xi, g)))
    assert bitwise_equal(runs[0][0], runs[1][0]) and bitwise_equal(runs[0][1], runs[1][1])


def test_grad_function_equals_autograd(device):
    x = make_x((6, 40), torch.float32, device, 11).requires_grad_()
    g = torch.randn(6, 20, device=device)
    kw = dict(dim=-1, alpha=1.5, limit=5.0, bias=0.5, interleaved=False, clamp_mode=0)
    y = fusedops.clipped_swiglu(x, **kw)
    (dx,) = torch.autograd.grad(y, x, g)
    dx2 = fusedops.clipped_swiglu_grad(g, x.detach(), None, **kw)
    assert bitwise_equal(dx, dx2)


@pytest.mark.parametrize("kw", [dict(), dict(interleaved=False, clamp_mode=1, dim=0, alpha=1.0, limit=3.0, bias=0.0)],
                         ids=["default", "split_mode1"])
def test_reference_matches_own_float64_composite(kw, seed_of):
    x = make_x((6, 24), torch.float64, "cpu", seed_of("ref")).requires_grad_()
    gi = torch.tensor([4], dtype=torch.int64)
    y = fusedops.reference.clipped_swiglu(x, group_index=gi, **kw)
    ckw = {k: v for k, v in kw.items()}
    x2 = x.detach().clone().requires_grad_()
    y2 = composite(x2, group_index=gi, **ckw)
    assert y.dtype == torch.float64 and max_abs_error(y, y2) <= 1e-12 * scale_of(y2)
    g = torch.randn(y.shape, dtype=torch.float64)
    (dx,) = torch.autograd.grad(y, x, g)
    (dx2,) = torch.autograd.grad(y2, x2, g)
    assert max_abs_error(dx, dx2) <= 1e-12 * scale_of(dx2)


# ---------------------------------------------------------------------------------------------
# torch.library


@pytest.mark.parametrize("with_groups", [False, True])
def test_opcheck(device, with_groups):
    x = make_x((5, 3, 16), torch.float32, device, 1).requires_grad_()
    gi = torch.tensor([1, 2], dtype=torch.int64, device=device) if with_groups else None
    torch.library.opcheck(torch.ops.fusedops.clipped_swiglu_fwd.default,
                          (x, gi, -1, 1.702, 7.0, 1.0, True, 0))
    dy = torch.randn(5, 3, 8, device=device)
    torch.library.opcheck(torch.ops.fusedops.clipped_swiglu_bwd.default,
                          (dy, x.detach(), gi, -1, 1.702, 7.0, 1.0, False, 1))


def test_torch_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()

    def f(x, gi):
        return fusedops.clipped_swiglu(x, group_index=gi, interleaved=False).square().sum()

    x = make_x((12, 64), torch.bfloat16, device, 2)
    gi = torch.tensor([7, 2], dtype=torch.int64, device=device)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    f(xe, gi).backward()
    torch.compile(f, fullgraph=True, backend="aot_eager")(xc, gi).backward()
    assert bitwise_equal(xc.grad, xe.grad)


# ---------------------------------------------------------------------------------------------
# Errors (docs/specs/ops.md section 7.5)


def test_errors(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match=r"split size\) must be even, got 7"):
        fusedops.clipped_swiglu(torch.randn(4, 7, device=device))
    with pytest.raises(ValueError, match=r"dim must be in \[-2, 2\) for x of rank 2, got 2"):
        fusedops.clipped_swiglu(x, dim=2)
    with pytest.raises(ValueError, match="limit must be a finite number > 0, got 0"):
        fusedops.clipped_swiglu(x, limit=0.0)
    with pytest.raises(ValueError, match="limit must be a finite number > 0, got -1"):
        fusedops.clipped_swiglu(x, limit=-1.0)
    with pytest.raises(ValueError, match="clamp_mode must be 0 or 1, got 2"):
        fusedops.clipped_swiglu(x, clamp_mode=2)
    with pytest.raises(TypeError, match=r"group_index must have dtype in \{int64\}, got int32"):
        fusedops.clipped_swiglu(x, group_index=torch.ones(2, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="group_index must have rank 1, got rank 2"):
        fusedops.clipped_swiglu(x, group_index=torch.ones(2, 2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="group_index must have at most 8192 entries, got 8193"):
        fusedops.clipped_swiglu(x, group_index=torch.zeros(8193, dtype=torch.int64, device=device))
    with pytest.raises(TypeError, match=r"x must have dtype in \{float32, bfloat16, float16, float64\}, got int32"):
        fusedops.clipped_swiglu(torch.ones(4, 8, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="rank >= 1, got rank 0"):
        fusedops.clipped_swiglu(torch.tensor(1.0, device=device))


def test_negative_group_index_raises_on_cpu_and_counts_as_zero_on_cuda(device):
    x = torch.randn(4, 8, device=device)
    neg = torch.tensor([2, -1, 1], dtype=torch.int64, device=device)
    y = expect_rejected(device, lambda: fusedops.clipped_swiglu(x, group_index=neg),
                        "clipped_swiglu: group_index entries must be >= 0, got -1 at index 1",
                        "clipped_swiglu: group_index[1] = -1 is negative (counted as 0)")
    if y is not None:  # rows 0..2 computed (2 + 0 + 1), row 3 zero
        full = fusedops.clipped_swiglu(x)
        assert torch.equal(y[:3], full[:3]) and torch.equal(y[3], torch.zeros_like(y[3]))


def test_float64_on_cuda_says_no_backend_can_run_it(device):
    if device != "cuda":
        pytest.skip("float64 runs on the CPU (ref backend); this checks the CUDA refusal")
    with pytest.raises(RuntimeError, match="no backend can run"):
        fusedops.clipped_swiglu(torch.randn(4, 8, dtype=torch.float64, device=device))
