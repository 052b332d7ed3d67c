"""causal_conv1d (docs/specs/ops.md section 4) through the torch layer.

Every registered backend is forced in turn (``backend_case``) and compared, forward and every
gradient (x, weight, bias, residual, initial_state, and the gradient flowing in through
final_state), with a float64 PyTorch composite written here on ``F.conv1d`` (the oracle,
differentiated by torch.autograd); the tolerance base is the same composite run in the input
dtype (tests/common/tolerance.py).
"""

from __future__ import annotations

import fusedops
import pytest
import torch
import torch.nn.functional as F

from tests.common.bad_input import expect_rejected
from tests.common.tolerance import assert_close, max_abs_error, scale_of

OP = "causal_conv1d"
BITWISE_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}


def composite(x, weight, bias=None, residual=None, initial_state=None, output_final_state=False,
              activation=None, *, cu_seqlens=None):
    """The plain PyTorch composite: per sequence, the initial state's tokens (or zeros) before x,
    a depthwise F.conv1d, silu, + residual; final_state = the last W tokens of that extension."""
    B, T = x.shape[0], x.shape[1]
    W, D = weight.shape
    xs = x.reshape(B, T, D)
    res = None if residual is None else residual.reshape(B, T, D)
    spans = ([(b, 0, T) for b in range(B)] if cu_seqlens is None else
             [(0, int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)])
    ys, finals = [], []
    for n, (b, s, e) in enumerate(spans):
        seq = xs[b, s:e]  # [L, D]
        head = (initial_state[n].transpose(0, 1) if initial_state is not None
                else x.new_zeros(W, D))  # [W, D]: slot j = token j-W
        ext = torch.cat([head, seq], 0)  # [W+L, D]
        if e > s:
            a = F.conv1d(ext[1:].t().unsqueeze(0), weight.t().unsqueeze(1), bias, groups=D)[0].t()
        else:
            a = seq  # an empty sequence has no outputs
        y = F.silu(a) if activation in ("silu", "swish") else a
        if res is not None:
            y = y + res[b, s:e]
        ys.append(y)
        finals.append(ext[-W:].t())
    if cu_seqlens is None:
        y = torch.stack(ys, 0) if ys else x.new_zeros(0, T, D)
    else:
        y = torch.cat(ys, 0).unsqueeze(0) if ys else x.new_zeros(1, 0, D)
    y = y.reshape(x.shape)
    final = torch.stack(finals, 0) if finals else x.new_zeros(0, D, W)
    return y, (final if output_final_state else None)


def bitwise_equal(a, b) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    iv = BITWISE_VIEW[a.dtype]
    return torch.equal(a.detach().contiguous().view(iv), b.detach().contiguous().view(iv))


# name, x shape, W, cu_seqlens, bias, residual, initial_state, output_final_state, activation
CONFIGS = [
    ("basic", (2, 37, 67), 4, None, True, True, True, True, "silu"),
    ("plain", (2, 19, 32), 4, None, False, False, False, False, None),
    ("L1", (3, 1, 24), 4, None, True, False, True, True, "swish"),
    ("L_lt_W", (2, 2, 13), 4, None, True, True, True, True, "silu"),
    ("W1", (2, 9, 16), 1, None, True, False, True, True, "silu"),
    ("W2", (1, 33, 40), 2, None, False, True, True, True, "silu"),
    ("W3", (2, 21, 9), 3, None, True, False, True, True, None),
    ("W6", (2, 17, 24), 6, None, True, False, True, True, "silu"),
    ("long", (2, 300, 40), 4, None, True, False, True, True, "silu"),
    ("rank4", (2, 11, 3, 8), 3, None, True, True, True, True, "silu"),
    ("varlen", (1, 40, 24), 4, [0, 0, 1, 5, 5, 9, 40], True, True, True, True, "silu"),
    ("varlen_plain", (1, 30, 16), 3, [0, 3, 29, 30], False, False, False, False, None),
]


def _cfg_id(c):
    return c[0]


def _inputs(cfg, dtype, device, seed, fresh_normal):
    name, shape, W, cu, has_b, has_r, has_h, out_final, act = cfg
    D = 1
    for s in shape[2:]:
        D *= s
    N = shape[0] if cu is None else len(cu) - 1
    x = fresh_normal(shape, dtype, device, seed, mean=0.3)
    w = fresh_normal((W, D), dtype, device, seed + 1, std=0.6)
    b = fresh_normal((D,), dtype, device, seed + 2, mean=0.1, std=0.5) if has_b else None
    r = fresh_normal(shape, dtype, device, seed + 3) if has_r else None
    h = fresh_normal((N, D, W), dtype, device, seed + 4, mean=-0.2) if has_h else None
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)
    return x, w, b, r, h, cu_t, act, out_final


