"""hc_split_sinkhorn (docs/specs/ops.md 3.4) and its head variant through the torch layer.

Every registered backend is forced in turn and compared with a float64 PyTorch composite of the
spec written here (autograd gives the gradients of mixes, hc_scale and hc_base); the tolerance
base is the same composite in fp32 with outputs cast to mixes' dtype.
"""

from __future__ import annotations

import fusedops
import pytest
import torch

from tests.common.tolerance import assert_close, floor_for, max_abs_error, report, rms_relative_error

OP = "hc_split_sinkhorn"
EPS = 1e-6
VARIANTS = ["mindspeed", "deepseek", "log"]


def sinkhorn_composite(L, num_iters, eps, variant):
    """docs/specs/ops.md 3.2 in plain PyTorch (as in test_sinkhorn.py), in L's dtype."""
    if variant == "log":
        f = torch.zeros(L.shape[:-1], dtype=L.dtype, device=L.device)
        g = torch.zeros_like(f)
        for _ in range(num_iters):
            f = -torch.logsumexp(L + g.unsqueeze(-2), dim=-1)
            g = -torch.logsumexp(L + f.unsqueeze(-1), dim=-2)
        return torch.exp(f.unsqueeze(-1) + L + g.unsqueeze(-2))
    if variant == "mindspeed":
        K = torch.exp(L - L.amax(-1, keepdim=True).detach())
        steps = num_iters
    else:
        K = torch.softmax(L, dim=-1) + eps
        K = K / (K.sum(-2, keepdim=True) + eps)
        steps = num_iters - 1
    for _ in range(steps):
        K = K / (K.sum(-1, keepdim=True) + eps)
        K = K / (K.sum(-2, keepdim=True) + eps)
    return K


def composite(mixes, hc_scale, hc_base, n, iters=20, eps=EPS, variant="mindspeed"):
    """docs/specs/ops.md 3.4 in plain PyTorch, in the dtype of its inputs."""
    # hc_scale [3] and hc_base [(2+n)n], or one copy per row ([..., 3], [..., (2+n)n]).
    pre = torch.sigmoid(hc_scale[..., 0:1] * mixes[..., :n] + hc_base[..., :n]) + eps
    post = 2 * torch.sigmoid(hc_scale[..., 1:2] * mixes[..., n:2 * n] + hc_base[..., n:2 * n])
    logits = (hc_scale[..., 2:3] * mixes[..., 2 * n:] + hc_base[..., 2 * n:]).unflatten(-1, (n, n))
    return pre, post, sinkhorn_composite(logits, iters, eps, variant)


def base_composite(mixes, hc_scale, hc_base, *args):
    outs = composite(mixes.float(), hc_scale.float(), hc_base.float(), *args)
    return tuple(o.to(mixes.dtype) for o in outs)


def params(n, device, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.8, 1.1, 1.3], dtype=torch.float64) + 0.1 * torch.randn(3, generator=g, dtype=torch.float64)
    base = 0.5 * torch.randn((2 + n) * n, generator=g, dtype=torch.float64)
    return scale.float().to(device), base.float().to(device)


def grads(outs, inputs, gs):
    pairs = [(o, g) for o, g in zip(outs, gs) if g is not None]
    return torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)


def reduction_scale(mixes64, scale64, base64, n, iters, variant, gs):
    """sum over rows of |per-row parameter gradient|, float64: the magnitude of the reduction."""
    lead = mixes64.shape[:-1]
    s_rows = scale64.detach().expand(*lead, 3).clone().requires_grad_()
    b_rows = base64.detach().expand(*lead, base64.shape[-1]).clone().requires_grad_()
    outs = composite(mixes64.detach(), s_rows, b_rows, n, iters, EPS, variant)
    ds, db = grads(outs, (s_rows, b_rows), [None if g is None else g.cpu().double() for g in gs])

    def flat(t, k):
        return torch.zeros(k, dtype=torch.float64) if t is None else t.abs().reshape(-1, k).sum(0)

    return flat(ds, 3), flat(db, base64.shape[-1])


