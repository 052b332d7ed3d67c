"""rmsnorm_gated (docs/specs/ops.md section 5) through the torch layer.

Every registered backend is forced in turn (``backend_case``) and compared, forward and every
gradient (x, z, weight, bias, residual), with a float64 PyTorch composite written here
(differentiated by torch.autograd); the tolerance base is the same composite in the input dtype
(tests/common/tolerance.py). float64 inputs (the ref backend) are checked against the composite
in ``test_reference_matches_own_float64_composite``.
"""

from __future__ import annotations

import fusedops
import pytest
import torch
import torch.nn.functional as F

from tests.common.tolerance import assert_close, coarsest, max_abs_error, scale_of

OP = "rmsnorm_gated"
EPS = 1e-6
BITWISE_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}


def composite(x, z=None, weight=None, bias=None, eps=EPS, group_size=None, norm_before_gate=True,
              activation="silu", residual=None):
    """The plain PyTorch composite (FLA's rms_norm_ref, without the upcast): returns
    (y, x + residual) in the inputs' dtypes."""
    xs = x
    if residual is not None:
        xs = x.to(residual.dtype) + residual
    D = x.shape[-1]
    g = group_size or D
    act = torch.sigmoid if activation == "sigmoid" else F.silu
    v = xs * F.silu(z) if (z is not None and not norm_before_gate) else xs
    vg = v.reshape(*v.shape[:-1], D // g, g)
    h = (vg * torch.rsqrt(vg.square().mean(-1, keepdim=True) + eps)).reshape(v.shape)
    if weight is not None:
        h = h * weight
    if bias is not None:
        h = h + bias
    if z is not None and norm_before_gate:
        h = h * act(z)
    return h.to(x.dtype), xs


# name -> (norm_before_gate, activation, z, weight, bias, residual, fp32 params)
CONFIGS = {
    "after_silu_w": (True, "silu", True, True, False, False, False),
    "after_sigmoid_wb": (True, "sigmoid", True, True, True, False, False),
    "after_swish_res": (True, "swish", True, False, False, True, False),
    "first_silu_wb": (False, "silu", True, True, True, False, False),
    "nogate_w": (True, "silu", False, True, False, False, False),
    "after_f32params_res": (True, "silu", True, True, True, True, True),
}
# (shape, group_size)
GEOMETRIES = [((1, 1), None), ((3, 129), 43), ((5, 3, 128), 32), ((7,), None), ((64, 256), None),
              ((4, 1024), 512)]


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


def bitwise_equal(a, b):
    iv = BITWISE_VIEW[a.dtype]
    return a.shape == b.shape and torch.equal(a.detach().contiguous().view(iv), b.detach().contiguous().view(iv))


def make_inputs(shape, dt, dev, seed, cfg, fresh_normal):
    nbg, act, has_z, has_w, has_b, has_res, f32 = cfg
    D = shape[-1]
    pdt = torch.float32 if f32 else dt
    t = {"x": fresh_normal(shape, dt, dev, seed, mean=0.2, std=1.3)}
    t["z"] = fresh_normal(shape, dt, dev, seed + 1, mean=0.1, std=2.0) if has_z else None
    t["weight"] = fresh_normal((D,), pdt, dev, seed + 2, mean=1.0, std=0.3) if has_w else None
    t["bias"] = fresh_normal((D,), pdt, dev, seed + 3, std=0.5) if has_b else None
    t["residual"] = fresh_normal(shape, pdt, dev, seed + 4, mean=-0.1) if has_res else None
    return t


@pytest.mark.dtypes(torch.float32, torch.bfloat16, torch.float16)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g[0])) + f"_g{g[1]}")
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_forward_and_gradients_match_float64(backend_case, geometry, config, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    shape, gs = geometry
    cfg = CONFIGS[config]
    nbg, act = cfg[0], cfg[1]
    has_res = cfg[5]
    seed = seed_of(OP, shape, gs, config, str(dt))
    inp = make_inputs(shape, dt, dev, seed, cfg, fresh_normal)
    names = [k for k, v in inp.items() if v is not None]
    leaves = {k: inp[k].clone().requires_grad_() for k in names}
    kw = dict(eps=EPS, group_size=gs, norm_before_gate=nbg, activation=act)
    g_y = fresh_normal(shape, dt, dev, seed + 10)
    g_r = fresh_normal(shape, inp["residual"].dtype, dev, seed + 11) if has_res else None

    with forced(case):
        out = fusedops.rms_norm_gated(leaves["x"], leaves.get("z"), leaves.get("weight"), leaves.get("bias"),
                                      residual=leaves.get("residual"), prenorm=has_res, **kw)
        y, r = (out if has_res else (out, None))
        outs, gs_ = ([y, r], [g_y, g_r]) if has_res else ([y], [g_y])
        grads = torch.autograd.grad(outs, [leaves[k] for k in names], gs_)

    def run_composite(tensors):
        yb, rb = composite(tensors["x"], tensors.get("z"), tensors.get("weight"), tensors.get("bias"),
                           residual=tensors.get("residual"), **kw)
        return ([yb, rb], ) if has_res else ([yb], )

    l64 = {k: inp[k].detach().cpu().double().requires_grad_() for k in names}
    (o64,) = run_composite(l64)
    gr64 = torch.autograd.grad(o64, [l64[k] for k in names], [g.cpu().double() for g in gs_])
    lb = {k: inp[k].detach().clone().requires_grad_() for k in names}
    (ob,) = run_composite(lb)
    grb = torch.autograd.grad(ob, [lb[k] for k in names], gs_)

    name = f"{case.id} {shape} g{gs} {config}"
    assert y.dtype == dt and y.shape == inp["x"].shape
    assert_close(y, ob[0], o64[0], dt, f"{name} y")
    if has_res:
        assert r.dtype == inp["residual"].dtype
        assert_close(r, ob[1], o64[1], coarsest(dt, r.dtype), f"{name} residual_out")
    for k, got, base, ref in zip(names, grads, grb, gr64):
        assert got.dtype == inp[k].dtype and got.shape == inp[k].shape, k
        assert_close(got, base, ref, coarsest(dt, inp[k].dtype), f"{name} d{k}")


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("geometry", [((3, 129), 43), ((5, 3, 128), None)], ids=["3x129_g43", "5x3x128"])
def test_reference_matches_own_float64_composite(config, geometry, fresh_normal, seed_of):
    shape, gs = geometry
    cfg = CONFIGS[config]
    nbg, act, _has_res = cfg[0], cfg[1], cfg[5]
    inp = make_inputs(shape, torch.float64, "cpu", seed_of("ref", config, shape), cfg[:6] + (False,), fresh_normal)
    names = [k for k, v in inp.items() if v is not None]
    kw = dict(eps=1e-5, group_size=gs, norm_before_gate=nbg, activation=act)
    a = {k: inp[k].clone().requires_grad_() for k in names}
    b = {k: inp[k].clone().requires_grad_() for k in names}
    with fusedops.use_backend(**{OP: "ref"}):
        y = fusedops.rms_norm_gated(a["x"], a.get("z"), a.get("weight"), a.get("bias"),
                                    residual=a.get("residual"), **kw)
    y2, _ = composite(b["x"], b.get("z"), b.get("weight"), b.get("bias"), residual=b.get("residual"), **kw)
    scale = scale_of(y2)
    assert max_abs_error(y, y2) <= 1e-12 * scale
    g = torch.randn(y.shape, dtype=torch.float64)
    ga = torch.autograd.grad(y, [a[k] for k in names], g)
    gb = torch.autograd.grad(y2, [b[k] for k in names], g)
    for k, u, v in zip(names, ga, gb):
        assert max_abs_error(u, v) <= 1e-11 * scale_of(v), k


def test_reference_module_function(fresh_normal):
    # fusedops.reference.rms_norm_gated is the float64 reference (ref backend), differentiable.
    x = fresh_normal((4, 64), torch.float32, "cpu", 1).requires_grad_()
    z = fresh_normal((4, 64), torch.float32, "cpu", 2)
    w = fresh_normal((64,), torch.float32, "cpu", 3, mean=1.0)
    y = fusedops.reference.rms_norm_gated(x, z, w, group_size=16, norm_before_gate=False)
    assert y.dtype == torch.float64
    y2, _ = composite(x.detach().double(), z.double(), w.double(), group_size=16, norm_before_gate=False)
    assert max_abs_error(y, y2) <= 1e-12 * scale_of(y2)
    y.sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32


def test_prenorm_without_residual_returns_x(device):
    x = torch.randn(3, 16, device=device)
    z = torch.randn(3, 16, device=device)
    y, r = fusedops.rms_norm_gated(x, z, prenorm=True)
    assert r is x
    y2, r2 = fusedops.rms_norm_gated(x.bfloat16(), z.bfloat16(), prenorm=True, residual_in_fp32=True)
    assert r2.dtype == torch.float32 and torch.equal(r2, x.bfloat16().float())


def test_rmsnorm_fn_and_module_defaults(device):
    torch.manual_seed(0)
    x = torch.randn(6, 64, device=device)
    z = torch.randn(6, 64, device=device)
    w = torch.rand(64, device=device) + 0.5
    a = fusedops.rmsnorm_fn(x, w, None, z, group_size=32, norm_before_gate=False)
    b = fusedops.rms_norm_gated(x, z, w, None, eps=1e-6, group_size=32, norm_before_gate=False)
    assert bitwise_equal(a, b)
    m = fusedops.nn.RMSNormGated(64, group_size=32, device=device)
    assert m.eps == 1e-5 and m.norm_before_gate is False and m.bias is None
    assert torch.equal(m.weight.detach(), torch.ones(64, device=device))
    with torch.no_grad():
        m.weight.copy_(w)
    c = m(x, z)
    d = fusedops.rms_norm_gated(x, z, w, None, eps=1e-5, group_size=32, norm_before_gate=False)
    assert bitwise_equal(c, d)
    c.sum().backward()
    assert m.weight.grad is not None and m.weight.grad.shape == (64,)
    m2 = fusedops.nn.RMSNormGated(64, norm_before_gate=True, activation="sigmoid", bias=True, device=device)
    y, res = m2(x, z, residual=torch.randn(6, 64, device=device), prenorm=True)
    assert y.shape == res.shape == x.shape
    with pytest.raises(ValueError, match="activation"):
        fusedops.nn.RMSNormGated(64, activation="gelu")


@pytest.mark.parametrize("shape", [(0, 16), (3, 0, 8), (4, 0)], ids=lambda s: "x".join(map(str, s)))
def test_empty_inputs(device, shape):
    D = shape[-1]
    x = torch.randn(shape, device=device, requires_grad=True)
    z = torch.randn(shape, device=device, requires_grad=True)
    w = torch.randn(D, device=device, requires_grad=True)
    b = torch.randn(D, device=device, requires_grad=True)
    y = fusedops.rms_norm_gated(x, z, w, b)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape and z.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_non_contiguous_inputs_match_contiguous(backend_case, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    seed = seed_of("nc", str(dt))
    xz = fresh_normal((33, 2 * 96), dt, dev, seed)
    layouts = {
        "column_slices": (xz[:, :96], xz[:, 96:]),
        "transposed": (fresh_normal((96, 33), dt, dev, seed + 1).t(), fresh_normal((96, 33), dt, dev, seed + 2).t()),
    }
    w = fresh_normal((96,), dt, dev, seed + 3, mean=1.0)
    for name, (x_nc, z_nc) in layouts.items():
        res = []
        for x, z in ((x_nc, z_nc), (x_nc.contiguous(), z_nc.contiguous())):
            x = x.detach().requires_grad_()
            z = z.detach().requires_grad_()
            wl = w.clone().requires_grad_()
            with forced(case):
                y = fusedops.rms_norm_gated(x, z, wl, group_size=48)
                gr = torch.autograd.grad(y, [x, z, wl], torch.ones_like(y))
            res.append((y, *gr))
        for i, (a, b) in enumerate(zip(*res)):
            assert bitwise_equal(a, b), f"{case.id} {name} output {i}"


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_repeated_backward_is_bitwise_identical(backend_case, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    seed = seed_of("det", str(dt))
    x = fresh_normal((1500, 128), dt, dev, seed)
    z = fresh_normal((1500, 128), dt, dev, seed + 1)
    w = fresh_normal((128,), dt, dev, seed + 2, mean=1.0)
    b = fresh_normal((128,), dt, dev, seed + 3)
    g = fresh_normal((1500, 128), dt, dev, seed + 4)
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (x, z, w, b)]
        with forced(case):
            y = fusedops.rms_norm_gated(*leaves)
            runs.append((y, *torch.autograd.grad(y, leaves, g)))
    for i, (a, b_) in enumerate(zip(*runs)):
        assert bitwise_equal(a, b_), f"{case.id}: output {i} differs between two identical runs"


def test_frozen_weight_gets_no_gradient(device):
    x = torch.randn(5, 32, device=device, requires_grad=True)
    z = torch.randn(5, 32, device=device)
    w = torch.rand(32, device=device) + 0.5
    y = fusedops.rms_norm_gated(x, z, w)
    (dx,) = torch.autograd.grad(y.sum(), [x])
    x2 = x.detach().clone().requires_grad_()
    w2 = w.clone().requires_grad_()
    y2 = fusedops.rms_norm_gated(x2, z, w2)
    y2.sum().backward()
    assert bitwise_equal(dx, x2.grad)


# ---------------------------------------------------------------------------------------------
# torch.library


@pytest.mark.parametrize("variant", ["after", "first", "residual"])
def test_opcheck(device, variant):
    x = torch.randn(4, 3, 32, device=device, requires_grad=True)
    z = torch.randn(4, 3, 32, device=device, requires_grad=True)
    w = torch.randn(32, device=device, requires_grad=True)
    res = torch.randn(4, 3, 32, device=device, requires_grad=True) if variant == "residual" else None
    nbg = variant != "first"
    torch.library.opcheck(torch.ops.fusedops.rmsnorm_gated_fwd.default, (x, z, w, None, res, 1e-6, 16, nbg, 0))
    y, r_out, rstd = torch.ops.fusedops.rmsnorm_gated_fwd(x.detach(), z.detach(), w.detach(), None,
                                                          None if res is None else res.detach(), 1e-6, 16, nbg, 0)
    saved = r_out if res is not None else x.detach()
    dres = torch.randn(4, 3, 32, device=device) if res is not None else None
    torch.library.opcheck(torch.ops.fusedops.rmsnorm_gated_bwd.default,
                          (torch.randn_like(y), saved, z.detach(), w.detach(), None, rstd, dres, 16, nbg, 0,
                           False, True, False))


def test_torch_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()

    def f(x, z, w, b):
        return fusedops.rms_norm_gated(x, z, w, b, group_size=32).float().square().sum()

    x = torch.randn(8, 64, device=device, dtype=torch.bfloat16)
    z = torch.randn(8, 64, device=device, dtype=torch.bfloat16)
    w = torch.rand(64, device=device) + 0.5
    b = torch.randn(64, device=device)
    le = [t.clone().requires_grad_() for t in (x, z, w, b)]
    lc = [t.clone().requires_grad_() for t in (x, z, w, b)]
    f(*le).backward()
    torch.compile(f, fullgraph=True, backend="aot_eager")(*lc).backward()
    for a, c in zip(le, lc):
        assert bitwise_equal(a.grad, c.grad)


# ---------------------------------------------------------------------------------------------
# Errors (docs/specs/ops.md section 5.5)


def test_errors(device):
    x = torch.randn(4, 8, device=device)
    z = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match=r"z must have shape \[4,8\] \(same as x\), got \[4,7\]"):
        fusedops.rms_norm_gated(x, torch.randn(4, 7, device=device))
    with pytest.raises(ValueError, match=r"weight must have shape \[8\] \(\[D\]\), got \[7\]"):
        fusedops.rms_norm_gated(x, z, torch.randn(7, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape \[8\] \(\[D\]\), got \[9\]"):
        fusedops.rms_norm_gated(x, z, None, torch.randn(9, device=device))
    with pytest.raises(ValueError, match="group_size must divide D: D = 8, group_size = 3"):
        fusedops.rms_norm_gated(x, z, group_size=3)
    with pytest.raises(ValueError, match="activation must be one of 'silu', 'swish', 'sigmoid', got 'relu'"):
        fusedops.rms_norm_gated(x, z, activation="relu")
    with pytest.raises(ValueError, match="activation 'sigmoid' needs norm_before_gate=True"):
        fusedops.rms_norm_gated(x, z, norm_before_gate=False, activation="sigmoid")
    with pytest.raises(ValueError, match="residual, prenorm and residual_in_fp32 need norm_before_gate=True"):
        fusedops.rms_norm_gated(x, z, norm_before_gate=False, residual=torch.randn(4, 8, device=device))
    with pytest.raises(TypeError, match=r"z must have the dtype of x \(float32\), got bfloat16"):
        fusedops.rms_norm_gated(x, z.bfloat16())
    with pytest.raises(ValueError, match="weight must have the dtype of x"):
        fusedops.rms_norm_gated(x.bfloat16(), z.bfloat16(), torch.randn(8, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match="rank >= 1, got rank 0"):
        fusedops.rms_norm_gated(torch.tensor(1.0, device=device))
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        fusedops.rms_norm_gated(x, z, eps=-1.0)
