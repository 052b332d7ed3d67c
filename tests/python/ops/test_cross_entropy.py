"""fused_cross_entropy_loss (docs/specs/ops.md section 1) through the torch layer.

Every registered backend is forced in turn (``backend_case``) and compared, loss and every
gradient (logits, loss_weight), with a float64 PyTorch composite written here and differentiated
by torch.autograd; the tolerance base is the same composite in the input dtype
(tests/common/tolerance.py). torch.nn.functional.cross_entropy is a second oracle where its
options overlap.
"""

from __future__ import annotations

import fusedops
import pytest
import torch
import torch.nn.functional as F

from tests.common.bad_input import expect_rejected
from tests.common.tolerance import assert_close, max_abs_error, scale_of

OP = "fused_cross_entropy_loss"
BITWISE_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}

SHAPES = [(1, 1), (3, 129), (4, 5, 33), (64, 1000), (2, 32003), (0, 16)]
OPTIONS = {
    "mean": dict(),
    "sum-weights": dict(reduction="sum", weights=True, ignore_every=3),
    "none-weights": dict(reduction="none", weights=True, ignore_every=4),
    "smoothing-zloss": dict(label_smoothing=0.1, lse_square_scale=1e-3, ignore_every=2),
    "softcap-scale-ignore7": dict(reduction="sum", logit_softcapping=3.0, logit_scale=0.5,
                                  ignore_index=7, weights=True, ignore_every=5),
    "none-everything": dict(reduction="none", label_smoothing=0.25, lse_square_scale=1e-2,
                            logit_softcapping=5.0, logit_scale=1.7, weights=True, ignore_every=3),
    "all-ignored": dict(label_smoothing=0.2, weights=True, ignore_every=1),
}


def composite(logits, labels, loss_weight=None, *, ignore_index=-100, reduction=None,
              label_smoothing=0.0, logit_scale=1.0, logit_softcapping=None, lse_square_scale=0.0):
    """The plain PyTorch composite of docs/specs/ops.md 1.3, in the dtype of its inputs. Returns
    (loss, z_loss)."""
    if reduction is None:
        reduction = "sum" if loss_weight is not None else "mean"
    V = logits.shape[-1]
    z = logits.reshape(-1, V) * logit_scale
    if logit_softcapping is not None:
        z = logit_softcapping * torch.tanh(z / logit_softcapping)
    y = labels.reshape(-1)
    valid = y != ignore_index
    lse = torch.logsumexp(z, -1)
    zy = z.gather(-1, torch.where(valid, y, 0)[:, None].long())[:, 0]
    ce = (1 - label_smoothing) * (lse - zy) + label_smoothing * (lse - z.mean(-1))
    zl = lse_square_scale * lse * lse
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    row = torch.where(valid, ce + zl, zero)
    zl = torch.where(valid, zl, zero)
    w = loss_weight.reshape(-1).to(z.dtype) if loss_weight is not None else 1.0
    if reduction == "none":
        return (w * row).reshape(labels.shape), zl.reshape(labels.shape)
    norm = valid.sum().clamp(min=1) if reduction == "mean" else 1
    return (w * row).sum() / norm, zl.sum() / norm


def make_inputs(shape, opts, dtype, device, seed, spread=2.0):
    g = torch.Generator().manual_seed(seed)
    V = shape[-1]
    logits = (torch.randn(shape, generator=g, dtype=torch.float64) * spread).to(dtype).to(device)
    labels = torch.randint(0, max(V, 1), shape[:-1], generator=g)
    every = opts.get("ignore_every", 0)
    if every:
        flat = labels.view(-1)
        flat[::every] = opts.get("ignore_index", -100)
    wdt = torch.float64 if dtype == torch.float64 else torch.float32
    weights = (0.5 + torch.rand(shape[:-1], generator=g, dtype=torch.float64)).to(wdt).to(device)
    return logits, labels.to(device), weights


def kwargs_of(opts):
    return {k: v for k, v in opts.items() if k not in ("weights", "ignore_every")}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    iv = BITWISE_VIEW[a.dtype]
    return torch.equal(a.detach().contiguous().view(iv), b.detach().contiguous().view(iv))


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


