"""mhc_pre_bmm (docs/specs/ops.md 9.2) through the torch layer.

Every registered backend is forced in turn and compared, forward and both gradients, with a
float64 PyTorch composite written here (torch.autograd for the gradients); the tolerance base is
the plain composite on the inputs as given (bf16 x times fp32 h_pre promotes to fp32, as a user's
code does).
"""

from __future__ import annotations

import fusedops
import pytest
import torch

from tests.common.tolerance import assert_close, max_abs_error

OP = "mhc_pre_bmm"
SHAPES = [(1, 4, 1), (3, 4, 7), (2, 3, 4, 64), (5, 1, 8), (4, 2, 33), (3, 3, 16), (2, 5, 40),
          (6, 8, 24), (2, 16, 8), (2, 6, 4, 56)]


def composite(h_pre, x, out_dtype=torch.float32):
    return (h_pre.unsqueeze(-1) * x).sum(-2).to(out_dtype)


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


def grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g)


def run_and_check(case, shape, out_dtype, seed, fresh_normal, x=None, h_pre=None):
    dt, dev = case.dtype, case.device
    hdt = torch.float64 if dt == torch.float64 else torch.float32
    x = fresh_normal(shape, dt, dev, seed, mean=0.1, std=1.2) if x is None else x
    h_pre = fresh_normal(shape[:-1], hdt, dev, seed + 1, mean=0.3) if h_pre is None else h_pre
    x, h_pre = x.detach().requires_grad_(), h_pre.detach().requires_grad_()
    yshape = tuple(shape[:-2]) + (shape[-1],)
    g = fresh_normal(yshape, out_dtype, dev, seed + 2)
    with forced(case):
        y = fusedops.mhc_pre_bmm(h_pre, x, out_dtype)
        dh, dx = grads(y, (h_pre, x), g)
    assert y.dtype == out_dtype and tuple(y.shape) == yshape and y.device.type == dev
    assert dx.dtype == dt and dh.dtype == h_pre.dtype
    ins64 = [t.detach().cpu().double().requires_grad_() for t in (h_pre, x)]
    y64 = composite(*ins64, torch.float64)
    insb = [t.detach().clone().requires_grad_() for t in (h_pre, x)]
    yb = composite(*insb, out_dtype)
    name = f"{case.id} {tuple(shape)} y:{out_dtype}"
    assert_close(y, yb, y64, out_dtype, f"{name} y")
    d64 = grads(y64, ins64, g.cpu().double())
    db = grads(yb, insb, g)
    assert_close(dh, db[0], d64[0], h_pre.dtype, f"{name} dh_pre")
    assert_close(dx, db[1], d64[1], dt, f"{name} dx")


@pytest.mark.dtypes(torch.float32, torch.bfloat16, torch.float16)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64(backend_case, shape, fresh_normal, seed_of):
    run_and_check(backend_case, shape, torch.float32, seed_of(OP, shape, str(backend_case.dtype)), fresh_normal)


@pytest.mark.dtypes(torch.float32, torch.bfloat16, torch.float16)
def test_output_in_input_dtype(backend_case, fresh_normal, seed_of):
    run_and_check(backend_case, (3, 4, 64), backend_case.dtype, seed_of("yx", str(backend_case.dtype)), fresh_normal)
    run_and_check(backend_case, (3, 6, 17), backend_case.dtype, seed_of("yx6", str(backend_case.dtype)), fresh_normal)


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_non_contiguous_and_large_inputs(backend_case, fresh_normal, seed_of):
    case = backend_case
    dt, dev = case.dtype, case.device
    wide = fresh_normal((5, 4, 72), dt, dev, 1)
    run_and_check(case, (5, 4, 64), torch.float32, 2, fresh_normal, x=wide[..., 4:68])  # strided rows
    perm = fresh_normal((4, 5, 64), dt, dev, 3).transpose(0, 1)                         # copied
    run_and_check(case, (5, 4, 64), torch.float32, 4, fresh_normal, x=perm)
    h_nc = fresh_normal((4, 5), torch.float32, dev, 5).t()
    run_and_check(case, (5, 4, 64), torch.float32, 6, fresh_normal, h_pre=h_nc)
    run_and_check(case, (300, 4, 512), torch.float32, 7, fresh_normal)


