"""matmul_add (``main_grad += grad_output^T @ input``) through the torch layer.

Every registered backend is forced in turn (``backend_case``) and compared with a float64
oracle written here (``main_grad + g.T @ x`` in float64); the tolerance base is the plain
PyTorch composite in the operand dtype, ``main_grad.add_(grad_output.t() @ input)``
(tests/common/tolerance.py). The op has no backward (it is a backward helper).
"""

from __future__ import annotations

import math

import fusedops
import pytest
import torch
from fusedops.ops.matmul_add import npu_matmul_add_fp32

from tests.common.tolerance import assert_close

OP = "matmul_add"

# (token dims, out, in)
SHAPES = [((1,), 1, 1), ((37,), 33, 65), ((129,), 16, 8), ((2, 3, 5), 7, 9), ((300,), 64, 48),
          ((4, 64), 96, 40), ((0,), 5, 7), ((4,), 0, 3), ((3,), 6, 0)]


def flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def oracle(g, x, mg):
    return mg.detach().cpu().double() + flat(g).cpu().double().t() @ flat(x).cpu().double()


def composite(g, x, mg):
    """The eager way: the product in the operand dtype, added into main_grad."""
    return mg.clone().add_(flat(g).t() @ flat(x))


def fwd_backends(device: str) -> list[str]:
    """Backends of this forward-only op that can run here (conftest's runnable_backends wants a
    backward too)."""
    found = [e for e in fusedops.backends(OP) if e["device"] == device and e["runnable_here"]]
    ids = [e["backend"] for e in sorted(found, key=lambda e: -e["priority"])]
    assert ids, f"no {OP} backend runs on {device}"
    return ids


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


def acc_dtype(dt):
    return torch.float64 if dt == torch.float64 else torch.float32


# float64 operands run only on the reference backend, which test_reference_matches_oracle checks
# with a float64 tolerance (the policy's 2-ulp floor is below the summation-order difference of
# two float64 dot products).
@pytest.mark.dtypes(torch.float32, torch.bfloat16, torch.float16)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[0])) + f"-{s[1]}-{s[2]}")
def test_accumulates_the_product(backend_case, shape, fresh_normal, seed_of):
    dt, dev = backend_case.dtype, backend_case.device
    lead, o, i = shape
    seed = seed_of(OP, shape, str(dt))
    g = fresh_normal(lead + (o,), dt, dev, seed)
    x = fresh_normal(lead + (i,), dt, dev, seed + 1)
    mg = fresh_normal((o, i), acc_dtype(dt), dev, seed + 2, mean=0.5, std=3.0)
    want = oracle(g, x, mg)
    base = composite(g, x, mg)
    with forced(backend_case):
        out = fusedops.matmul_add(g, x, mg)
    assert out is mg and mg.dtype == acc_dtype(dt) and mg.shape == (o, i)
    assert_close(mg, base, want, dt, f"{backend_case.id} {shape} main_grad")


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
def test_repeated_calls_accumulate_and_are_deterministic(backend_case, fresh_normal):
    dt, dev = backend_case.dtype, backend_case.device
    g = fresh_normal((96, 40), dt, dev, 1)
    x = fresh_normal((96, 24), dt, dev, 2)
    mg0 = fresh_normal((40, 24), torch.float32, dev, 3)
    runs = []
    for _ in range(2):
        mg = mg0.clone()
        with forced(backend_case):
            fusedops.matmul_add(g, x, mg)
            fusedops.matmul_add(g, x, mg)  # two micro-batches
        runs.append(mg)
    assert torch.equal(runs[0].view(torch.int32), runs[1].view(torch.int32)), "not bitwise repeatable"
    want = oracle(g, x, mg0) + flat(g).double().cpu().t() @ flat(x).double().cpu()
    base = composite(g, x, composite(g, x, mg0))
    assert_close(runs[0], base, want, dt, f"{backend_case.id} two accumulations")


def test_addmm_composite_agrees(device, fresh_normal):
    g = fresh_normal((77, 31), torch.bfloat16, device, 4)
    x = fresh_normal((77, 45), torch.bfloat16, device, 5)
    mg = fresh_normal((31, 45), torch.float32, device, 6)
    base = mg.clone().addmm_(g.t().float(), x.float())  # fp32 product: a tighter base
    ours = fusedops.matmul_add(g, x, mg.clone())
    assert_close(ours, base, oracle(g, x, mg), torch.float32, "vs addmm_ in fp32")


def test_non_contiguous_and_misaligned_operands(device, fresh_normal):
    o, i, t = 24, 20, 33
    for backend in fwd_backends(device):
        g_wide = fresh_normal((t, o + 3), torch.bfloat16, device, 7)
        layouts = {
            "column_slice": (g_wide[:, :o], fresh_normal((t, i + 5), torch.bfloat16, device, 8)[:, :i]),
            "offset_slice": (g_wide[:, 3:], fresh_normal((t, i + 1), torch.bfloat16, device, 9)[:, 1:]),
            "transposed": (fresh_normal((o, t), torch.bfloat16, device, 10).t(),
                           fresh_normal((i, t), torch.bfloat16, device, 11).t()),
            "expanded_tokens": (fresh_normal((1, o), torch.bfloat16, device, 12).expand(t, o),
                                fresh_normal((t, i), torch.bfloat16, device, 13)),
        }
        for name, (g, x) in layouts.items():
            mg0 = fresh_normal((o, i), torch.float32, device, 14)
            mg = mg0.clone()
            with fusedops.use_backend(**{OP: backend}):
                fusedops.matmul_add(g, x, mg)
            assert_close(mg, composite(g, x, mg0), oracle(g, x, mg0), torch.bfloat16, f"{backend} {name}")