def check_reduction(ours, base, ref, abs_terms, name):
    """The parameter gradients are sums over rows of per-row gradients whose elementwise accuracy
    the policy checks through dmixes; their error is a random walk of those elementwise errors
    (the plain composite's as much as ours). They are held to the policy with the floor applied
    to the magnitude of the reduction, sum |terms|, instead of max |result|."""
    err, base_err = max_abs_error(ours, ref), max_abs_error(base, ref)
    tol = 2 * base_err + floor_for(torch.float32) * max(1.0, float(abs_terms.max()) if abs_terms.numel() else 1.0)
    report(name, err, base_err, rms_relative_error(ours, ref), tol)
    assert err <= tol, f"{name}: max-abs err {err:.3e} vs tolerance {tol:.3e} (base err {base_err:.3e})"


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


def run_and_check(case, lead, n, iters, variant, seed, fresh_normal, use=(True, True, True), mixes=None):
    dt, dev = case.dtype, case.device
    w = (2 + n) * n
    if mixes is None:
        mixes = fresh_normal(lead + (w,), dt, dev, seed)
    mixes = mixes.detach().requires_grad_()
    scale, base = params(n, dev, seed + 1)
    scale.requires_grad_()
    base.requires_grad_()
    gs = [fresh_normal(lead + (n,), dt, dev, seed + 2), fresh_normal(lead + (n,), dt, dev, seed + 3),
          fresh_normal(lead + (n, n), dt, dev, seed + 4)]
    gs = [g if u else None for g, u in zip(gs, use)]
    with forced(case):
        outs = fusedops.hc_split_sinkhorn(mixes, scale, base, n, iters, EPS, variant=variant)
        got = grads(outs, (mixes, scale, base), gs)
    for o, shape in zip(outs, (lead + (n,), lead + (n,), lead + (n, n))):
        assert o.dtype == dt and tuple(o.shape) == shape and o.device.type == dev
    ins64 = [t.detach().cpu().double().requires_grad_() for t in (mixes, scale, base)]
    outs64 = composite(*ins64, n, iters, EPS, variant)
    insb = [t.detach().clone().requires_grad_() for t in (mixes, scale, base)]
    outsb = base_composite(*insb, n, iters, EPS, variant)
    name = f"{case.id} {lead} n={n} {variant} T={iters}"
    for label, o, ob, o64 in zip(("pre", "post", "comb"), outs, outsb, outs64):
        assert_close(o, ob, o64, dt, f"{name} {label}")
    want = grads(outs64, ins64, [None if g is None else g.cpu().double() for g in gs])
    base_g = grads(outsb, insb, gs)
    got = [torch.zeros_like(t) if a is None else a for a, t in zip(got, (mixes, scale, base))]
    want = [torch.zeros_like(t) if r is None else r for r, t in zip(want, ins64)]
    base_g = [torch.zeros_like(t) if b is None else b for b, t in zip(base_g, insb)]
    assert_close(got[0], base_g[0], want[0], dt, f"{name} dmixes")
    abs_s, abs_b = reduction_scale(*ins64, n, iters, variant, gs)
    check_reduction(got[1], base_g[1], want[1], abs_s, f"{name} dhc_scale")
    check_reduction(got[2], base_g[2], want[2], abs_b, f"{name} dhc_base")
    if dt == torch.float32:
        # The two-stage reduction itself: dz = dmixes / a (exact to one rounding) summed in
        # float64 must give the parameter gradients up to fp32 summation error.
        dm = got[0].detach().cpu().double().reshape(-1, (2 + n) * n)
        m64 = mixes.detach().cpu().double().reshape(-1, (2 + n) * n)
        a = torch.cat([scale.detach().cpu().double()[i].expand(k) for i, k in ((0, n), (1, n), (2, n * n))])
        dz = dm / a
        terms = dz * m64
        parts = [slice(0, n), slice(n, 2 * n), slice(2 * n, None)]
        s_sum = torch.stack([terms[:, p].sum() for p in parts])
        s_abs = torch.stack([terms[:, p].abs().sum() for p in parts])
        u = 2.0 ** -24
        assert ((got[1].cpu().double() - s_sum).abs() <= 128 * u * s_abs + 1e-30).all(), "dhc_scale != sum of rows"
        assert ((got[2].cpu().double() - dz.sum(0)).abs() <= 128 * u * dz.abs().sum(0) + 1e-30).all(), \
            "dhc_base != sum of rows"


@pytest.mark.dtypes(torch.float32, torch.bfloat16, torch.float16)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [1, 4, 6, 16])
def test_matches_float64(backend_case, n, variant, fresh_normal, seed_of):
    run_and_check(backend_case, (3, 15), n, 20, variant, seed_of(OP, n, variant, str(backend_case.dtype)),
                  fresh_normal)