def test_bf16_h_pre_is_upcast(device):
    x = torch.randn(3, 4, 16, device=device, dtype=torch.bfloat16)
    h = torch.randn(3, 4, device=device, dtype=torch.bfloat16, requires_grad=True)
    y = fusedops.mhc_pre_bmm(h, x)
    torch.testing.assert_close(y, composite(h.detach().float(), x.float()))
    y.sum().backward()
    assert h.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_matches_own_float64_composite(dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 4, 9, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    h = torch.randn(2, 3, 4, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    y = fusedops.reference.mhc_pre_bmm(h, x)
    want = composite(h.detach().double(), x.detach().double(), torch.float64)
    assert max_abs_error(y, want) <= 1e-12
    dy = torch.randn(2, 3, 9, generator=g, dtype=torch.float64)
    h64, x64 = h.detach().double().requires_grad_(), x.detach().double().requires_grad_()
    for a, b in zip(grads(y, (h, x), dy), grads(composite(h64, x64, torch.float64), (h64, x64), dy)):
        assert a.dtype == dtype and max_abs_error(a, b) <= (1e-12 if dtype == torch.float64 else 1e-5)


def test_empty_inputs(device):
    x = torch.randn(0, 4, 16, device=device, requires_grad=True)
    h = torch.randn(0, 4, device=device, requires_grad=True)
    y = fusedops.mhc_pre_bmm(h, x)
    assert y.shape == (0, 16)
    y.sum().backward()
    x = torch.randn(3, 4, 0, device=device, requires_grad=True)
    h = torch.randn(3, 4, device=device, requires_grad=True)
    y = fusedops.mhc_pre_bmm(h, x)
    assert y.shape == (3, 0)
    y.sum().backward()
    assert torch.equal(h.grad, torch.zeros(3, 4, device=device))


def test_repeated_backward_is_bitwise_identical(device):
    x = torch.randn(33, 4, 520, device=device, dtype=torch.bfloat16)
    h = torch.randn(33, 4, device=device)
    g = torch.randn(33, 520, device=device)
    runs = []
    for _ in range(2):
        xi, hi = x.clone().requires_grad_(), h.clone().requires_grad_()
        runs.append(grads(fusedops.mhc_pre_bmm(hi, xi), (hi, xi), g))
    assert torch.equal(runs[0][0].view(torch.int32), runs[1][0].view(torch.int32))
    assert torch.equal(runs[0][1].view(torch.int16), runs[1][1].view(torch.int16))


def test_opcheck(device):
    x = torch.randn(3, 4, 24, device=device, dtype=torch.bfloat16, requires_grad=True)
    h = torch.randn(3, 4, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.fusedops.mhc_pre_bmm_fwd.default, (h, x, torch.float32))
    torch.library.opcheck(torch.ops.fusedops.mhc_pre_bmm_bwd.default,
                          (h.detach(), x.detach(), torch.randn(3, 24, device=device)))


def test_torch_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()

    def f(h, x, g):
        return (fusedops.mhc_pre_bmm(h, x) * g).sum()

    x = torch.randn(2, 3, 4, 32, device=device, dtype=torch.bfloat16)
    h = torch.randn(2, 3, 4, device=device)
    g = torch.randn(2, 3, 32, device=device)
    e = [t.clone().requires_grad_() for t in (h, x)]
    c = [t.clone().requires_grad_() for t in (h, x)]
    f(*e, g).backward()
    torch.compile(f, fullgraph=True, backend="aot_eager")(*c, g).backward()
    for a, b in zip(e, c):
        assert torch.equal(a.grad, b.grad)


def test_errors(device):
    x = torch.randn(3, 4, 8, device=device)
    h = torch.randn(3, 4, device=device)
    with pytest.raises(ValueError, match=r"x must have rank 3 \(\[T,n,C\]\) or 4 \(\[B,T,n,C\]\), got rank 2"):
        fusedops.mhc_pre_bmm(torch.randn(3, 4, device=device), torch.randn(3, 4, device=device))
    with pytest.raises(ValueError, match=r"h_pre must have shape \[3,4\] .*got \[3,5\]"):
        fusedops.mhc_pre_bmm(torch.randn(3, 5, device=device), x)
    with pytest.raises(ValueError, match=r"h_pre must have shape \[3,4\]"):
        fusedops.mhc_pre_bmm(torch.randn(2, 4, device=device), x)
    with pytest.raises(TypeError, match="int32"):
        fusedops.mhc_pre_bmm(h, torch.ones(3, 4, 8, dtype=torch.int32, device=device))