def test_main_grad_inside_a_flat_buffer(device, fresh_normal):
    # Megatron's main_grad is a view into one flat fp32 buffer; at an offset that is not 256-byte
    # aligned the CUDA path accumulates into an aligned copy and writes it back.
    o, i = 12, 10
    g = fresh_normal((40, o), torch.bfloat16, device, 15)
    x = fresh_normal((40, i), torch.bfloat16, device, 16)
    buf = fresh_normal((3 + o * i + 5,), torch.float32, device, 17)
    before = buf.clone()
    mg = buf[3:3 + o * i].view(o, i)
    fusedops.matmul_add(g, x, mg)
    assert torch.equal(buf[:3], before[:3]) and torch.equal(buf[3 + o * i:], before[3 + o * i:])
    mg0 = before[3:3 + o * i].view(o, i)
    assert_close(buf[3:3 + o * i].view(o, i), composite(g, x, mg0), oracle(g, x, mg0), torch.bfloat16,
                 "main_grad view")


def test_no_tokens_leave_main_grad_unchanged(device):
    mg = torch.randn(6, 5, device=device)
    before = mg.clone()
    fusedops.matmul_add(torch.randn(0, 6, device=device), torch.randn(0, 5, device=device), mg)
    assert torch.equal(mg, before)
    fusedops.matmul_add(torch.randn(2, 0, 6, device=device), torch.randn(2, 0, 5, device=device), mg)
    assert torch.equal(mg, before)


def test_mindspeed_argument_order(device):
    g = torch.randn(10, 4, device=device)
    x = torch.randn(10, 3, device=device)
    mg = torch.zeros(4, 3, device=device)
    npu_matmul_add_fp32(x, g, mg)
    torch.testing.assert_close(mg, g.t() @ x, rtol=1e-5, atol=1e-5)


def test_reference_matches_oracle():
    g = torch.randn(2, 9, 5, dtype=torch.bfloat16)
    x = torch.randn(2, 9, 7, dtype=torch.bfloat16)
    mg = torch.randn(5, 7)
    ref = fusedops.reference.matmul_add(g, x, mg)
    assert ref.dtype == torch.float64
    assert torch.allclose(ref, oracle(g, x, mg), rtol=1e-12, atol=1e-12)


def test_bad_arguments_raise(device, devices):
    g = torch.randn(8, 6, device=device, dtype=torch.bfloat16)
    x = torch.randn(8, 5, device=device, dtype=torch.bfloat16)
    mg = torch.zeros(6, 5, device=device)
    with pytest.raises(ValueError, match=r"main_grad must have shape \[6,5\]"):
        fusedops.matmul_add(g, x, torch.zeros(5, 6, device=device))
    with pytest.raises(ValueError, match=r"input must have the leading dims of grad_output \[8,\*\], got \[7,5\]"):
        fusedops.matmul_add(g, x[:7], mg)
    with pytest.raises(TypeError, match=r"main_grad must have dtype in \{float32, float64\}, got bfloat16"):
        fusedops.matmul_add(g, x, mg.bfloat16())
    with pytest.raises(ValueError, match="main_grad must be contiguous"):
        fusedops.matmul_add(g, x, torch.zeros(5, 6, device=device).t())
    with pytest.raises(TypeError, match=r"input must have the dtype of grad_output \(bfloat16\), got float16"):
        fusedops.matmul_add(g, x.half(), mg)
    if "cuda" in devices:
        other = "cpu" if device == "cuda" else "cuda"
        with pytest.raises(ValueError, match=f"main_grad must be on {device}.*got {other}"):
            fusedops.matmul_add(g, x, mg.to(other))


def test_opcheck(device):
    g = torch.randn(3, 11, 6, device=device)
    x = torch.randn(3, 11, 5, device=device)
    mg = torch.randn(6, 5, device=device)
    torch.library.opcheck(torch.ops.fusedops.matmul_add.default, (g, x, mg))


def test_torch_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()

    def step(g, x, mg):
        fusedops.matmul_add(g, x, mg)
        return mg * 2

    g = torch.randn(19, 12, device=device, dtype=torch.bfloat16)
    x = torch.randn(19, 10, device=device, dtype=torch.bfloat16)
    mg = torch.randn(12, 10, device=device)
    me, mc = mg.clone(), mg.clone()
    ye = step(g, x, me)
    yc = torch.compile(step, fullgraph=True, backend="aot_eager")(g, x, mc)
    assert torch.equal(mc, me) and torch.equal(yc, ye)