@pytest.mark.dtypes(torch.float32)
@pytest.mark.parametrize("variant", VARIANTS)
def test_one_iteration_many_rows_and_unused_outputs(backend_case, variant, fresh_normal, seed_of):
    run_and_check(backend_case, (7,), 4, 1, variant, seed_of("T1", variant), fresh_normal)
    run_and_check(backend_case, (301,), 4, 20, variant, seed_of("rows", variant), fresh_normal)
    run_and_check(backend_case, (21,), 4, 20, variant, seed_of("comb", variant), fresh_normal,
                  use=(False, False, True))
    run_and_check(backend_case, (21,), 4, 20, variant, seed_of("pre", variant), fresh_normal,
                  use=(True, False, False))


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_strided_mixes(backend_case, fresh_normal):
    case = backend_case
    wide = fresh_normal((2, 9, 30), case.dtype, case.device, 77)
    run_and_check(case, (2, 9), 4, 20, "mindspeed", 78, fresh_normal, mixes=wide[..., 3:27])


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("n", [4, 6])
def test_gradients_as_column_slices_of_one_tensor(backend_case, n, fresh_normal):
    """Autograd hands the backward column slices of one [tokens, (2+n)n] gradient as often as
    separate tensors: the kernels read them in place and must give the same bits."""
    case = backend_case
    w = (2 + n) * n
    mixes = fresh_normal((37, w), case.dtype, case.device, 90)
    scale, base = params(n, case.device, 91)
    dy = fresh_normal((37, w + 3), case.dtype, case.device, 92)
    sliced = (dy[:, :n], dy[:, n:2 * n], dy[:, 2 * n:w].unflatten(-1, (n, n)))
    assert not sliced[2].is_contiguous()
    results = []
    for gs in (sliced, tuple(g.contiguous() for g in sliced)):
        ins = [mixes.detach().requires_grad_(), scale.detach().requires_grad_(), base.detach().requires_grad_()]
        with forced(case):
            outs = fusedops.hc_split_sinkhorn(*ins, n, 20, EPS)
            results.append(torch.autograd.grad(outs, ins, gs))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_reference_matches_own_float64_composite(seed_of):
    g = torch.Generator().manual_seed(seed_of("ref-split"))
    n = 4
    mixes = torch.randn(5, 24, generator=g, dtype=torch.float64, requires_grad=True)
    scale = torch.tensor([0.7, 0.9, 1.2], dtype=torch.float64, requires_grad=True)
    base = (0.3 * torch.randn(24, generator=g, dtype=torch.float64)).requires_grad_()
    outs = fusedops.reference.hc_split_sinkhorn(mixes, scale, base, n)
    want = composite(mixes, scale, base, n)
    gs = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in want]
    for o, w in zip(outs, want):
        assert max_abs_error(o, w) <= 1e-12
    for a, b in zip(grads(outs, (mixes, scale, base), gs), grads(want, (mixes, scale, base), gs)):
        assert max_abs_error(a, b) <= 1e-11


def test_empty_rows_give_zero_parameter_gradients(device):
    mixes = torch.randn(0, 24, device=device, requires_grad=True)
    scale = torch.tensor([0.5, 0.5, 0.5], device=device, requires_grad=True)
    base = torch.randn(24, device=device, requires_grad=True)
    pre, post, comb = fusedops.hc_split_sinkhorn(mixes, scale, base)
    assert pre.shape == (0, 4) and comb.shape == (0, 4, 4)
    (pre.sum() + post.sum() + comb.sum()).backward()
    assert torch.equal(scale.grad, torch.zeros(3, device=device))
    assert torch.equal(base.grad, torch.zeros(24, device=device))


def test_parameter_gradients_are_bitwise_reproducible(device):
    mixes = torch.randn(1031, 24, device=device)
    scale = torch.tensor([0.5, 0.6, 0.7], device=device)
    base = torch.randn(24, device=device)
    g = torch.randn(1031, 4, 4, device=device)
    runs = []
    for _ in range(3):
        s, b = scale.clone().requires_grad_(), base.clone().requires_grad_()
        (fusedops.hc_split_sinkhorn(mixes, s, b)[2] * g).sum().backward()
        runs.append(torch.cat([s.grad, b.grad]))
    assert all(torch.equal(runs[0].view(torch.int32), r.view(torch.int32)) for r in runs[1:])


