"""sinkhorn (docs/specs/ops.md 3.2 - 3.3) through the torch layer.

Every registered backend is forced in turn (``backend_case``) and compared, forward and backward,
with a float64 PyTorch composite of the spec written here (the oracle, differentiated by
torch.autograd through the unrolled iterations); the tolerance base is the same composite run
in fp32 (the spec computes Sinkhorn in fp32) with the output cast to the input dtype.
"""

from __future__ import annotations

import fusedops
import pytest
import torch

from tests.common.tolerance import assert_close, max_abs_error

OP = "sinkhorn"
EPS = 1e-6
VARIANTS = ["mindspeed", "deepseek", "log"]
BITWISE_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}


def composite(logits: torch.Tensor, num_iters: int = 20, eps: float = EPS, variant: str = "mindspeed"):
    """docs/specs/ops.md 3.2 in plain PyTorch, in logits' dtype (rowmax detached: a constant)."""
    L = logits
    if variant == "log":
        f = torch.zeros(L.shape[:-1], dtype=L.dtype, device=L.device)
        g = torch.zeros_like(f)
        for _ in range(num_iters):
            f = -torch.logsumexp(L + g.unsqueeze(-2), dim=-1)
            g = -torch.logsumexp(L + f.unsqueeze(-1), dim=-2)
        return torch.exp(f.unsqueeze(-1) + L + g.unsqueeze(-2))
    if variant == "mindspeed":
        K = torch.exp(L - L.amax(-1, keepdim=True).detach())
        for _ in range(num_iters):
            K = K / (K.sum(-1, keepdim=True) + eps)
            K = K / (K.sum(-2, keepdim=True) + eps)
        return K
    K = torch.softmax(L, dim=-1) + eps
    K = K / (K.sum(-2, keepdim=True) + eps)
    for _ in range(num_iters - 1):
        K = K / (K.sum(-1, keepdim=True) + eps)
        K = K / (K.sum(-2, keepdim=True) + eps)
    return K


def base_composite(logits, *args):
    """The precision policy's base: the composite in fp32, cast back to the input dtype."""
    return composite(logits.float(), *args).to(logits.dtype)


def grad_of(out, inp, g):
    (d,) = torch.autograd.grad(out, inp, g)
    return d


def bitwise_equal(a, b):
    iv = BITWISE_VIEW[a.dtype]
    return a.shape == b.shape and torch.equal(a.contiguous().view(iv), b.contiguous().view(iv))


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


def run_and_check(case, shape, num_iters, variant, seed, fresh_normal, std=1.5):
    dt, dev = case.dtype, case.device
    L = fresh_normal(shape, dt, dev, seed, mean=0.2, std=std).requires_grad_()
    g = fresh_normal(shape, dt, dev, seed + 1)
    with forced(case):
        P = fusedops.sinkhorn(L, num_iters, EPS, variant)
        dL = grad_of(P, L, g)
    assert P.dtype == dt and P.shape == L.shape and P.device.type == dev
    L64 = L.detach().cpu().double().requires_grad_()
    P64 = composite(L64, num_iters, EPS, variant)
    Lb = L.detach().clone().requires_grad_()
    Pb = base_composite(Lb, num_iters, EPS, variant)
    name = f"{case.id} {shape} {variant} T={num_iters}"
    assert_close(P, Pb, P64, dt, f"{name} P")
    assert_close(dL, grad_of(Pb, Lb, g), grad_of(P64, L64, g.cpu().double()), dt, f"{name} dlogits")


@pytest.mark.dtypes(torch.float32, torch.bfloat16, torch.float16)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 16])
def test_forward_and_gradient_match_float64(backend_case, n, variant, fresh_normal, seed_of):
    run_and_check(backend_case, (3, 5, n, n), 20, variant, seed_of(OP, n, variant, str(backend_case.dtype)),
                  fresh_normal)


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_iters", [1, 2, 100])
def test_iteration_counts(backend_case, num_iters, variant, fresh_normal, seed_of):
    # 1 (the spec's must-cover case), and more than one CUDA history segment (24 / 48).
    run_and_check(backend_case, (33, 4, 4), num_iters, variant, seed_of("T", num_iters, variant), fresh_normal)


@pytest.mark.dtypes(torch.float32)
@pytest.mark.parametrize("variant", VARIANTS)
def test_many_matrices_and_wide_logits(backend_case, variant, fresh_normal, seed_of):
    run_and_check(backend_case, (1000, 4, 4), 20, variant, seed_of("many", variant), fresh_normal)
    run_and_check(backend_case, (9, 4, 4), 20, variant, seed_of("wide", variant), fresh_normal, std=10.0)


