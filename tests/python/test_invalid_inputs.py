"""Invalid and extreme inputs, across operator families (issue 39, items 1 and 2).

* Every family README in scope has a section "Invalid inputs" with one table per operator: each
  row an input class (rank, shape, dtype, device, layout, empty, values, nonfinite, int32), what
  the CPU and CUDA calls do, and the C++ and Python tests that check it. The first test here reads
  those tables and checks that every operator has every class and that every named test exists.
* NaN / Inf inputs where the result is defined: every runnable backend must give the float64
  reference's pattern of NaN and Inf in every output and gradient (NaN propagates, nothing
  crashes), and rows the non-finite values do not reach must be what a clean call gives, bit for
  bit.
* Element counts past 2^31 (32-bit indexing): on CUDA with real tensors (the CPU run would need
  the same memory in RAM and minutes of CI: skipped there with that reason); cheap stride or
  zero-width tricks where they reach the limit without the memory.
* Tensors of one call on two devices (CUDA machines only).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import fusedops
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ["rmsnorm", "l2norm", "causal_conv1d", "clipped_swiglu", "sort_chunks", "matmul_add",
            "cross_entropy", "chunk_loss", "mhc", "gated_delta_rule", "kda", "linear_attention"]
CLASSES = ["rank", "shape", "dtype", "device", "layout", "empty", "values", "nonfinite", "int32"]
CUDA_REASON = ("" if torch.cuda.is_available() and fusedops.built_with_cuda()
               else "needs a CUDA device and a CUDA build")
LARGE_REASON = ("2^31 elements need >= 4 GiB per tensor: run on CUDA (the H200 runs); a CPU run "
                "would need the same host memory and minutes of CI time")


# ---------------------------------------------------------------------------------------------
# The README tables.


@dataclass
class Row:
    family: str
    operator: str
    cls: str
    cpp: str
    py: str


def readme_rows(family: str) -> list[Row]:
    text = (ROOT / "src" / "ops" / family / "README.md").read_text()
    if "\n## Invalid inputs" not in text:
        return []
    section = text.split("\n## Invalid inputs", 1)[1].split("\n## ", 1)[0]
    rows, operator = [], None
    for line in section.splitlines():
        m = re.match(r"^### `([a-z_0-9]+)`", line)
        if m:
            operator = m.group(1)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 6 or cells[0] in ("class", "") or set(cells[0]) <= {"-"}:
            continue
        rows.append(Row(family, operator, cells[0], cells[4].strip("`"), cells[5].strip("`")))
    return rows


def _cpp_tests() -> set[str]:
    names = set()
    for f in (ROOT / "tests" / "cpp").rglob("*.cpp"):
        names |= {f"{a}.{b}" for a, b in re.findall(r"^TEST\((\w+), (\w+)\)", f.read_text(), re.M)}
    return names


def _py_tests() -> set[str]:
    names = set()
    for f in (ROOT / "tests" / "python").rglob("test_*.py"):
        names |= {f"{f.name}::{n}" for n in re.findall(r"^def (test_\w+)\(", f.read_text(), re.M)}
    return names


@pytest.mark.parametrize("family", FAMILIES)
def test_every_operator_has_a_complete_invalid_input_table_whose_tests_exist(family):
    rows = readme_rows(family)
    assert rows, f"src/ops/{family}/README.md has no '## Invalid inputs' table"
    cpp, py = _cpp_tests(), _py_tests()
    by_op: dict[str, set[str]] = {}
    for r in rows:
        assert r.operator, f"{family}: a table row before any '### `operator`' heading"
        by_op.setdefault(r.operator, set()).add(r.cls)
        assert r.cls in CLASSES, f"{family}/{r.operator}: unknown class {r.cls!r}"
        for t in r.cpp.split(", "):
            assert t in cpp, f"{family}/{r.operator}/{r.cls}: no C++ test TEST({t.replace('.', ', ')})"
        for t in r.py.split(", "):
            assert t in py, f"{family}/{r.operator}/{r.cls}: no Python test {t}"
    for op, classes in by_op.items():
        missing = [c for c in CLASSES if c not in classes]
        assert not missing, f"{family}/{op}: no row for {missing}"


# ---------------------------------------------------------------------------------------------
# NaN / Inf propagation against the float64 reference.


@dataclass
class Spec:
    op: str                      # registry name (backends are forced through it)
    make: Callable               # (device, dtype) -> dict of input tensors
    run: Callable                # (module, inputs) -> tuple of outputs
    poison: str                  # the input that gets NaN and Inf
    grads: tuple = ()            # inputs whose gradients are compared too
    dtypes: tuple = (torch.float32, torch.bfloat16)
    rows: Callable = field(default=lambda t: t.reshape(-1, t.shape[-1]))  # the poisoned rows


def _normal(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).to(device)


SPECS = [
    Spec("rmsnorm_without_weight", lambda d, t: {"x": _normal((6, 40), t, d, 1)},
         lambda m, a: m.rmsnorm_without_weight(a["x"], 1e-6, True), "x", ("x",)),
    Spec("l2norm", lambda d, t: {"x": _normal((6, 40), t, d, 2)},
         lambda m, a: (m.l2norm(a["x"]),), "x", ("x",)),
    Spec("rmsnorm_gated",
         lambda d, t: {"x": _normal((6, 40), t, d, 3), "z": _normal((6, 40), t, d, 4),
                       "w": _normal((40,), t, d, 5)},
         lambda m, a: (m.rms_norm_gated(a["x"], a["z"], a["w"]),), "x", ("x", "z", "w")),
    Spec("causal_conv1d",
         lambda d, t: {"x": _normal((2, 9, 16), t, d, 6), "w": _normal((4, 16), t, d, 7),
                       "b": _normal((16,), t, d, 8)},
         lambda m, a: (m.causal_conv1d(a["x"], a["w"], a["b"], activation="silu")[0],), "x",
         ("x", "w", "b")),
    Spec("clipped_swiglu", lambda d, t: {"x": _normal((6, 32), t, d, 9)},
         lambda m, a: (m.clipped_swiglu(a["x"]),), "x", ("x",)),
    Spec("matmul_add",
         lambda d, t: {"g": _normal((12, 8), t, d, 10), "x": _normal((12, 5), t, d, 11),
                       "acc": _normal((8, 5), torch.float32, d, 12)},
         lambda m, a: (m.matmul_add(a["g"], a["x"], a["acc"].clone()),), "x"),
    Spec("fused_cross_entropy_loss",
         lambda d, t: {"z": _normal((6, 50), t, d, 13),
                       "y": torch.tensor([3, 0, 49, 7, -100, 11], device=d)},
         lambda m, a: (m.fused_cross_entropy_loss(a["z"], a["y"], reduction="none"),), "z", ("z",)),
    Spec("chunk_loss",
         lambda d, t: {"h": _normal((6, 16), t, d, 14), "w": _normal((50, 16), t, d, 15),
                       "y": torch.tensor([3, 0, 49, 7, -100, 11], device=d)},
         lambda m, a: (m.chunk_loss(a["h"], a["w"], a["y"]),), "h", ("h", "w")),
    Spec("sinkhorn", lambda d, t: {"l": _normal((3, 4, 4), t, d, 16)},
         lambda m, a: (m.sinkhorn(a["l"]),), "l", ("l",), rows=lambda t: t.reshape(t.shape[0], -1)),
    Spec("hc_split_sinkhorn",
         lambda d, t: {"m": _normal((5, 24), t, d, 17),
                       "s": _normal((3,), torch.float32, d, 18).abs(),
                       "b": _normal((24,), torch.float32, d, 19)},
         lambda m, a: m.hc_split_sinkhorn(a["m"], a["s"], a["b"]), "m", ("m", "s", "b")),
    Spec("mhc_pre_bmm",
         lambda d, t: {"h": _normal((5, 4), torch.float32, d, 20), "x": _normal((5, 4, 16), t, d, 21)},
         lambda m, a: (m.mhc_pre_bmm(a["h"], a["x"]),), "x", ("h", "x"),
         rows=lambda t: t.reshape(t.shape[0], -1)),
    Spec("mhc_post",
         lambda d, t: {"x": _normal((5, 4, 16), t, d, 22), "hr": _normal((5, 4, 4), torch.float32, d, 23),
                       "ho": _normal((5, 16), t, d, 24), "hp": _normal((5, 4), torch.float32, d, 25)},
         lambda m, a: (m.mhc_post(a["x"], a["hr"], a["ho"], a["hp"]),), "x", ("x", "hr", "ho", "hp"),
         rows=lambda t: t.reshape(t.shape[0], -1)),
]


def _poisoned(t: torch.Tensor) -> torch.Tensor:
    """NaN in the first element of row 0, +Inf and -Inf side by side in row 1 of the row view (each
    meets weights of both signs where there are weights), -Inf and +Inf in row 2."""
    p = t.clone()
    rows = p.view(p.shape[0], -1) if p.dim() > 1 else p.view(1, -1)
    rows[0, 0] = float("nan")
    if rows.shape[0] > 1:
        rows[1, 1] = float("inf")
        rows[1, 2] = float("-inf")
    if rows.shape[0] > 2:
        rows[2, 0] = float("-inf")
        rows[2, 3] = float("inf")
    return p


def _outputs_and_grads(module, spec: Spec, inputs: dict, seed: int):
    leaves = {k: v.detach().clone().requires_grad_(k in spec.grads) for k, v in inputs.items()}
    outs = [o for o in spec.run(module, leaves) if o is not None]
    got = [o.detach() for o in outs]
    wanted = [leaves[k] for k in spec.grads]
    if wanted:
        cots = [_normal(o.shape, torch.float64, "cpu", seed + i).to(o.dtype).to(o.device)
                for i, o in enumerate(outs)]
        loss = sum((o * c).sum() for o, c in zip(outs, cots) if o.is_floating_point())
        got += [g if g is not None else torch.zeros_like(leaves[k])
                for g, k in zip(torch.autograd.grad(loss, wanted, allow_unused=True), spec.grads)]
    return got


def _pattern(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t = t.detach().cpu()
    return torch.isnan(t), torch.isposinf(t) | torch.isneginf(t)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.op)
def test_nonfinite_inputs_propagate_like_the_reference(spec, device, runnable_backends):
    for dtype in spec.dtypes:
        clean = spec.make(device, dtype)
        dirty = dict(clean)
        dirty[spec.poison] = _poisoned(clean[spec.poison])
        ref = _outputs_and_grads(fusedops.reference, spec, dirty, 99)
        for backend in runnable_backends(spec.op, device):
            with fusedops.use_backend(**{spec.op: backend}):
                ours = _outputs_and_grads(fusedops, spec, dirty, 99)
            assert len(ours) == len(ref)
            for i, (a, r) in enumerate(zip(ours, ref)):
                what = f"{spec.op} {backend} {dtype} output/gradient {i}"
                an, ai = _pattern(a)
                rn, ri = _pattern(r)
                assert torch.equal(an, rn), f"{what}: NaN at {an.nonzero().tolist()}, reference {rn.nonzero().tolist()}"
                assert torch.equal(ai, ri), f"{what}: Inf at {ai.nonzero().tolist()}, reference {ri.nonzero().tolist()}"


# ---------------------------------------------------------------------------------------------
# Element counts past 2^31.


def test_sort_chunks_rows_past_int32_raise_without_memory():
    # A zero-width view of 2^31 rows costs nothing; row_id_map is int32.
    inp = torch.empty((2 ** 31, 0), dtype=torch.float32)
    with pytest.raises(ValueError, match=r"row_id_map is int32, so at most 2\^31-1 are supported"):
        fusedops.sort_chunks_by_idx(inp, torch.tensor([1]), torch.tensor([0]))


LARGE_OPS = ["rmsnorm_without_weight", "l2norm", "rmsnorm_gated", "clipped_swiglu", "sort_chunks_by_idx",
             "fused_cross_entropy_loss", "sinkhorn", "hc_split_sinkhorn", "mhc_pre_bmm", "mhc_post",
             "matmul_add", "chunk_loss"]


def _tail_rows(op: str, n: int, cols: int):
    """(the last rows of a call on n rows, the same rows computed alone) for a row-wise op."""
    x = torch.randn(n, cols, device="cuda", dtype=torch.bfloat16)
    tail = slice(n - 5, n)
    if op == "rmsnorm_without_weight":
        return fusedops.rmsnorm_without_weight(x)[tail], fusedops.rmsnorm_without_weight(x[tail].clone())
    if op == "l2norm":
        return fusedops.l2norm(x)[tail], fusedops.l2norm(x[tail].clone())
    if op == "rmsnorm_gated":
        return fusedops.rms_norm_gated(x)[tail], fusedops.rms_norm_gated(x[tail].clone())
    if op == "clipped_swiglu":
        return fusedops.clipped_swiglu(x)[tail], fusedops.clipped_swiglu(x[tail].clone())
    if op == "sort_chunks_by_idx":
        out = fusedops.sort_chunks_by_idx(x, torch.tensor([n - 5, 5], device="cuda"),
                                          torch.tensor([1, 0], device="cuda"))[0]
        return out[:5], x[tail]
    if op == "fused_cross_entropy_loss":
        labels = torch.randint(0, cols, (n,), device="cuda")
        big = fusedops.fused_cross_entropy_loss(x, labels, reduction="none")[tail]
        return big, fusedops.fused_cross_entropy_loss(x[tail].clone(), labels[tail], reduction="none")
    if op == "sinkhorn":
        m = x.view(-1, 4, 4)
        return fusedops.sinkhorn(m)[-2:], fusedops.sinkhorn(m[-2:].clone())
    if op == "hc_split_sinkhorn":
        m = x.view(-1, 24) if x.numel() % 24 == 0 else x.flatten()[: x.numel() // 24 * 24].view(-1, 24)
        s, b = torch.rand(3, device="cuda"), torch.randn(24, device="cuda")
        big = fusedops.hc_split_sinkhorn(m, s, b)
        small = fusedops.hc_split_sinkhorn(m[-2:].clone(), s, b)
        return torch.cat([t[-2:].flatten() for t in big]), torch.cat([t.flatten() for t in small])
    t = x.view(n // 4, 4, cols)
    if op == "mhc_pre_bmm":
        h = torch.rand(t.shape[0], 4, device="cuda")
        return fusedops.mhc_pre_bmm(h, t)[-2:], fusedops.mhc_pre_bmm(h[-2:], t[-2:].clone())
    hr = torch.rand(t.shape[0], 4, 4, device="cuda")
    hp = torch.rand(t.shape[0], 4, device="cuda")
    ho = torch.randn(t.shape[0], cols, device="cuda", dtype=torch.bfloat16)
    return (fusedops.mhc_post(t, hr, ho, hp)[-2:],
            fusedops.mhc_post(t[-2:].clone(), hr[-2:], ho[-2:], hp[-2:]))


@pytest.mark.skipif(not torch.cuda.is_available() or not fusedops.built_with_cuda(), reason=LARGE_REASON)
@pytest.mark.parametrize("op", LARGE_OPS)
def test_element_counts_past_int32_on_cuda(op):
    """bf16 tensors of more than 2^31 elements: the last rows against the same rows computed alone
    (the same kernels on a small call), or sums known exactly."""
    cols = 4096
    n = (2 ** 31 // cols + 4) // 4 * 4 + 4
    if op == "matmul_add":  # ones: every entry of main_grad becomes n (exact in fp32 below 2^24)
        g = torch.ones(n, 8, device="cuda", dtype=torch.bfloat16)
        x = torch.ones(n, cols, device="cuda", dtype=torch.bfloat16)
        acc = fusedops.matmul_add(g, x, torch.zeros(8, cols, device="cuda"))
        assert torch.equal(acc, torch.full_like(acc, float(n)))
    elif op == "chunk_loss":  # zero hidden: every row's loss is log(V)
        h = torch.zeros(n, cols // 2, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(64, cols // 2, device="cuda", dtype=torch.bfloat16)
        loss = fusedops.chunk_loss(h, w, torch.randint(0, 64, (n,), device="cuda"))
        assert abs(float(loss) / (n * math.log(64)) - 1) < 1e-5
    else:
        big, small = _tail_rows(op, n, cols)
        assert torch.equal(big, small)
    fusedops.check_errors()


@pytest.mark.skipif(not torch.cuda.is_available() or not fusedops.built_with_cuda(), reason=LARGE_REASON)
def test_causal_conv1d_time_steps_past_int32_raise_on_cuda():
    # The CUDA kernels index time in 32 bits; an expanded view reaches the limit in 4 bytes.
    x = torch.ones((1, 1, 1), device="cuda").expand(1, 2 ** 31, 1)
    with pytest.raises(ValueError, match="fewer than 2\\^31 - 16 time steps"):
        fusedops.causal_conv1d(x, torch.ones(4, 1, device="cuda"))


# ---------------------------------------------------------------------------------------------
# Devices: every tensor of a call on the call's device.


@pytest.mark.skipif(bool(CUDA_REASON), reason=CUDA_REASON or "-")
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.op)
def test_tensors_on_two_devices_raise(spec):
    inputs = spec.make("cuda", torch.float32)
    for name in inputs:
        mixed = dict(inputs)
        mixed[name] = inputs[name].cpu()
        with pytest.raises((ValueError, RuntimeError), match="must be on|same device|Expected all tensors"):
            spec.run(fusedops, mixed)