def test_bf16_parameters_get_bf16_gradients(device):
    mixes = torch.randn(6, 24, device=device)
    scale = torch.tensor([0.5, 0.6, 0.7], device=device, dtype=torch.bfloat16, requires_grad=True)
    base = torch.randn(24, device=device, dtype=torch.bfloat16, requires_grad=True)
    sum(o.sum() for o in fusedops.hc_split_sinkhorn(mixes, scale, base)).backward()
    assert scale.grad.dtype == torch.bfloat16 and base.grad.dtype == torch.bfloat16


def test_opcheck(device):
    mixes = torch.randn(5, 24, device=device, requires_grad=True)
    scale = torch.tensor([0.5, 0.6, 0.7], device=device, requires_grad=True)
    base = torch.randn(24, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.fusedops.hc_split_sinkhorn_fwd.default,
                          (mixes, scale, base, 4, 3, EPS, "mindspeed"))
    gs = (torch.randn(5, 4, device=device), None, torch.randn(5, 4, 4, device=device))
    torch.library.opcheck(torch.ops.fusedops.hc_split_sinkhorn_bwd.default,
                          (mixes.detach(), scale.detach(), base.detach(), *gs, 4, 3, EPS, "deepseek"))


def test_torch_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()

    def f(m, s, b, g):
        pre, post, comb = fusedops.hc_split_sinkhorn(m, s, b, 4, 5)
        return (pre * g[..., :4]).sum() + (post * g[..., 4:8]).sum() + (comb.flatten(-2) * g[..., 8:]).sum()

    m = torch.randn(9, 24, device=device)
    s = torch.tensor([0.5, 0.6, 0.7], device=device)
    b = torch.randn(24, device=device)
    g = torch.randn(9, 24, device=device)
    ins_e = [t.clone().requires_grad_() for t in (m, s, b)]
    ins_c = [t.clone().requires_grad_() for t in (m, s, b)]
    f(*ins_e, g).backward()
    torch.compile(f, fullgraph=True, backend="aot_eager")(*ins_c, g).backward()
    for a, c in zip(ins_e, ins_c):
        assert torch.equal(a.grad, c.grad)


def test_head_variant_matches_composite(device):
    mixes = torch.randn(3, 5, 4, device=device, requires_grad=True)
    scale = torch.tensor([0.7], device=device, requires_grad=True)
    base = torch.randn(4, device=device, requires_grad=True)
    pre = fusedops.hc_head_split(mixes, scale, base)
    want = torch.sigmoid(scale * mixes + base) + EPS
    torch.testing.assert_close(pre, want)
    with pytest.raises(ValueError, match=r"hc_scale must have shape \[1\]"):
        fusedops.hc_head_split(mixes, torch.ones(3, device=device), base)
    with pytest.raises(ValueError, match=r"hc_base must have shape \[n\] = \[4\]"):
        fusedops.hc_head_split(mixes, scale, torch.ones(5, device=device))


def test_errors(device):
    m = torch.randn(5, 24, device=device)
    s = torch.ones(3, device=device)
    b = torch.zeros(24, device=device)
    with pytest.raises(ValueError, match=r"mixes must have last dim \(2\+n\)\*n = 24 for hc_mult 4, got shape \[5,23\]"):
        fusedops.hc_split_sinkhorn(m[:, :23], s, b)
    with pytest.raises(ValueError, match=r"hc_scale must have shape \[3\]"):
        fusedops.hc_split_sinkhorn(m, torch.ones(2, device=device), b)
    with pytest.raises(ValueError, match=r"hc_base must have shape \[24\]"):
        fusedops.hc_split_sinkhorn(m, s, torch.zeros(20, device=device))
    with pytest.raises(ValueError, match=r"hc_mult = 17 is outside the supported range \[1, 16\]"):
        fusedops.hc_split_sinkhorn(torch.randn(2, 19 * 17, device=device), s, torch.zeros(19 * 17, device=device), 17)
    with pytest.raises(ValueError, match="sinkhorn_iters must be >= 1, got 0"):
        fusedops.hc_split_sinkhorn(m, s, b, 4, 0)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        fusedops.hc_split_sinkhorn(m, s, b, 4, 20, -1.0)
    with pytest.raises(ValueError, match='variant must be one of "mindspeed", "deepseek", "log", got "x"'):
        fusedops.hc_split_sinkhorn(m, s, b, variant="x")
