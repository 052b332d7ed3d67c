"""chunk_loss (docs/specs/ops.md section 10) through the torch layer.

Every registered backend is forced in turn and compared with ``linear + cross_entropy`` written
here as a float64 PyTorch composite (autograd gives d_hidden, d_weight and d_loss_weight); the
tolerance base is the same composite in the input dtype.
"""

from __future__ import annotations

import fusedops
import pytest
import torch
import torch.nn.functional as F

from tests.common.bad_input import expect_rejected
from tests.common.tolerance import assert_close, max_abs_error

OP = "chunk_loss"
BITWISE_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}

# name: (hidden shape, V, chunk_size, options)
CASES = {
    "one-row": ((1, 8), 5, None, dict(reduction="mean")),
    "sum-37-rows-chunk-8": ((37, 16), 129, 8, dict(weights=True, ignore_every=3)),
    "mean-alpha-chunk-16": ((70, 24), 1003, 16, dict(reduction="mean", alpha=2.5, ignore_every=5)),
    "everything-per-sample-alpha": ((2, 19, 12), 257, 7,
                                    dict(label_smoothing=0.1, lse_square_scale=1e-3, softcap=4.0,
                                         logit_scale=0.8, weights=True, ignore_every=4, alpha="tensor")),
    "scalar-tensor-alpha": ((3, 7, 8), 50, 5, dict(alpha="scalar-tensor", weights=True)),
    "V-32003": ((9, 8), 32003, 4, dict(reduction="mean", weights=True)),
    "all-ignored": ((6, 8), 11, 4, dict(reduction="mean", ignore_index=3, ignore_every=1, weights=True)),
    "no-rows": ((0, 8), 11, None, dict()),
    # CUDA, 16-bit: the compact default plan (16-bit logits, dW accumulated over 3 chunks).
    "compact-default": ((260, 64), 8192, None, dict(weights=True, ignore_every=7)),
    # Negative and zero per-token weights: CUDA's plain pass writes 16-bit gradients with |a| folded
    # into the exponent and the sign of a applied to the packed result.
    "signed-weights": ((23, 16), 1000, 8, dict(weights="signed", ignore_every=6)),
}