def grads_of(out, inputs, grad):
    gs = torch.autograd.grad(out, [t for t in inputs if t is not None], grad, allow_unused=True)
    return list(gs)


# ---------------------------------------------------------------------------------------------
# Every backend, option set and shape against the float64 oracle.


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(OPTIONS))
def test_loss_and_gradients_match_float64(backend_case, shape, name, seed_of):
    case = backend_case
    opts = OPTIONS[name]
    if shape[-1] > 10000 and name not in ("mean", "none-everything"):
        pytest.skip("long rows: two option sets are enough")
    dt, dev = case.dtype, case.device
    logits, labels, weights = make_inputs(shape, opts, dt, dev, seed_of(OP, shape, name, str(dt)))
    kw = kwargs_of(opts)
    use_w = opts.get("weights", False)
    reduction = kw.get("reduction")
    x = logits.clone().requires_grad_()
    w = weights.clone().requires_grad_() if use_w else None
    gshape = labels.shape if reduction == "none" else ()
    g = (torch.randn(gshape, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.5)
    with forced(case):
        loss, z_loss = fusedops.fused_cross_entropy_loss(x, labels, w, return_z_loss=True, **kw)
        assert loss.dtype == (torch.float64 if dt == torch.float64 else torch.float32)
        assert tuple(loss.shape) == tuple(gshape)
        grads = grads_of(loss, [x, w], g.to(loss.dtype).to(dev))

    x64 = logits.detach().cpu().double().requires_grad_()
    w64 = weights.detach().cpu().double().requires_grad_() if use_w else None
    xb = logits.detach().clone().requires_grad_()
    wb = weights.detach().clone().to(dt).requires_grad_() if use_w else None
    l64, z64 = composite(x64, labels.cpu(), w64, **kw)
    lb, zb = composite(xb, labels, wb, **kw)
    tag = f"{case.id} {shape} {name}"
    assert_close(loss, lb, l64, dt, f"{tag} loss")
    assert_close(z_loss, zb, z64, dt, f"{tag} z_loss")
    if shape[0] == 0:
        return
    g64 = grads_of(l64, [x64, w64], g)
    gb = grads_of(lb, [xb, wb], g.to(lb.dtype).to(dev))
    gb = [torch.zeros_like(t) if t is None else t for t in gb]
    assert grads[0].dtype == dt and grads[0].shape == x.shape
    assert_close(grads[0], gb[0], g64[0], dt, f"{tag} dlogits")
    if use_w:
        assert grads[1].dtype == w.dtype
        assert_close(grads[1], gb[1], g64[1], dt, f"{tag} dloss_weight")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_torch_functional_cross_entropy(backend_case, label_smoothing, reduction, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    opts = dict(ignore_every=4)
    logits, labels, _ = make_inputs((37, 517), opts, dt, dev, seed_of("F", label_smoothing, reduction, str(dt)))
    x = logits.clone().requires_grad_()
    with forced(case):
        loss = fusedops.fused_cross_entropy_loss(x, labels, reduction=reduction, label_smoothing=label_smoothing)
        g = torch.ones_like(loss) if reduction != "none" else torch.linspace(-1, 2, 37, device=dev)
        (dx,) = torch.autograd.grad(loss, x, g)
    x64 = logits.detach().cpu().double().requires_grad_()
    l64 = F.cross_entropy(x64, labels.cpu(), reduction=reduction, label_smoothing=label_smoothing)
    (dx64,) = torch.autograd.grad(l64, x64, g.cpu().double())
    xb = logits.detach().clone().requires_grad_()
    lb = F.cross_entropy(xb, labels, reduction=reduction, label_smoothing=label_smoothing)
    (dxb,) = torch.autograd.grad(lb, xb, g.to(lb.dtype))
    assert_close(loss, lb, l64, dt, f"{case.id} F.cross_entropy {reduction} loss")
    assert_close(dx, dxb, dx64, dt, f"{case.id} F.cross_entropy {reduction} dlogits")


# ---------------------------------------------------------------------------------------------
# Special values, layouts, in-place modes, determinism.


@pytest.mark.parametrize("name", ["mean", "softcap-scale-ignore7", "none-everything"])
def test_large_logits_stay_finite(backend_case, name, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    opts = OPTIONS[name]
    logits, labels, weights = make_inputs((6, 517), opts, dt, dev, seed_of("large", name), spread=4000.0)
    logits[:, 0] = 1e4
    logits[:, 1] = -1e4
    kw = kwargs_of(opts)
    x = logits.clone().requires_grad_()
    with forced(case):
        loss = fusedops.fused_cross_entropy_loss(x, labels, weights if opts.get("weights") else None, **kw)
        loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(x.grad).all()
    x64 = logits.detach().cpu().double().requires_grad_()
    l64, _ = composite(x64, labels.cpu(), weights.cpu().double() if opts.get("weights") else None, **kw)
    l64.sum().backward()
    lb, _ = composite(logits, labels, weights.to(dt) if opts.get("weights") else None, **kw)
    assert_close(loss, lb.detach(), l64.detach(), dt, f"{case.id} large logits {name}")



@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("vocab", [203, 256])  # CUDA: rows not a whole number of 16-byte units, and rows that are
def test_masked_logits_of_minus_inf(backend_case, vocab, seed_of):
    # Vocabulary masked with -inf (not at the labels): finite losses equal to the composite's,
    # exactly zero gradient at the masked entries, with and without a gradient (the CPU's
    # vectorised exponentials clamp -inf before their range reduction).
    case = backend_case
    dt, dev = case.dtype, case.device
    gen = torch.Generator().manual_seed(seed_of("minus_inf", str(dt), vocab))
    rows = 6
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(dt)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    mask = torch.rand(rows, vocab, generator=gen) < 0.4
    mask[torch.arange(rows), labels] = False
    logits[mask] = float("-inf")
    logits, labels = logits.to(dev), labels.to(dev)
    x = logits.clone().requires_grad_()
    with forced(case):
        loss = fusedops.fused_cross_entropy_loss(x, labels, reduction="sum")
        loss.backward()
        with torch.no_grad():
            loss_only = fusedops.fused_cross_entropy_loss(logits, labels, reduction="sum")
    assert torch.isfinite(loss) and bitwise_equal(loss.detach(), loss_only)
    assert torch.equal(x.grad[mask.to(dev)], torch.zeros_like(x.grad[mask.to(dev)]))
    x64 = logits.detach().cpu().double().requires_grad_()
    l64 = torch.nn.functional.cross_entropy(x64, labels.cpu(), reduction="sum")
    l64.backward()
    lb = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
    assert_close(loss, lb.detach().to(loss.dtype), l64.detach(), dt, f"{case.id} -inf logits loss")
    xb = logits.float().requires_grad_()
    torch.nn.functional.cross_entropy(xb, labels, reduction="sum").backward()
    assert_close(x.grad, xb.grad.to(dt), x64.grad, dt, f"{case.id} -inf logits grad")

@pytest.mark.parametrize("vocab,width", [(203, 203), (1003, 1008), (40000, 40000)])
@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_signed_and_zero_loss_weights_and_edge_labels(backend_case, vocab, width, reduction, seed_of):
    # Negative and zero per-token weights (CUDA's plain pass folds |a| into the exponent and
    # applies the sign of a to the packed 16-bit result), labels at the first and last column, at
    # a 16-byte unit's last element and in the row's tail (rows of width > vocab: a strided view
    # whose last vocab % 8 columns are not a whole unit), plain and general passes, short rows and
    # rows kept in shared memory.
    case = backend_case
    dt, dev = case.dtype, case.device
    gen = torch.Generator().manual_seed(seed_of("signed_weights", str(dt), vocab, reduction))
    rows = 9
    buf = (torch.randn(rows, width, generator=gen, dtype=torch.float64) * 2).to(dt)
    logits = buf[:, :vocab]
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    labels[:5] = torch.tensor([0, vocab - 1, 7, vocab - 2, -100])
    wdt = torch.float64 if dt == torch.float64 else torch.float32
    weights = torch.randn(rows, generator=gen, dtype=torch.float64)
    weights[2] = 0.0
    weights[3] = -abs(weights[3]) - 0.5
    weights = weights.to(wdt)
    g = torch.randn(rows if reduction == "none" else (), generator=gen, dtype=torch.float64)
    for kw in (dict(), dict(label_smoothing=0.1, logit_softcapping=4.0)):
        x = logits.to(dev).detach().requires_grad_()
        w = weights.to(dev).requires_grad_()
        with forced(case):
            loss = fusedops.fused_cross_entropy_loss(x, labels.to(dev), w, reduction=reduction, **kw)
            dx, dw = torch.autograd.grad(loss, [x, w], g.to(loss.dtype).to(dev))
            with torch.no_grad():  # no gradient: CUDA's loss-only kernel, which reads the strided rows by units
                loss_only = fusedops.fused_cross_entropy_loss(logits.to(dev), labels.to(dev), weights.to(dev),
                                                              reduction=reduction, **kw)
        x64 = logits.double().requires_grad_()
        w64 = weights.double().requires_grad_()
        l64, _ = composite(x64, labels, w64, reduction=reduction, **kw)
        dx64, dw64 = torch.autograd.grad(l64, [x64, w64], g)
        xb = logits.to(dev).detach().requires_grad_()
        wb = weights.to(dev).to(dt).requires_grad_()
        lb, _ = composite(xb, labels.to(dev), wb, reduction=reduction, **kw)
        dxb, dwb = torch.autograd.grad(lb, [xb, wb], g.to(lb.dtype).to(dev))
        tag = f"{case.id} V={vocab} width={width} {reduction} {sorted(kw)}"
        assert_close(loss, lb, l64, dt, f"{tag} loss")
        assert_close(loss_only, lb, l64, dt, f"{tag} loss without gradient")
        assert_close(dx, dxb, dx64, dt, f"{tag} dlogits")
        assert_close(dw, dwb, dw64, dt, f"{tag} dloss_weight")
        assert torch.equal(dx[2], torch.zeros_like(dx[2])) and torch.equal(dx[4], torch.zeros_like(dx[4]))


def test_all_ignored_mean_is_zero_not_nan(device):
    x = torch.randn(5, 11, device=device, requires_grad=True)
    labels = torch.full((5,), -100, device=device)
    loss = fusedops.fused_cross_entropy_loss(x, labels)
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("bad", [10, -5])
def test_out_of_range_labels_raise_on_cpu_and_are_nan_and_reported_on_cuda(device, bad):
    # Issue 39: labels [1, 2, 10, 3] (10 = V) and -5 (not ignore_index) gave NaN silently.
    x = torch.randn(4, 10, device=device)
    labels = torch.tensor([1, 2, bad, 3], device=device)
    loss = expect_rejected(
        device, lambda: fusedops.fused_cross_entropy_loss(x, labels, reduction="none"),
        f"fused_cross_entropy_loss: labels[2] = {bad} is outside [0, 10) and is not ignore_index (-100)",
        f"fused_cross_entropy_loss: labels[2] = {bad} is outside [0, V) and is not ignore_index")
    if loss is not None:
        assert torch.isnan(loss[2]) and torch.isfinite(loss[[0, 1, 3]]).all()
        ref = fusedops.reference.fused_cross_entropy_loss(x, torch.tensor([1, 2, -100, 3], device=device),
                                                          reduction="none")
        assert torch.allclose(loss[[0, 1, 3]].double().cpu(), ref[[0, 1, 3]].cpu(), rtol=1e-5, atol=1e-6)


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_inplace_backward_overwrites_logits_and_matches(backend_case, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    opts = OPTIONS["none-everything"]
    logits, labels, weights = make_inputs((9, 300), opts, dt, dev, seed_of("inplace", str(dt)))
    kw = kwargs_of(opts)
    g = torch.randn(9, device=dev)
    results = []
    for inplace in (False, True):
        x = logits.clone().requires_grad_()
        w = weights.clone().requires_grad_()
        with forced(case):
            loss = fusedops.fused_cross_entropy_loss(x * 1, labels, w, inplace_backward=inplace, **kw)
            loss.backward(g)
        results.append((loss, x.grad, w.grad))
    for a, b in zip(*results):
        assert bitwise_equal(a, b)
    # A leaf's logits are overwritten by their gradient.
    x = logits.clone().requires_grad_()
    with forced(case):
        loss = fusedops.fused_cross_entropy_loss(x, labels, inplace_backward=True, **{**kw, "reduction": "sum"})
        loss.backward()
    assert bitwise_equal(x.detach(), x.grad)


def _layouts(dt, dev, seed):
    g = torch.Generator().manual_seed(seed)
    V = 96
    yield "transposed", torch.randn(V, 33, generator=g).to(dt).to(dev).t()
    yield "column_slice", torch.randn(33, 2 * V, generator=g).to(dt).to(dev)[:, :V]
    yield "permuted_3d", torch.randn(3, 11, V, generator=g).to(dt).to(dev).transpose(0, 1)


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_non_contiguous_logits_match_contiguous(backend_case, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    for name, x_nc in _layouts(dt, dev, seed_of("layout", str(dt))):
        labels = torch.randint(0, x_nc.shape[-1], x_nc.shape[:-1], generator=torch.Generator().manual_seed(1)).to(dev)
        outs = []
        for x in (x_nc.detach().requires_grad_(), x_nc.detach().contiguous().requires_grad_()):
            with forced(case):
                loss = fusedops.fused_cross_entropy_loss(x, labels, label_smoothing=0.1)
                loss.backward()
            outs.append((loss.detach(), x.grad))
        for a, b in zip(*outs):
            assert max_abs_error(a, b) <= 1e-6 * scale_of(b), name


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_repeated_backward_is_bitwise_identical(backend_case, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    opts = OPTIONS["smoothing-zloss"]
    logits, labels, weights = make_inputs((300, 1000), opts, dt, dev, seed_of("det", str(dt)))
    runs = []
    for _ in range(2):
        x = logits.clone().requires_grad_()
        w = weights.clone().requires_grad_()
        with forced(case):
            loss = fusedops.fused_cross_entropy_loss(x, labels, w, **kwargs_of(opts))
            (loss * 1.5).backward()
        runs.append((loss, x.grad, w.grad))
    for a, b in zip(*runs):
        assert bitwise_equal(a, b)


# An upstream gradient of 1 skips the in-place scaling on the CPU (cross_entropy._unit_upstream)
# and must raise all the same; 2 takes the in-place call.
@pytest.mark.parametrize("upstream", [1.0, 2.0])
def test_second_backward_through_the_same_call_raises(device, upstream):
    x = torch.randn(4, 9, device=device, requires_grad=True)
    loss = fusedops.fused_cross_entropy_loss(x, torch.tensor([0, 1, 2, 3], device=device))
    loss.backward(torch.tensor(upstream, device=device), retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_no_grad_forward_gives_the_same_loss(device):
    x = torch.randn(7, 50, device=device, requires_grad=True)
    labels = torch.randint(0, 50, (7,), device=device)
    with_grad = fusedops.fused_cross_entropy_loss(x, labels, lse_square_scale=1e-3)
    with torch.no_grad():
        without = fusedops.fused_cross_entropy_loss(x, labels, lse_square_scale=1e-3)
    assert bitwise_equal(with_grad.detach(), without)


# ---------------------------------------------------------------------------------------------
# The MindSpeed form, the module, the reference.


def test_mindspeed_function_form_is_the_weighted_sum(device):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 40, generator=g).half().to(device).requires_grad_()
    w = torch.rand(6, generator=g).to(device).requires_grad_()
    labels = torch.randint(0, 40, (6,), generator=g).int().to(device)
    loss = fusedops.FusedCrossEntropyLossFunction.apply(x, w, labels)
    loss.backward()
    x64 = x.detach().cpu().double().requires_grad_()
    w64 = w.detach().cpu().double().requires_grad_()
    l64 = (F.cross_entropy(x64, labels.cpu().long(), reduction="none") * w64).sum()
    l64.backward()
    xb = x.detach().clone().requires_grad_()
    wb = w.detach().clone().half().requires_grad_()
    lb = (F.cross_entropy(xb, labels.long(), reduction="none") * wb).sum()
    lb.backward()
    assert_close(loss, lb, l64, torch.float16, "mindspeed loss")
    assert_close(x.grad, xb.grad, x64.grad, torch.float16, "mindspeed dlogits")
    assert_close(w.grad, wb.grad, w64.grad, torch.float16, "mindspeed dloss_weight")


def test_module_matches_function(device):
    x = torch.randn(2, 5, 30, device=device)
    labels = torch.randint(0, 30, (2, 5), device=device)
    mod = fusedops.nn.FusedCrossEntropyLoss(label_smoothing=0.1, lse_square_scale=1e-4, return_z_loss=True)
    loss, z = mod(x, labels)
    loss2, z2 = fusedops.fused_cross_entropy_loss(x, labels, label_smoothing=0.1, lse_square_scale=1e-4,
                                                  return_z_loss=True)
    assert bitwise_equal(loss, loss2) and bitwise_equal(z, z2)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_reference_matches_own_float64_composite(name, seed_of):
    opts = OPTIONS[name]
    logits, labels, weights = make_inputs((13, 37), opts, torch.float64, "cpu", seed_of("ref", name))
    kw = kwargs_of(opts)
    x = logits.clone().requires_grad_()
    w = weights.double().requires_grad_() if opts.get("weights") else None
    loss, z = fusedops.reference.fused_cross_entropy_loss(x, labels, w, return_z_loss=True, **kw)
    x2 = logits.clone().requires_grad_()
    w2 = weights.double().requires_grad_() if opts.get("weights") else None
    l2, z2 = composite(x2, labels, w2, **kw)
    assert max_abs_error(loss, l2) <= 1e-12 * scale_of(l2)
    assert max_abs_error(z, z2) <= 1e-12 * scale_of(z2)
    g = torch.randn(loss.shape, dtype=torch.float64)
    ga = grads_of(loss, [x, w], g)
    gb = grads_of(l2, [x2, w2], g)
    for a, b in zip(ga, gb):
        assert max_abs_error(a, b) <= 1e-12


# ---------------------------------------------------------------------------------------------
# torch.library: opcheck and torch.compile.


@pytest.mark.parametrize("want", ["loss", "grad", "all"])
def test_opcheck_forward(device, want):
    x = torch.randn(6, 37, device=device, requires_grad=want != "loss")
    labels = torch.tensor([1, 2, -100, 4, 36, 0], device=device)
    w = torch.rand(6, device=device, requires_grad=want == "all")
    args = (x, labels, w if want == "all" else None, -100, "sum" if want == "all" else "mean", 0.1, 1.0,
            5.0 if want == "all" else None, 1e-3, want == "all", want != "loss", want == "all")
    torch.library.opcheck(torch.ops.fusedops.fused_cross_entropy_loss_fwd.default, args)


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_opcheck_backward(device, reduction):
    grad = torch.randn(5, 21, device=device)
    glw = torch.randn(5, device=device)
    g = torch.randn(5 if reduction == "none" else (), device=device)
    torch.library.opcheck(torch.ops.fusedops.fused_cross_entropy_loss_bwd.default,
                          (g, grad, glw, reduction, torch.bfloat16))
    torch.library.opcheck(torch.ops.fusedops.fused_cross_entropy_loss_bwd_inplace.default,
                          (g, grad.clone(), glw.clone(), reduction))


def _loss_fn(x, labels, w):
    loss, z = fusedops.fused_cross_entropy_loss(x * 2, labels, w, label_smoothing=0.1, lse_square_scale=1e-3,
                                                logit_softcapping=20.0, return_z_loss=True)
    return loss * 3 + z.sum() * 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_compile_fullgraph_matches_eager(device, dtype):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, 72, generator=g).to(dtype).to(device)
    labels = torch.randint(0, 72, (9,), generator=g).to(device)
    w = torch.rand(9, generator=g).to(device)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    we, wc = w.clone().requires_grad_(), w.clone().requires_grad_()
    le = _loss_fn(xe, labels, we)
    le.backward()
    lc = torch.compile(_loss_fn, fullgraph=True, backend="aot_eager")(xc, labels, wc)
    lc.backward()
    assert bitwise_equal(lc, le)
    assert bitwise_equal(xc.grad, xe.grad)
    assert bitwise_equal(wc.grad, we.grad)


# ---------------------------------------------------------------------------------------------
# Errors reach Python as Python exceptions that say what is wrong.


def test_bad_arguments_raise(device):
    x = torch.randn(4, 8, device=device)
    labels = torch.tensor([0, 1, 2, 3], device=device)
    with pytest.raises(ValueError, match="rank >= 2"):
        fusedops.fused_cross_entropy_loss(torch.randn(8, device=device), labels[:1])
    with pytest.raises(TypeError, match="labels must have dtype in {int32, int64}, got float32"):
        fusedops.fused_cross_entropy_loss(x, labels.float())
    with pytest.raises(ValueError, match="labels must have one entry per row of logits \\(4\\)"):
        fusedops.fused_cross_entropy_loss(x, labels[:3])
    with pytest.raises(ValueError, match="loss_weight must have one entry per row"):
        fusedops.fused_cross_entropy_loss(x, labels, torch.ones(5, device=device))
    with pytest.raises(ValueError, match="reduction must be one of 'none', 'sum', 'mean', got 'avg'"):
        fusedops.fused_cross_entropy_loss(x, labels, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing must be in \\[0, 1\\]"):
        fusedops.fused_cross_entropy_loss(x, labels, label_smoothing=-0.1)
    with pytest.raises(ValueError, match="logit_softcapping must be a finite number > 0"):
        fusedops.fused_cross_entropy_loss(x, labels, logit_softcapping=0.0)
    with pytest.raises(ValueError, match="lse_square_scale must be a finite number >= 0"):
        fusedops.fused_cross_entropy_loss(x, labels, lse_square_scale=-1.0)
    with pytest.raises(ValueError, match="vocabulary dimension of size >= 1"):
        fusedops.fused_cross_entropy_loss(torch.randn(4, 0, device=device), labels)
    xs = torch.randn(4, 16, device=device)[:, :8].requires_grad_()
    with pytest.raises(ValueError, match="inplace_backward .* needs contiguous logits"):
        fusedops.fused_cross_entropy_loss(xs, labels, inplace_backward=True)


def test_cpu_backend_refuses_float64():
    with fusedops.use_backend(**{OP: "cpu"}), pytest.raises(RuntimeError, match="does not take float64"):
        fusedops.fused_cross_entropy_loss(torch.randn(4, 8, dtype=torch.float64), torch.zeros(4, dtype=torch.long))


def test_cuda_graph_capture_matches_eager():
    """The forward (loss + gradient) and the backward rescaling replay from a CUDA graph: no host
    synchronization, every buffer allocated by the caller."""
    if not torch.cuda.is_available() or not fusedops.built_with_cuda():
        pytest.skip("needs a CUDA device and a CUDA build")
    g = torch.Generator().manual_seed(9)
    x = torch.randn(64, 32000, generator=g).bfloat16().cuda()
    labels = torch.randint(0, 32000, (64,), generator=g).cuda()
    labels[::7] = -100
    op = torch.ops.fusedops.fused_cross_entropy_loss_fwd.default
    args = (x, labels, None, -100, "mean", 0.1, 1.0, 30.0, 1e-4, True, True, False)
    eager = op(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(*args)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager[:3], captured[:3]):
        assert bitwise_equal(a, b)
