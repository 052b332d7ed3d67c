"""mhc_post (docs/specs/ops.md 9.3) and its MindSpeed-LLM argument-order alias through the torch layer.

Every registered backend is forced in turn and compared, forward and all four gradients, with a
float64 PyTorch composite written here (DeepSeek-V4's hc_post formula; torch.autograd for the
gradients); the tolerance base is the plain composite on the inputs as given (bf16 streams times
fp32 coefficients promote to fp32) cast back to x's dtype, as DeepSeek's code does.
"""

from __future__ import annotations

import fusedops
import pytest
import torch

from tests.common.tolerance import assert_close, max_abs_error

OP = "mhc_post"
SHAPES = [(1, 4, 1), (3, 4, 7), (2, 3, 4, 64), (5, 1, 8), (4, 2, 33), (3, 3, 16), (2, 5, 40),
          (6, 8, 24), (2, 16, 8), (2, 6, 4, 56)]


def composite(x, h_res, h_out, h_post):
    y = h_post.unsqueeze(-1) * h_out.unsqueeze(-2) + torch.sum(h_res.unsqueeze(-1) * x.unsqueeze(-2), dim=-3)
    return y.to(x.dtype)


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


def make(shape, dt, dev, seed, fresh_normal):
    cdt = torch.float64 if dt == torch.float64 else torch.float32
    lead, n, C = tuple(shape[:-2]), shape[-2], shape[-1]
    x = fresh_normal(shape, dt, dev, seed, mean=0.1, std=1.1)
    h_res = fresh_normal(lead + (n, n), cdt, dev, seed + 1, mean=0.2, std=0.6)
    h_out = fresh_normal(lead + (C,), dt, dev, seed + 2, mean=-0.2)
    h_post = fresh_normal(lead + (n,), cdt, dev, seed + 3, mean=1.0, std=0.5)
    return [x, h_res, h_out, h_post]


def run_and_check(case, shape, seed, fresh_normal, inputs=None):
    dt, dev = case.dtype, case.device
    inputs = make(shape, dt, dev, seed, fresh_normal) if inputs is None else inputs
    ins = [t.detach().requires_grad_() for t in inputs]
    g = fresh_normal(shape, dt, dev, seed + 4)
    with forced(case):
        out = fusedops.mhc_post(*ins)
        got = torch.autograd.grad(out, ins, g)
    assert out.dtype == dt and tuple(out.shape) == tuple(shape) and out.device.type == dev
    for a, t in zip(got, ins):
        assert a.dtype == t.dtype and a.shape == t.shape
    ins64 = [t.detach().cpu().double().requires_grad_() for t in ins]
    out64 = composite(*ins64)
    insb = [t.detach().clone().requires_grad_() for t in ins]
    outb = composite(*insb)
    name = f"{case.id} {tuple(shape)}"
    assert_close(out, outb, out64, dt, f"{name} out")
    want = torch.autograd.grad(out64, ins64, g.cpu().double())
    base = torch.autograd.grad(outb, insb, g)
    for label, a, b, r, t in zip(("dx", "dh_res", "dh_out", "dh_post"), got, base, want, ins):
        assert_close(a, b, r, t.dtype, f"{name} {label}")


@pytest.mark.dtypes(torch.float32, torch.bfloat16, torch.float16)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64(backend_case, shape, fresh_normal, seed_of):
    run_and_check(backend_case, shape, seed_of(OP, shape, str(backend_case.dtype)), fresh_normal)


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("n", [4, 6])
def test_non_contiguous_and_large_inputs(backend_case, n, fresh_normal):
    case = backend_case
    dt, dev = case.dtype, case.device
    x, h_res, h_out, h_post = make((5, n, 64), dt, dev, 11, fresh_normal)
    wide = fresh_normal((5, n, 80), dt, dev, 12)[..., 8:72]                  # strided rows
    wide_out = fresh_normal((5, 70), dt, dev, 13)[:, 3:67]                   # unaligned rows
    run_and_check(case, (5, n, 64), 14, fresh_normal, [wide, h_res, wide_out, h_post])
    perm = fresh_normal((n, 5, 64), dt, dev, 15).transpose(0, 1)           # copied
    res_t = h_res.transpose(-1, -2).contiguous().transpose(-1, -2)           # non-contiguous h_res
    run_and_check(case, (5, n, 64), 16, fresh_normal, [perm, res_t, h_out, h_post])
    run_and_check(case, (300, n, 256), 17, fresh_normal)