def composite(hidden, weight, labels, loss_weight=None, *, reduction="sum", alpha=None, ignore_index=-100,
              label_smoothing=0.0, lse_square_scale=0.0, softcap=None, logit_scale=1.0):
    """linear + the cross-entropy of docs/specs/ops.md 1.3 in the inputs' dtype; returns (loss, z_loss)."""
    H = hidden.shape[-1]
    z = F.linear(hidden.reshape(-1, H), weight) * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    y = labels.reshape(-1)
    valid = y != ignore_index
    lse = torch.logsumexp(z, -1)
    zy = z.gather(-1, torch.where(valid, y, 0)[:, None].long())[:, 0]
    ce = (1 - label_smoothing) * (lse - zy) + label_smoothing * (lse - z.mean(-1))
    zl = lse_square_scale * lse * lse
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    row, zl = torch.where(valid, ce + zl, zero), torch.where(valid, zl, zero)
    w = loss_weight.reshape(-1).to(z.dtype) if loss_weight is not None else 1.0
    inv = torch.ones_like(row)
    if reduction == "mean":
        inv = inv / valid.sum().clamp(min=1)
    if isinstance(alpha, torch.Tensor):
        a = alpha.to(z.dtype)
        inv = inv / (a.reshape(-1).repeat_interleave(row.numel() // a.numel()) if a.dim() else a)
    elif alpha is not None:
        inv = inv / alpha
    return (w * row * inv).sum(), (zl * inv).sum()


def make(case_name, dtype, device, seed, spread=1.0):
    shape, V, chunk, opts = CASES[case_name]
    g = torch.Generator().manual_seed(seed)
    H = shape[-1]
    hidden = (torch.randn(shape, generator=g, dtype=torch.float64) * spread).to(dtype).to(device)
    weight = (torch.randn(V, H, generator=g, dtype=torch.float64) / H ** 0.5).to(dtype).to(device)
    labels = torch.randint(0, V, shape[:-1], generator=g)
    if opts.get("ignore_every"):
        labels.view(-1)[::opts["ignore_every"]] = opts.get("ignore_index", -100)
    wdt = torch.float64 if dtype == torch.float64 else torch.float32
    if opts.get("weights") == "signed":
        weights = torch.randn(shape[:-1], generator=g, dtype=torch.float64)
        weights.view(-1)[1::4] = 0.0
        weights = weights.to(wdt).to(device)
    else:
        weights = (0.5 + torch.rand(shape[:-1], generator=g, dtype=torch.float64)).to(wdt).to(device)
    kw = {k: v for k, v in opts.items() if k not in ("weights", "ignore_every")}
    if kw.get("alpha") == "tensor":
        kw["alpha"] = torch.arange(1.5, 1.5 + shape[0], dtype=torch.float32, device=device)
    elif kw.get("alpha") == "scalar-tensor":
        kw["alpha"] = torch.tensor(3.0, device=device)
    return hidden, weight, labels.to(device), weights if opts.get("weights") else None, chunk, kw


def bitwise_equal(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    iv = BITWISE_VIEW[a.dtype]
    return torch.equal(a.detach().contiguous().view(iv), b.detach().contiguous().view(iv))


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


def grads(loss, ts, g=None):
    out = torch.autograd.grad(loss, [t for t in ts if t is not None], g, allow_unused=True)
    return [torch.zeros_like(t) if o is None else o for o, t in zip(out, [t for t in ts if t is not None])]


# An upstream gradient of 1 (the loss is the last step: the backward leaves the saved gradients as
# they are) and another value (the backward scales them).
@pytest.mark.parametrize("upstream", [1.0, 1.7])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_linear_plus_cross_entropy_in_float64(backend_case, name, upstream, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    if dt == torch.float64 and CASES[name][1] > 10000:
        pytest.skip("float64 reference loops at V = 32003 are slow; float32 covers the case")
    hidden, weight, labels, weights, chunk, kw = make(name, dt, dev, seed_of(OP, name, str(dt)))
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lw = weights.clone().requires_grad_() if weights is not None else None
    g = torch.tensor(upstream, device=dev)
    with forced(case):
        loss, z = fusedops.chunk_loss(h, w, labels, lw, chunk_size=chunk, return_z_loss=True, **kw)
        got = grads(loss, [h, w, lw], g)
    assert loss.dtype == (torch.float64 if dt == torch.float64 else torch.float32) and loss.shape == ()
    kw64 = {k: (v.cpu().double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    h64, w64 = hidden.cpu().double().requires_grad_(), weight.cpu().double().requires_grad_()
    lw64 = weights.cpu().double().requires_grad_() if weights is not None else None
    l64, z64 = composite(h64, w64, labels.cpu(), lw64, **kw64)
    ref = grads(l64, [h64, w64, lw64], g.cpu().double())
    hb, wb = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lwb = weights.clone().to(dt).requires_grad_() if weights is not None else None
    lb, zb = composite(hb, wb, labels, lwb, **kw)
    base = grads(lb, [hb, wb, lwb], g.to(lb.dtype))
    tag = f"{case.id} {name}"
    assert_close(loss, lb, l64, dt, f"{tag} loss")
    assert_close(z, zb, z64, dt, f"{tag} z_loss")
    for what, a, b, r in zip(("d_hidden", "d_weight", "d_loss_weight"), got, base, ref):
        assert_close(a, b, r, dt, f"{tag} {what}")
    assert got[0].dtype == dt and got[1].dtype == dt


# Logits of magnitude ~1e4 (spread 3000) in the cases the gradient test of large logits uses: with
# one row (or a handful) the loss is a difference of two ~1e4 logits whose fp32 base can come out
# exact by chance (base error 0, a bound of 2 ulp at 1.0), while any other fp32 product order
# differs by a part of the logits' own ulp (2.4e-4 here): the CUDA backend's one-row case measured
# 6.6e-5 on an H100 (stop 47).
LARGE_LOGIT_CASES = ("sum-37-rows-chunk-8", "everything-per-sample-alpha")


@pytest.mark.parametrize("name,spread", [(n, 1.0) for n in CASES] + [(n, 3000.0) for n in LARGE_LOGIT_CASES])
def test_loss_without_gradients_matches_float64(backend_case, name, spread, seed_of):
    """torch.no_grad: the loss and z-loss only (the CPU computes them from blocks of the logits,
    merged per row), every case and option, and logits of magnitude ~1e4."""
    case = backend_case
    dt, dev = case.dtype, case.device
    if dt == torch.float64 and CASES[name][1] > 10000:
        pytest.skip("float64 reference loops at V = 32003 are slow; float32 covers the case")
    hidden, weight, labels, weights, chunk, kw = make(name, dt, dev, seed_of(OP, "no-grad", name, str(dt)),
                                                      spread=spread)
    with forced(case), torch.no_grad():
        loss, z = fusedops.chunk_loss(hidden.clone().requires_grad_(), weight.clone().requires_grad_(), labels,
                                      weights, chunk_size=chunk, return_z_loss=True, **kw)
    assert not loss.requires_grad
    kw64 = {k: (v.cpu().double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    l64, z64 = composite(hidden.cpu().double(), weight.cpu().double(), labels.cpu(),
                         weights.cpu().double() if weights is not None else None, **kw64)
    lb, zb = composite(hidden, weight, labels, weights.to(dt) if weights is not None else None, **kw)
    tag = f"{case.id} {name} no_grad spread {spread}"
    assert_close(loss, lb, l64, dt, f"{tag} loss")
    assert_close(z, zb, z64, dt, f"{tag} z_loss")


def test_no_input_requiring_grad_is_the_no_grad_forward(backend_case, seed_of):
    """Gradient mode on but no input requiring a gradient (an evaluation loop without no_grad): the
    forward alone, as under torch.no_grad (the same bits), a loss that requires no gradient; and the
    same loss as the forward with gradients, within the gradient path's rounding."""
    case = backend_case
    dt, dev = case.dtype, case.device
    name = "everything-per-sample-alpha"
    hidden, weight, labels, weights, chunk, kw = make(name, dt, dev, seed_of(OP, "no-input-grad", str(dt)))
    with forced(case):
        loss, z = fusedops.chunk_loss(hidden, weight, labels, weights, chunk_size=chunk, return_z_loss=True, **kw)
        with torch.no_grad():
            loss_ng, z_ng = fusedops.chunk_loss(hidden, weight, labels, weights, chunk_size=chunk,
                                                return_z_loss=True, **kw)
        loss_g = fusedops.chunk_loss(hidden.clone().requires_grad_(), weight, labels, weights, chunk_size=chunk,
                                     **kw)
    assert not loss.requires_grad and not z.requires_grad and loss_g.requires_grad
    assert torch.equal(loss, loss_ng) and torch.equal(z, z_ng)
    kw64 = {k: (v.cpu().double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    l64, _ = composite(hidden.cpu().double(), weight.cpu().double(), labels.cpu(),
                       weights.cpu().double() if weights is not None else None, **kw64)
    lb, _ = composite(hidden, weight, labels, weights.to(dt) if weights is not None else None, **kw)
    assert_close(loss, lb, l64, dt, f"{case.id} {name} no input requires grad")
    assert_close(loss_g.detach(), lb, l64, dt, f"{case.id} {name} with gradients")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_large_logits_and_softcap_stay_finite(backend_case, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    for name in ("sum-37-rows-chunk-8", "everything-per-sample-alpha"):
        hidden, weight, labels, weights, chunk, kw = make(name, dt, dev, seed_of("large", name), spread=3000.0)
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with forced(case):
            loss = fusedops.chunk_loss(h, w, labels, weights, chunk_size=chunk, **kw)
            loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()
        kw64 = {k: (v.cpu().double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        l64, _ = composite(hidden.cpu().double(), weight.cpu().double(), labels.cpu(),
                           weights.cpu().double() if weights is not None else None, **kw64)
        lb, _ = composite(hidden, weight, labels, weights, **kw)
        assert_close(loss, lb, l64, dt, f"{case.id} large logits {name}")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_weight_gradient_accumulates_into_an_fp32_buffer(backend_case, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    hidden, weight, labels, weights, chunk, kw = make("sum-37-rows-chunk-8", dt, dev, seed_of("acc", str(dt)))
    buf = torch.randn(weight.shape, device=dev)
    start = buf.clone()
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with forced(case):
        loss = fusedops.chunk_loss(h, w, labels, weights, chunk_size=chunk, grad_weight_buffer=buf, **kw)
        loss.backward()
    assert w.grad is None
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with forced(case):
        loss2 = fusedops.chunk_loss(h2, w2, labels, weights, chunk_size=chunk, **kw)
        loss2.backward()
    assert bitwise_equal(loss, loss2) and bitwise_equal(h.grad, h2.grad)
    assert max_abs_error(buf - start, w2.grad.float()) <= 2e-2 * max(1.0, float(w2.grad.abs().max()))
    # The upstream gradient must be 1 (checked on the CPU and in validation mode).
    if dev == "cpu":
        loss3 = fusedops.chunk_loss(hidden.clone().requires_grad_(), weight, labels, chunk_size=chunk,
                                    grad_weight_buffer=buf)
        with pytest.raises(RuntimeError, match="upstream gradient of 1"):
            (loss3 * 2).backward()


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_repeated_runs_are_bitwise_identical(backend_case, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    hidden, weight, labels, weights, chunk, kw = make("mean-alpha-chunk-16", dt, dev, seed_of("det", str(dt)))
    runs = []
    for _ in range(2):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with forced(case):
            loss = fusedops.chunk_loss(h, w, labels, weights, chunk_size=chunk, **kw)
            (loss * 0.5).backward()
        runs.append((loss, h.grad, w.grad))
    for a, b in zip(*runs):
        assert bitwise_equal(a, b)


def test_default_chunk_size_and_memory_budget(device):
    hidden, weight, labels, weights, _, kw = make("mean-alpha-chunk-16", torch.float32, device, 4)
    losses = [fusedops.chunk_loss(hidden, weight, labels, memory_budget=mb, **kw) for mb in (None, 8 * 1003 * 4, 1)]
    for loss in losses[1:]:
        assert max_abs_error(loss, losses[0]) <= 1e-5 * max(1.0, float(losses[0].abs()))


def test_module_matches_function(device):
    hidden, weight, labels, weights, chunk, kw = make("sum-37-rows-chunk-8", torch.float32, device, 8)
    mod = fusedops.nn.ChunkLoss(chunk_size=chunk, label_smoothing=0.05)
    assert bitwise_equal(mod(hidden, weight, labels, weights),
                         fusedops.chunk_loss(hidden, weight, labels, weights, chunk_size=chunk, label_smoothing=0.05))


def test_reference_matches_own_float64_composite(seed_of):
    hidden, weight, labels, weights, _, kw = make("everything-per-sample-alpha", torch.float64, "cpu", 3)
    kw = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lw = weights.double().requires_grad_()
    loss, z = fusedops.reference.chunk_loss(h, w, labels, lw, return_z_loss=True, **kw)
    h2, w2, lw2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_(), weights.double().requires_grad_()
    l2, z2 = composite(h2, w2, labels, lw2, **kw)
    assert max_abs_error(loss, l2) <= 1e-12 * max(1.0, float(l2.detach().abs()))
    assert max_abs_error(z, z2) <= 1e-12
    for a, b in zip(grads(loss, [h, w, lw]), grads(l2, [h2, w2, lw2])):
        assert max_abs_error(a, b) <= 1e-12


# An upstream gradient of 1 skips the in-place scaling on the CPU (cross_entropy._unit_upstream)
# and must raise all the same; 2 takes the in-place call.
@pytest.mark.parametrize("upstream", [1.0, 2.0])
def test_second_backward_through_the_same_call_raises(device, upstream):
    hidden, weight, labels, _, chunk, kw = make("one-row", torch.float32, device, 1)
    loss = fusedops.chunk_loss(hidden.requires_grad_(), weight, labels, **kw)
    loss.backward(torch.tensor(upstream, device=device), retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_opcheck(device):
    hidden, weight, labels, weights, _, _ = make("sum-37-rows-chunk-8", torch.float32, device, 2)
    hidden.requires_grad_()
    weight.requires_grad_()
    args = (hidden, weight, None, labels, weights, 1.0, None, -100, "sum", 0.1, 1.0, 4.0, 1e-3, 8, 0,
            True, True, True, False)
    torch.library.opcheck(torch.ops.fusedops.chunk_loss_fwd.default, args)
    g = torch.tensor(0.5, device=device)
    torch.library.opcheck(torch.ops.fusedops.chunk_loss_bwd.default,
                          (g, torch.randn(5, 4, device=device), torch.randn(7, 4, device=device),
                           torch.randn(5, device=device), torch.float32))


def _loss_fn(h, w, labels, lw):
    return fusedops.chunk_loss(h * 1.5, w, labels, lw, chunk_size=5, label_smoothing=0.1, softcap=10.0) * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_compile_fullgraph_matches_eager(device, dtype):
    torch._dynamo.reset()
    hidden, weight, labels, weights, _, _ = make("sum-37-rows-chunk-8", dtype, device, 6)
    he, hc = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    we, wc = weight.clone().requires_grad_(), weight.clone().requires_grad_()
    le = _loss_fn(he, we, labels, weights)
    le.backward()
    lc = torch.compile(_loss_fn, fullgraph=True, backend="aot_eager")(hc, wc, labels, weights)
    lc.backward()
    assert bitwise_equal(lc, le) and bitwise_equal(hc.grad, he.grad) and bitwise_equal(wc.grad, we.grad)


def test_bad_arguments_raise(device):
    hidden, weight, labels, _, _, _ = make("sum-37-rows-chunk-8", torch.float32, device, 1)
    with pytest.raises(ValueError, match="a bias is not supported"):
        fusedops.chunk_loss(hidden, weight, labels, bias=torch.zeros(weight.shape[0], device=device))
    with pytest.raises(ValueError, match="reduction must be 'sum' or 'mean'"):
        fusedops.chunk_loss(hidden, weight, labels, reduction="none")
    with pytest.raises(ValueError, match="weight must have shape \\[V, H\\] with V >= 1 and H = 16"):
        fusedops.chunk_loss(hidden, weight[:, :15], labels)
    with pytest.raises(ValueError, match="labels must have shape \\[37\\]"):
        fusedops.chunk_loss(hidden, weight, labels[:36])
    with pytest.raises(ValueError, match="chunk_size must be > 0"):
        fusedops.chunk_loss(hidden, weight, labels, chunk_size=0)
    with pytest.raises(ValueError, match="alpha must be a finite nonzero number"):
        fusedops.chunk_loss(hidden, weight, labels, alpha=0.0)
    with pytest.raises(ValueError, match="alpha must be a scalar or have shape \\[B\\]"):
        fusedops.chunk_loss(hidden, weight, labels, alpha=torch.ones(3, device=device))
    with pytest.raises(TypeError, match="weight must have the dtype of hidden"):
        fusedops.chunk_loss(hidden, weight.double(), labels)
    h3, w3, l3, _, _, _ = make("everything-per-sample-alpha", torch.float32, device, 1)
    with fusedops.debug_checks(), pytest.raises(ValueError, match="alpha\\[1\\] must be a finite nonzero number, got 0"):
        fusedops.chunk_loss(h3, w3, l3, alpha=torch.tensor([1.0, 0.0], device=device))


@pytest.mark.parametrize("bad", [129, -5])
def test_out_of_range_labels_raise_on_cpu_and_are_nan_and_reported_on_cuda(device, bad):
    hidden = torch.randn(5, 16, device=device)
    weight = torch.randn(129, 16, device=device)
    labels = torch.tensor([3, 0, bad, 128, -100], device=device)
    loss = expect_rejected(device, lambda: fusedops.chunk_loss(hidden, weight, labels),
                           f"chunk_loss: labels[2] = {bad} is outside [0, 129) and is not ignore_index",
                           f"chunk_loss: labels[2] = {bad} is outside [0, V) and is not ignore_index")
    if loss is not None:
        assert torch.isnan(loss)


def test_cuda_graph_capture_matches_eager():
    """Every chunk (three cuBLASLt GEMMs and the cross-entropy pass) replays from a CUDA graph."""
    if not torch.cuda.is_available() or not fusedops.built_with_cuda():
        pytest.skip("needs a CUDA device and a CUDA build")
    hidden, weight, labels, weights, _, _ = make("mean-alpha-chunk-16", torch.bfloat16, "cuda", 5)
    op = torch.ops.fusedops.chunk_loss_fwd.default
    args = (hidden, weight, None, labels, weights, 2.5, None, -100, "mean", 0.0, 1.0, None, 0.0, 16, 0,
            False, True, True, False)
    eager = op(*args)  # also the warm-up: cuBLASLt picks and caches its algorithms here
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(*args)
    graph.replay()
    torch.cuda.synchronize()
    for i in (0, 2, 3):
        assert bitwise_equal(eager[i], captured[i])