def _leaves(tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def _run(fn, x, w, b, r, h, cu, act, out_final, gy, gf):
    y, final = fn(x, w, b, r, h, out_final, act, cu_seqlens=cu)
    loss = (y.double() * gy.double()).sum()
    if out_final:
        loss = loss + (final.double() * gf.double()).sum()
    wrt = [t for t in (x, w, b, r, h) if t is not None]
    grads = torch.autograd.grad(loss, wrt)
    return y, final, grads


@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_forward_and_gradients_match_float64(backend_case, cfg, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    seed = seed_of(OP, cfg[0], str(dt))
    x, w, b, r, h, cu, act, out_final = _inputs(cfg, dt, dev, seed, fresh_normal)
    gy = fresh_normal(x.shape, dt, dev, seed + 10)
    N = x.shape[0] if cu is None else cu.numel() - 1
    gf = fresh_normal((N, w.shape[1], w.shape[0]), dt, dev, seed + 11)

    ours_in = _leaves([x, w, b, r, h])
    with fusedops.use_backend(**{OP: case.backend}):
        y, final, grads = _run(fusedops.causal_conv1d, *ours_in, cu, act, out_final, gy, gf)
    ref_in = _leaves([None if t is None else t.cpu().double() for t in (x, w, b, r, h)])
    cu_cpu = None if cu is None else cu.cpu()
    y64, f64, g64 = _run(composite, *ref_in, cu_cpu, act, out_final, gy.cpu(), gf.cpu())
    base_in = _leaves([x, w, b, r, h])
    yb, fb, gb = _run(composite, *base_in, cu, act, out_final, gy, gf)

    assert y.dtype == dt and y.shape == x.shape and y.device.type == dev
    assert_close(y, yb, y64, dt, f"{case.id} {cfg[0]} y")
    if out_final:
        assert final.dtype == dt and final.shape == f64.shape
        assert torch.equal(final.cpu().double(), f64.detach()), "final_state is a copy of inputs"
    else:
        assert final is None
    names = [n for n, t in zip(("dx", "dweight", "dbias", "dresidual", "dinitial"), (x, w, b, r, h))
             if t is not None]
    for name, g, gref, gbase in zip(names, grads, g64, gb):
        assert_close(g, gbase, gref, dt, f"{case.id} {cfg[0]} {name}")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_silu_at_extreme_preactivations(backend_case):
    # Pre-activations from -1e4 to 1e4, through the exp clamps (|a| > 87) and around 0: y = silu(x)
    # with the last tap 1 and the others 0. The CPU's SiLU takes e = exp(-|a|) and
    # (a >= 0 ? a : a e) / (1 + e), so that no lane forms a subnormal (Intel's slow divisions).
    case = backend_case
    dt, dev = case.dtype, case.device
    vals = torch.tensor([-1e4, -300.0, -104.0, -90.0, -88.5, -87.0, -80.0, -20.0, -1.0, -1e-3, -1e-30,
                         0.0, 1e-30, 1e-3, 1.0, 20.0, 80.0, 88.5, 90.0, 300.0, 1e4], dtype=torch.float64)
    D = 48  # several vector widths and a tail
    x = vals.repeat(D * 3 // vals.numel() + 1)[: D * 3].reshape(1, 3, D)
    x = torch.cat([x, x.flip(1)], 1).to(dt)  # [1, 6, D]
    w = torch.zeros(4, D, dtype=torch.float64)
    w[-1] = 1.0
    w = w.to(dt)
    gy = torch.linspace(-2.0, 2.0, x.numel(), dtype=torch.float64).reshape(x.shape).to(dt)
    none = [None, None, None, None]  # bias, residual, initial_state, cu_seqlens
    with fusedops.use_backend(**{OP: case.backend}):
        y, _, (dx, dw) = _run(fusedops.causal_conv1d, *_leaves([x.to(dev), w.to(dev)]), *none, "silu",
                              False, gy.to(dev), None)
    y64, _, (dx64, dw64) = _run(composite, *_leaves([x.double(), w.double()]), *none, "silu", False,
                                gy.double(), None)
    yb, _, (dxb, dwb) = _run(composite, *_leaves([x.to(dev), w.to(dev)]), *none, "silu", False,
                             gy.to(dev), None)
    assert torch.isfinite(y).all() and torch.isfinite(dx).all() and torch.isfinite(dw).all()
    assert_close(y, yb, y64, dt, f"{case.id} y")
    assert_close(dx, dxb, dx64, dt, f"{case.id} dx")
    assert_close(dw, dwb, dw64, dt, f"{case.id} dweight")


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3], CONFIGS[10]], ids=_cfg_id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_matches_own_float64_composite(cfg, dtype, fresh_normal, seed_of):
    seed = seed_of("ref", cfg[0], str(dtype))
    x, w, b, r, h, cu, act, out_final = _inputs(cfg, dtype, "cpu", seed, fresh_normal)
    gy = fresh_normal(x.shape, torch.float64, "cpu", seed + 10)
    N = x.shape[0] if cu is None else cu.numel() - 1
    gf = fresh_normal((N, w.shape[1], w.shape[0]), torch.float64, "cpu", seed + 11)
    y, final, grads = _run(fusedops.reference.causal_conv1d, *_leaves([x, w, b, r, h]), cu, act,
                           out_final, gy, gf)
    y64, f64, g64 = _run(composite, *_leaves([t if t is None else t.double() for t in (x, w, b, r, h)]),
                         cu, act, out_final, gy, gf)
    assert y.dtype == torch.float64
    assert max_abs_error(y, y64) <= 1e-12 * scale_of(y64)
    assert torch.equal(final, f64)
    for g, gr in zip(grads, g64):
        assert g.dtype == dtype
        tol = 1e-12 if dtype == torch.float64 else 2.4e-7
        assert max_abs_error(g, gr) <= tol * scale_of(gr)


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("split", [1, 3, 10])
def test_state_chaining_equals_whole_sequence(backend_case, split, fresh_normal, seed_of):
    """A prefix, then the suffix started from the prefix's final state, gives the outputs of the
    whole sequence (bitwise) and, through autograd, the same gradients."""
    case = backend_case
    dt, dev = case.dtype, case.device
    cfg = ("chain", (2, 23, 24), 4, None, True, True, True, True, "silu")
    seed = seed_of("chain", split, str(dt))
    x, w, b, r, h, _, act, _ = _inputs(cfg, dt, dev, seed, fresh_normal)
    gy = fresh_normal(x.shape, dt, dev, seed + 10)
    gf = fresh_normal(h.shape, dt, dev, seed + 11)
    with fusedops.use_backend(**{OP: case.backend}):
        xw, ww, bw, rw, hw = _leaves([x, w, b, r, h])
        y_whole, f_whole = fusedops.causal_conv1d(xw, ww, bw, rw, hw, True, act)
        ((y_whole * gy).sum() + (f_whole * gf).sum()).backward()
        xc, wc, bc, rc, hc = _leaves([x, w, b, r, h])
        y1, f1 = fusedops.causal_conv1d(xc[:, :split], wc, bc, rc[:, :split], hc, True, act)
        y2, f2 = fusedops.causal_conv1d(xc[:, split:], wc, bc, rc[:, split:], f1, True, act)
        ((torch.cat([y1, y2], 1) * gy).sum() + (f2 * gf).sum()).backward()
    assert bitwise_equal(torch.cat([y1, y2], 1), y_whole)
    assert bitwise_equal(f2, f_whole)
    x64, w64, b64, r64, h64 = _leaves([t.cpu().double() for t in (x, w, b, r, h)])
    y64, f64 = composite(x64, w64, b64, r64, h64, True, act)
    ((y64 * gy.cpu().double()).sum() + (f64 * gf.cpu().double()).sum()).backward()
    xb, wb, bb, rb, hb = _leaves([x, w, b, r, h])
    yb, fb = composite(xb, wb, bb, rb, hb, True, act)
    ((yb * gy).sum() + (fb * gf).sum()).backward()
    for name, whole, chained, ref, base in zip(
            ("dx", "dweight", "dbias", "dresidual", "dinitial"), (xw, ww, bw, rw, hw),
            (xc, wc, bc, rc, hc), (x64, w64, b64, r64, h64), (xb, wb, bb, rb, hb)):
        assert_close(whole.grad, base.grad, ref.grad, dt, f"{case.id} whole {name}")
        assert_close(chained.grad, base.grad, ref.grad, dt, f"{case.id} chained {name}")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_varlen_equals_separate_sequences(backend_case, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    lens = [0, 5, 1, 0, 13, 2]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int64, device=dev)
    T, D, W = sum(lens), 40, 4
    seed = seed_of("varlen", str(dt))
    x = fresh_normal((1, T, D), dt, dev, seed)
    w = fresh_normal((W, D), dt, dev, seed + 1, std=0.6)
    h = fresh_normal((len(lens), D, W), dt, dev, seed + 2)
    with fusedops.use_backend(**{OP: case.backend}):
        y, f = fusedops.causal_conv1d(x, w, None, None, h, True, "silu", cu_seqlens=cu)
        for n in range(len(lens)):
            s, e = int(cu[n]), int(cu[n + 1])
            yn, fn = fusedops.causal_conv1d(x[:, s:e], w, None, None, h[n:n + 1], True, "silu")
            assert bitwise_equal(y[:, s:e], yn), f"sequence {n}"
            assert bitwise_equal(f[n:n + 1], fn), f"sequence {n}"
    assert bitwise_equal(f[0], h[0]) and bitwise_equal(f[3], h[3])  # L = 0: the state passes through


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_non_contiguous_inputs_and_weight_layouts(backend_case, fresh_normal, seed_of):
    """x, residual as slices of a fused projection (time stride > D), the weight as FLA's [D, W]
    (weight_layout="DW") and as a transposed view: the results of contiguous inputs."""
    case = backend_case
    dt, dev = case.dtype, case.device
    B, T, D, W = 2, 29, 48, 4
    seed = seed_of("layout", str(dt))
    qkv = fresh_normal((B, T, 3 * D), dt, dev, seed)
    w = fresh_normal((W, D), dt, dev, seed + 1, std=0.6)
    gy = fresh_normal((B, T, D), dt, dev, seed + 2)
    results = []
    for variant in ("contiguous", "strided", "dw_layout", "transposed_view"):
        src = qkv.detach().clone().requires_grad_()
        wl = w.detach().clone().requires_grad_()
        x = src[..., D:2 * D] if variant != "contiguous" else src[..., D:2 * D].contiguous()
        res = src[..., :D]
        with fusedops.use_backend(**{OP: case.backend}):
            if variant == "dw_layout":
                y, _ = fusedops.causal_conv1d(x, wl.t().contiguous(), None, res, None,
                                              activation="silu", weight_layout="DW")
            elif variant == "transposed_view":
                y, _ = fusedops.causal_conv1d(x, wl.t().contiguous().t(), None, res, None, activation="silu")
            else:
                y, _ = fusedops.causal_conv1d(x, wl, None, res, None, activation="silu")
            (y * gy).sum().backward()
        results.append((y.detach(), src.grad, wl.grad))
    for _i, (name, r) in enumerate(zip(("strided", "dw_layout", "transposed_view"), results[1:])):
        for a, b in zip(r, results[0]):
            assert max_abs_error(a, b) <= 2e-2 * scale_of(b), name
    assert bitwise_equal(results[1][0], results[0][0]) or dt == torch.bfloat16


def test_empty_inputs(device):
    W, D = 4, 8
    w = torch.randn(W, D, device=device, requires_grad=True)
    h = torch.randn(2, D, W, device=device, requires_grad=True)
    x = torch.randn(2, 0, D, device=device, requires_grad=True)
    y, f = fusedops.causal_conv1d(x, w, None, None, h, True, "silu")
    assert y.shape == (2, 0, D) and torch.equal(f, h)
    g = torch.randn_like(f)
    (f * g).sum().backward()
    assert torch.equal(h.grad, g), "L = 0: the whole state (slot 0 too) passes through"
    assert torch.equal(w.grad, torch.zeros_like(w))
    xb = torch.randn(0, 5, D, device=device, requires_grad=True)
    y, f = fusedops.causal_conv1d(xb, w, None, None, None, True)
    assert y.shape == (0, 5, D) and f.shape == (0, D, W)
    y, _ = fusedops.causal_conv1d(torch.randn(2, 3, 0, device=device), torch.randn(W, 0, device=device))
    assert y.shape == (2, 3, 0)


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_repeated_backward_is_bitwise_identical(backend_case, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    cfg = ("det", (2, 300, 72), 4, None, True, False, True, True, "silu")
    x, w, b, r, h, cu, act, out_final = _inputs(cfg, dt, dev, seed_of("det", str(dt)), fresh_normal)
    gy = fresh_normal(x.shape, dt, dev, 1)
    gf = fresh_normal(h.shape, dt, dev, 2)
    runs = []
    for _ in range(2):
        with fusedops.use_backend(**{OP: case.backend}):
            runs.append(_run(fusedops.causal_conv1d, *_leaves([x, w, b, r, h]), cu, act, out_final, gy, gf))
    for a, b_ in zip(runs[0][2], runs[1][2]):
        assert bitwise_equal(a, b_)


# ---------------------------------------------------------------------------------------------
# torch.library: opcheck and torch.compile.


@pytest.mark.parametrize("with_options", [False, True])
def test_opcheck(device, with_options):
    x = torch.randn(2, 9, 16, device=device, requires_grad=True)
    w = torch.randn(4, 16, device=device, requires_grad=True)
    b = torch.randn(16, device=device, requires_grad=True) if with_options else None
    r = torch.randn(2, 9, 16, device=device) if with_options else None
    h = torch.randn(2, 16, 4, device=device, requires_grad=True) if with_options else None
    torch.library.opcheck(torch.ops.fusedops.causal_conv1d_fwd.default,
                          (x, w, b, r, h, None, "silu", with_options))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.fusedops.causal_conv1d_fwd.default,
                          (x[:1], w, b, r[:1] if r is not None else None, h, cu, "", True))
    dy = torch.randn(2, 9, 16, device=device)
    dht = torch.randn(2, 16, 4, device=device) if with_options else None
    torch.library.opcheck(torch.ops.fusedops.causal_conv1d_bwd.default,
                          (x.detach(), w.detach(), None if b is None else b.detach(),
                           None if h is None else h.detach(), None, dy, dht, "silu", True,
                           with_options, with_options))


def _loss_fn(x, w, b, h, gy):
    y, f = fusedops.causal_conv1d(x, w, b, None, h, True, "silu")
    y2, _ = fusedops.causal_conv1d(y, w, None, x, f)
    return (y2 * gy).sum() + f.sum()


def test_torch_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()
    x = torch.randn(2, 11, 24, device=device)
    w, b = torch.randn(4, 24, device=device), torch.randn(24, device=device)
    h, gy = torch.randn(2, 24, 4, device=device), torch.randn(2, 11, 24, device=device)
    eager = _leaves([x, w, b, h])
    _loss_fn(*eager, gy).backward()
    comp = _leaves([x, w, b, h])
    torch.compile(_loss_fn, fullgraph=True, backend="aot_eager")(*comp, gy).backward()
    for a, c in zip(eager, comp):
        assert bitwise_equal(a.grad, c.grad)


# ---------------------------------------------------------------------------------------------
# Errors (docs/specs/ops.md section 4.5) reach Python as exceptions that say what is wrong.


def test_errors(device):
    x = torch.randn(2, 5, 8, device=device)
    w = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match=r"x must have rank >= 3"):
        fusedops.causal_conv1d(torch.randn(5, 8, device=device), w)
    with pytest.raises(ValueError, match=r"weight must have shape \[W,D\] with D = 8"):
        fusedops.causal_conv1d(x, torch.randn(4, 9, device=device))
    with pytest.raises(ValueError, match=r"weight must have shape \[W,D\]"):
        fusedops.causal_conv1d(x, torch.randn(4, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape \[8\]"):
        fusedops.causal_conv1d(x, w, torch.randn(9, device=device))
    with pytest.raises(ValueError, match=r"residual must have shape \[2,5,8\] \(same as x\)"):
        fusedops.causal_conv1d(x, w, None, torch.randn(2, 6, 8, device=device))
    with pytest.raises(TypeError, match=r"residual must have the dtype of x \(float32\), got bfloat16"):
        fusedops.causal_conv1d(x, w, None, torch.randn(2, 5, 8, device=device, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2,8,4\] \(\[N,D,W\]\)"):
        fusedops.causal_conv1d(x, w, None, None, torch.randn(2, 8, 3, device=device))
    with pytest.raises(ValueError, match=r"activation must be one of None, 'silu', 'swish', got 'relu'"):
        fusedops.causal_conv1d(x, w, activation="relu")
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"cu_seqlens requires x with batch size B == 1"):
        fusedops.causal_conv1d(x, w, cu_seqlens=cu)
    with pytest.raises(TypeError, match=r"cu_seqlens must have dtype in \{int32, int64\}"):
        fusedops.causal_conv1d(x[:1], w, cu_seqlens=cu.float())
    with pytest.raises(TypeError, match="unexpected keyword"):
        fusedops.causal_conv1d(x, w, nonsense=1)
    with pytest.raises(ValueError, match="weight_layout"):
        fusedops.causal_conv1d(x, w, weight_layout="xy")
    # The positional order is FLA's / MindSpeed's: the old (..., activation, cu_seqlens,
    # output_final_state) positions raise instead of running with swapped meanings.
    with pytest.raises(TypeError, match=r"positional order is \(x, weight, bias, residual, "
                                        r"initial_state, output_final_state, activation\)"):
        fusedops.causal_conv1d(x, w, None, None, None, "silu")
    with pytest.raises(TypeError, match="positional order"):
        fusedops.causal_conv1d(x[:1], w, None, None, None, False, cu)
    with pytest.raises(TypeError):
        fusedops.causal_conv1d(x[:1], w, None, None, None, False, "silu", cu)
    # FLA's [D, W] weight given without weight_layout="DW" is named as such.
    with pytest.raises(ValueError, match=r"FLA's \[D,W\] layout: pass weight_layout='DW'"):
        fusedops.causal_conv1d(x, w.t().contiguous())


@pytest.mark.parametrize("offsets,message", [
    ([0, 3, 2, 5], "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 2 < cu_seqlens[1] = 3"),
    ([1, 3, 5], "cu_seqlens must start at 0, got cu_seqlens[0] = 1"),
    ([0, 3, 4], "cu_seqlens must end at T = 5 (x's time steps), got cu_seqlens[2] = 4"),
])
def test_bad_offsets_raise_on_cpu_and_are_reported_on_cuda(device, offsets, message):
    x = torch.randn(1, 5, 8, device=device)
    w = torch.randn(4, 8, device=device)
    cu = torch.tensor(offsets, dtype=torch.int32, device=device)
    bad = next(i for i, v in enumerate(offsets) if (v != 0 if i == 0 else v < offsets[i - 1])
               or (i == len(offsets) - 1 and v != 5))
    expect_rejected(device, lambda: fusedops.causal_conv1d(x, w, cu_seqlens=cu),
                    "causal_conv1d: " + message,
                    f"cu_seqlens[{bad}] = {offsets[bad]} is not (the offsets are clamped to [0, T])")


# ---------------------------------------------------------------------------------------------
# fusedops.nn.ShortConvolution


def test_short_convolution_matches_the_functional_op_and_conv1d(device):
    torch.manual_seed(0)
    D, W = 24, 4
    m = fusedops.nn.ShortConvolution(D, W, bias=True, activation="silu", device=device)
    assert m.weight.shape == (D, 1, W)
    x = torch.randn(2, 13, D, device=device, requires_grad=True)
    y, f = m(x, output_final_state=True)
    # nn.Conv1d's own forward (left padding W-1, depthwise) is the same convolution.
    want = F.silu(torch.nn.Conv1d.forward(m, x.transpose(1, 2))[..., :13].transpose(1, 2))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f, x[:, -W:].transpose(1, 2))
    y.sum().backward()
    assert m.weight.grad.shape == (D, 1, W) and m.bias.grad.shape == (D,)
    with pytest.raises(ValueError, match="activation"):
        fusedops.nn.ShortConvolution(D, W, activation="gelu")


def test_short_convolution_decoding_updates_the_cache_in_place(device):
    torch.manual_seed(1)
    D, W, T = 16, 4, 9
    m = fusedops.nn.ShortConvolution(D, W, device=device)
    x = torch.randn(2, T, D, device=device)
    with torch.no_grad():
        y_full, _ = m(x)
        cache = torch.zeros(2, D, W, device=device)
        steps = []
        for t in range(T):
            y_t, c = m(x[:, t:t + 1], cache=cache, output_final_state=True)
            assert c is cache
            steps.append(y_t)
        torch.testing.assert_close(torch.cat(steps, 1), y_full)
        torch.testing.assert_close(cache, x[:, -W:].transpose(1, 2))
        y_step, _ = m.step(x[:, :1], None, None)
        torch.testing.assert_close(y_step, y_full[:, :1])
    mask = torch.ones(2, T, device=device)
    mask[:, :3] = 0
    y_masked, _ = m(x, mask=mask)
    y_zeroed, _ = m(x * mask.unsqueeze(-1))
    torch.testing.assert_close(y_masked, y_zeroed)