def test_mindspeed_alias_matches(device):
    x = torch.randn(2, 3, 4, 16, device=device, dtype=torch.bfloat16)
    h_res = torch.randn(2, 3, 4, 4, device=device)
    h_out = torch.randn(2, 3, 16, device=device, dtype=torch.bfloat16)
    h_post = torch.randn(2, 3, 4, device=device)
    assert torch.equal(fusedops.mhc_post(x, h_res, h_out, h_post),
                       fusedops.mhc_post_mindspeed(h_out, x, h_post, h_res))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_matches_own_float64_composite(dtype):
    g = torch.Generator().manual_seed(5)
    shapes = [(2, 3, 4, 9), (2, 3, 4, 4), (2, 3, 9), (2, 3, 4)]
    ins = [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for s in shapes]
    out = fusedops.reference.mhc_post(*ins)
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    want = composite(*ins64)
    assert max_abs_error(out, want) <= 1e-12
    dy = torch.randn(shapes[0], generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(out, ins, dy), torch.autograd.grad(want, ins64, dy)):
        assert a.dtype == dtype and max_abs_error(a, b) <= (1e-12 if dtype == torch.float64 else 1e-5)


def test_empty_inputs(device):
    ins = [torch.randn(s, device=device, requires_grad=True) for s in [(0, 4, 16), (0, 4, 4), (0, 16), (0, 4)]]
    out = fusedops.mhc_post(*ins)
    assert out.shape == (0, 4, 16)
    out.sum().backward()
    ins = [torch.randn(s, device=device, requires_grad=True) for s in [(3, 4, 0), (3, 4, 4), (3, 0), (3, 4)]]
    out = fusedops.mhc_post(*ins)
    assert out.shape == (3, 4, 0)
    out.sum().backward()
    assert torch.equal(ins[1].grad, torch.zeros(3, 4, 4, device=device))
    assert torch.equal(ins[3].grad, torch.zeros(3, 4, device=device))


@pytest.mark.parametrize("n", [4, 6])
def test_repeated_backward_is_bitwise_identical(device, n):
    shapes = [(33, n, 520), (33, n, n), (33, 520), (33, n)]
    dts = [torch.bfloat16, torch.float32, torch.bfloat16, torch.float32]
    base = [torch.randn(s, device=device).to(d) for s, d in zip(shapes, dts)]
    g = torch.randn(33, n, 520, device=device, dtype=torch.bfloat16)
    runs = []
    for _ in range(2):
        ins = [t.clone().requires_grad_() for t in base]
        runs.append(torch.autograd.grad(fusedops.mhc_post(*ins), ins, g))
    for a, b in zip(*runs):
        iv = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(a.view(iv), b.view(iv))


def test_opcheck(device):
    ins = [torch.randn(3, 4, 24, device=device, dtype=torch.bfloat16), torch.randn(3, 4, 4, device=device),
           torch.randn(3, 24, device=device, dtype=torch.bfloat16), torch.randn(3, 4, device=device)]
    torch.library.opcheck(torch.ops.fusedops.mhc_post_fwd.default, tuple(t.requires_grad_() for t in ins))
    torch.library.opcheck(torch.ops.fusedops.mhc_post_bwd.default,
                          tuple(t.detach() for t in ins) + (torch.randn(3, 4, 24, device=device, dtype=torch.bfloat16),))


def test_torch_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()

    def f(x, r, o, p, g):
        return (fusedops.mhc_post(x, r, o, p).float() * g).sum()

    base = [torch.randn(2, 3, 4, 32, device=device, dtype=torch.bfloat16), torch.randn(2, 3, 4, 4, device=device),
            torch.randn(2, 3, 32, device=device, dtype=torch.bfloat16), torch.randn(2, 3, 4, device=device)]
    g = torch.randn(2, 3, 4, 32, device=device)
    e = [t.clone().requires_grad_() for t in base]
    c = [t.clone().requires_grad_() for t in base]
    f(*e, g).backward()
    torch.compile(f, fullgraph=True, backend="aot_eager")(*c, g).backward()
    for a, b in zip(e, c):
        assert torch.equal(a.grad, b.grad)


def test_errors(device):
    x = torch.randn(3, 4, 8, device=device, dtype=torch.bfloat16)
    r = torch.randn(3, 4, 4, device=device)
    o = torch.randn(3, 8, device=device, dtype=torch.bfloat16)
    p = torch.randn(3, 4, device=device)
    with pytest.raises(ValueError, match=r"h_res must have shape \[3,4,4\] \(square n x n mixing matrix per token\), got \[3,4,5\]"):
        fusedops.mhc_post(x, torch.randn(3, 4, 5, device=device), o, p)
    with pytest.raises(TypeError, match=r"h_out must have the dtype of x \(bfloat16\), got float32"):
        fusedops.mhc_post(x, r, o.float(), p)
    with pytest.raises(ValueError, match=r"h_out must have shape \[3,8\]"):
        fusedops.mhc_post(x, r, o[:, :7], p)
    with pytest.raises(ValueError, match=r"h_post must have shape \[3,4\]"):
        fusedops.mhc_post(x, r, o, p[:, :3])
    with pytest.raises(ValueError, match="got rank 2"):
        fusedops.mhc_post(x[0], r[0], o[0], p[0])