@pytest.mark.dtypes(torch.float32)
@pytest.mark.parametrize("n", [4, 5])
def test_deepseek_without_eps_where_the_softmax_underflows(backend_case, n, seed_of):
    # eps = 0 and logits 120 below their row's diagonal: those softmax entries are exactly 0 in
    # fp32, so K0 = S has zeros. The backward forms dK0 = (dP_0 * K0) / K0 (n = 4 kernels and the
    # CPU): an exact zero must give no gradient (as S * (...) does), not 0 / 0.
    case = backend_case
    g = torch.Generator().manual_seed(seed_of("underflow", n))
    L = torch.randn(6, n, n, generator=g, dtype=torch.float64)
    far = torch.rand(6, n, n, generator=g) < 0.5
    L = torch.where(far, torch.full_like(L, -120.0), L)
    L = L - torch.diag_embed(torch.diagonal(L, dim1=-2, dim2=-1))  # diagonal 0: no column all zero
    dP = torch.randn(6, n, n, generator=g, dtype=torch.float64)
    x = L.float().to(case.device).requires_grad_()
    with forced(case):
        P = fusedops.sinkhorn(x, 20, 0.0, "deepseek")
        dL = grad_of(P, x, dP.float().to(case.device))
    L64 = L.clone().requires_grad_()
    P64 = composite(L64, 20, 0.0, "deepseek")
    Lb = L.float().requires_grad_()
    Pb = composite(Lb, 20, 0.0, "deepseek")
    assert torch.isfinite(P).all() and torch.isfinite(dL).all()
    assert_close(P, Pb, P64, torch.float32, f"{case.id} n={n} P")
    assert_close(dL, grad_of(Pb, Lb, dP.float()), grad_of(P64, L64, dP), torch.float32, f"{case.id} n={n} dlogits")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_matches_own_float64_composite(variant, dtype, seed_of):
    g = torch.Generator().manual_seed(seed_of("ref", variant, str(dtype)))
    L = (torch.randn(6, 4, 4, generator=g, dtype=torch.float64) * 1.3).to(dtype).requires_grad_()
    dP = torch.randn(6, 4, 4, generator=g, dtype=torch.float64)
    P = fusedops.reference.sinkhorn(L, 20, EPS, variant)
    L64 = L.detach().double().requires_grad_()
    want = composite(L64, 20, EPS, variant)
    assert P.dtype == torch.float64
    assert max_abs_error(P, want) <= 1e-12
    assert max_abs_error(grad_of(P, L, dP.to(P.dtype)), grad_of(want, L64, dP)) <= (1e-12 if dtype == torch.float64 else 1e-6)


def test_empty_batches(device):
    for shape in [(0, 4, 4), (3, 0, 0), (2, 0, 5, 5)]:
        L = torch.randn(shape, device=device, requires_grad=True)
        P = fusedops.sinkhorn(L)
        assert P.shape == L.shape
        P.sum().backward()
        assert L.grad.shape == L.shape


@pytest.mark.dtypes(torch.float32)
def test_non_contiguous_logits(backend_case, fresh_normal):
    case = backend_case
    L = fresh_normal((4, 3, 4, 4), case.dtype, case.device, 5).transpose(-1, -2).requires_grad_()
    assert not L.is_contiguous()
    g = fresh_normal(L.shape, case.dtype, case.device, 6)
    with forced(case):
        P = fusedops.sinkhorn(L)
        dL = grad_of(P, L, g)
    L64 = L.detach().cpu().double().requires_grad_()
    P64 = composite(L64)
    Lb = L.detach().clone().requires_grad_()
    Pb = base_composite(Lb)
    assert_close(P, Pb, P64, case.dtype, "non-contiguous P")
    assert_close(dL, grad_of(Pb, Lb, g), grad_of(P64, L64, g.cpu().double()), case.dtype, "non-contiguous dL")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_repeated_runs_are_bitwise_identical(backend_case, fresh_normal):
    case = backend_case
    L = fresh_normal((257, 6, 6), case.dtype, case.device, 9)
    g = fresh_normal(L.shape, case.dtype, case.device, 10)
    runs = []
    for _ in range(2):
        Li = L.clone().requires_grad_()
        with forced(case):
            P = fusedops.sinkhorn(Li, 20, EPS, "deepseek")
            runs.append((P, grad_of(P, Li, g)))
    assert bitwise_equal(runs[0][0], runs[1][0]) and bitwise_equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("variant", VARIANTS)
def test_opcheck(device, variant):
    L = torch.randn(5, 4, 4, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.fusedops.sinkhorn_fwd.default, (L, 3, EPS, variant))
    torch.library.opcheck(torch.ops.fusedops.sinkhorn_bwd.default,
                          (L.detach(), torch.randn(5, 4, 4, device=device), 3, EPS, variant))


def test_torch_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()

    def f(L, g):
        return (fusedops.sinkhorn(L, 5) * g).sum()

    L = torch.randn(7, 4, 4, device=device)
    g = torch.randn(7, 4, 4, device=device)
    Le, Lc = L.clone().requires_grad_(), L.clone().requires_grad_()
    f(Le, g).backward()
    torch.compile(f, fullgraph=True, backend="aot_eager")(Lc, g).backward()
    assert bitwise_equal(Le.grad, Lc.grad)


def test_errors(device):
    L = torch.randn(2, 4, 4, device=device)
    with pytest.raises(ValueError, match=r"square last two dims \[..., n, n\], got \[2,4,3\]"):
        fusedops.sinkhorn(torch.randn(2, 4, 3, device=device))
    with pytest.raises(ValueError, match="n = 17 is above the supported maximum of 16"):
        fusedops.sinkhorn(torch.randn(1, 17, 17, device=device))
    with pytest.raises(ValueError, match="num_iters must be >= 1, got 0"):
        fusedops.sinkhorn(L, 0)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        fusedops.sinkhorn(L, 20, -1e-3)
    with pytest.raises(ValueError, match='variant must be one of "mindspeed", "deepseek", "log", got "knopp"'):
        fusedops.sinkhorn(L, variant="knopp")
    with pytest.raises(ValueError, match="rank >= 2"):
        fusedops.sinkhorn(torch.randn(4, device=device))
    with pytest.raises(TypeError, match="int32"):
        fusedops.sinkhorn(torch.ones(2, 4, 4, dtype=torch.int32, device=device))
