"""Invalid and extreme inputs of the linear-attention gates, index helpers and context-parallel
entry points (issue 39, item 2): the rows of the "Invalid inputs" tables of fused_gdn_gate
(src/ops/gated_delta_rule/README.md), fused_kda_gate (src/ops/kda/README.md), beta_sigmoid,
prepare_chunk_indices / prepare_chunk_offsets and la_cp_fwd_summary / la_cp_bwd_summary /
la_cp_fold_fwd / la_cp_fold_bwd (src/ops/linear_attention/README.md). The context-parallel entry
points are called through the bindings that python/fusedops/distributed uses (fusedops._C).
"""

from __future__ import annotations

import fusedops
import pytest
import torch
from fusedops import _C
from fusedops import gated_delta_rule as gdn
from fusedops import kda
from fusedops._backend import context
from fusedops.ops import _linear_attention as la

CUDA_REASON = ("" if torch.cuda.is_available() and fusedops.built_with_cuda()
               else "needs a CUDA device and a CUDA build")
LARGE_REASON = ("2^31 elements need >= 8 GiB per tensor: run on CUDA (the H200 runs); a CPU run would "
                "need the same host memory and minutes of CI time")
NAN, INF = float("nan"), float("inf")


def _rn(seed: int):
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)

    return rn


def _strided(t: torch.Tensor) -> torch.Tensor:
    buf = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
    buf[..., 1::2] = t
    return buf[..., 1::2]


# ---------------------------------------------------------------------------------------------
# prepare_chunk_indices / prepare_chunk_offsets.

BUILDERS = ["prepare_chunk_indices", "prepare_chunk_offsets"]


@pytest.mark.parametrize("fn", BUILDERS)
def test_table_builders_reject_bad_chunk_sizes(fn):
    cu = torch.tensor([0, 5, 9])
    for bad in (0, -4):
        with pytest.raises(ValueError, match=f"{fn}: chunk_size must be >= 1, got {bad}"):
            getattr(gdn, fn)(cu, bad)


@pytest.mark.parametrize("fn", BUILDERS)
def test_table_builders_shapes_layouts_and_empty(fn):
    build = getattr(gdn, fn)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0, got \\[\\]"):  # shape [0]
        build(torch.zeros(0, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="rank-1 int32/int64"):  # rank 2
        build(torch.tensor([[0, 5, 9]]), 4)
    dense = torch.tensor([0, 5, 5, 9])
    strided = torch.tensor([0, -1, 5, -1, 5, -1, 9, -1])[::2]  # a non-contiguous cu_seqlens
    assert torch.equal(build(strided, 4), build(dense, 4))
    want = {"prepare_chunk_indices": [[0, 0], [0, 1], [2, 0]], "prepare_chunk_offsets": [0, 2, 2, 3]}[fn]
    assert build(dense, 4).tolist() == want  # the empty sequence 1 has no chunk
    empty = build(torch.tensor([0]), 4)  # N = 0 sequences
    assert list(empty.shape) == ([0, 2] if fn == "prepare_chunk_indices" else [1])
    for dt in (torch.int32, torch.int64):
        assert build(dense.to(dt), 4).dtype == dt


@pytest.mark.parametrize("fn", BUILDERS)
def test_table_builders_int32_lengths_near_2pow31(fn):
    """A length of 2^31 - 1 tokens in an int32 cu_seqlens: the chunk counts are computed without
    overflow (ceil((2^31 - 1) / 2^30) = 2)."""
    cu = torch.tensor([0, 2**31 - 1], dtype=torch.int32)
    got = getattr(gdn, fn)(cu, 2**30)
    assert got.dtype == torch.int32
    assert got.tolist() == ([[0, 0], [0, 1]] if fn == "prepare_chunk_indices" else [0, 2])


@pytest.mark.skipif(bool(CUDA_REASON), reason=CUDA_REASON)
@pytest.mark.parametrize("fn", BUILDERS)
def test_table_builders_on_cuda_keep_the_device(fn):
    cu = torch.tensor([0, 5, 9], device="cuda")
    got = getattr(gdn, fn)(cu, 4)
    assert got.device == cu.device
    assert torch.equal(got.cpu(), getattr(gdn, fn)(cu.cpu(), 4))


# ---------------------------------------------------------------------------------------------
# fused_gdn_gate, fused_kda_gate, beta_sigmoid.

GATES = ["fused_gdn_gate", "fused_kda_gate", "beta_sigmoid"]


def _beta_sigmoid(x: torch.Tensor, allow_neg_eigval: bool = False, y=None) -> torch.Tensor:
    """beta_sigmoid through its binding (the top levels' use_beta_sigmoid_in_kernel step)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if y is None else y
    _C.beta_sigmoid_fwd(context("beta_sigmoid", x), x, y, allow_neg_eigval)
    return y


def _gate_inputs(op: str, B=2, T=5, HV=3, K=4, seed=0, device="cpu"):
    rn = _rn(seed)
    if op == "fused_gdn_gate":
        return {"g": rn(B, T, HV), "A_log": rn(HV), "dt_bias": rn(HV)}
    if op == "fused_kda_gate":
        return {"g": rn(B, T, HV, K), "A_log": rn(HV), "dt_bias": rn(HV * K)}
    return {"x": rn(B, T, HV)}


def _gate(op: str, x: dict, **kw) -> torch.Tensor:
    if op == "fused_gdn_gate":
        return gdn.fused_gdn_gate(x["g"], x["A_log"], x["dt_bias"], **kw)
    if op == "fused_kda_gate":
        return kda.fused_kda_gate(x["g"], x["A_log"], x["dt_bias"], **kw)
    return _beta_sigmoid(x["x"], **kw)


def _main_input(op: str) -> str:
    return "x" if op == "beta_sigmoid" else "g"


@pytest.mark.parametrize("op", GATES)
def test_gate_rank_shape_and_dtype_errors(op):
    x = _gate_inputs(op)
    m = _main_input(op)
    with pytest.raises(ValueError, match=r"must have rank"):
        _gate(op, dict(x, **{m: torch.randn(())}))
    with pytest.raises(TypeError, match=rf"{m} must have dtype in \{{float32, bfloat16, float16, float64\}}, got int64"):
        _gate(op, dict(x, **{m: x[m].long()}))
    if op == "beta_sigmoid":
        with pytest.raises(ValueError, match=r"beta_sigmoid: y must have shape \[2,5,3\], got \[2,5,4\]"):
            _beta_sigmoid(x["x"], y=torch.empty(2, 5, 4))
        with pytest.raises(TypeError, match=r"beta_sigmoid: y must have dtype in"):
            _beta_sigmoid(x["x"], y=torch.empty(2, 5, 3, dtype=torch.int32))
        return
    name = "gdn_gate" if op == "fused_gdn_gate" else "kda_gate"
    with pytest.raises(ValueError, match=rf"{name}: A_log must have shape \[3\], got \[4\]"):
        _gate(op, dict(x, A_log=torch.randn(4)))
    with pytest.raises(TypeError, match=rf"{name}: A_log must have dtype in"):
        _gate(op, dict(x, A_log=x["A_log"].long()))
    with pytest.raises(ValueError, match=rf"{name}: dt_bias must"):
        _gate(op, dict(x, dt_bias=torch.randn(2)))
    if op == "fused_kda_gate":
        with pytest.raises(ValueError, match=r"kda_gate: g must have rank 4 \(\[B,T,HV,K\]\), got shape \[2, 5, 3\]"):
            _gate(op, dict(x, g=torch.randn(2, 5, 3)))


@pytest.mark.skipif(bool(CUDA_REASON), reason=CUDA_REASON)
@pytest.mark.parametrize("op", GATES)
def test_gate_inputs_on_two_devices_raise(op):
    x = _gate_inputs(op)
    if op == "beta_sigmoid":
        with pytest.raises(ValueError, match="must be on"):
            _beta_sigmoid(x["x"].cuda(), y=torch.empty(x["x"].shape))
        return
    with pytest.raises(ValueError, match="must be on"):
        _gate(op, dict(x, g=x["g"].cuda()))


@pytest.mark.parametrize("op", GATES)
def test_gate_strided_inputs_match_contiguous(op):
    x = _gate_inputs(op)
    m = _main_input(op)
    want = _gate(op, x)
    transposed = x[m].transpose(0, 1).contiguous().transpose(0, 1)  # rows of two strides
    if op == "beta_sigmoid":  # the binding takes rows of one stride with a unit last stride
        with pytest.raises(ValueError, match="beta_sigmoid: x must have a contiguous last dimension"):
            _beta_sigmoid(_strided(x[m]))
        with pytest.raises(ValueError, match="beta_sigmoid: x must have leading dimensions that flatten"):
            _beta_sigmoid(transposed)
        with pytest.raises(ValueError, match="beta_sigmoid: y must be contiguous"):
            _beta_sigmoid(x[m], y=_strided(torch.empty(x[m].shape)))
        padded = torch.zeros(2, 5, 4)
        padded[..., :3] = x[m]
        assert torch.equal(_beta_sigmoid(padded[..., :3]), want)  # rows of one stride: read in place
        return
    for g in (_strided(x[m]), transposed):  # the Python layer copies what the kernel cannot read
        assert torch.equal(_gate(op, dict(x, g=g)), want)
    assert torch.equal(_gate(op, dict(x, A_log=_strided(x["A_log"]), dt_bias=_strided(x["dt_bias"]))), want)


@pytest.mark.parametrize("op", GATES)
@pytest.mark.parametrize("shape", ["B0", "T0", "HV0"])
def test_gate_empty_inputs(op, shape):
    dims = {"B0": dict(B=0), "T0": dict(T=0), "HV0": dict(HV=0)}[shape]
    x = _gate_inputs(op, **dims)
    m = _main_input(op)
    y = _gate(op, x)
    assert y.shape == x[m].shape and y.numel() == 0
    if op != "beta_sigmoid":
        for t in x.values():
            t.requires_grad_(True)
        _gate(op, x).sum().backward()
        for k, t in x.items():
            assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any(), k


def test_gate_option_values():
    x = _gate_inputs("fused_kda_gate")
    with pytest.raises(ValueError, match="kda_gate: lower_bound must be finite"):
        kda.fused_kda_gate(x["g"], x["A_log"], x["dt_bias"], lower_bound=NAN)
    with pytest.raises(ValueError, match="kda_gate: A_log is required unless lower_bound is set"):
        kda.fused_kda_gate(x["g"], None, x["dt_bias"])
    # Extreme finite inputs give finite gates (softplus' linear branch; the sigmoid's saturation).
    big = torch.tensor([[-1e4, -88.0, 0.0, 88.0, 1e4]]).repeat(3, 1).T.reshape(1, 5, 3).contiguous()
    y = gdn.fused_gdn_gate(big, torch.zeros(3), torch.zeros(3))
    assert torch.isfinite(y).all() and (y <= 0).all()
    b = _beta_sigmoid(big.reshape(-1), allow_neg_eigval=True)
    assert torch.isfinite(b).all() and b.min() == 0 and b.max() == 2


@pytest.mark.parametrize("op", GATES)
def test_gate_nonfinite_like_the_ref_backend(op):
    x = _gate_inputs(op)
    m = _main_input(op)
    flat = x[m].view(-1)
    flat[0], flat[1], flat[2] = NAN, INF, -INF
    grads = op != "beta_sigmoid"

    def run(backend):
        xs = {k: v.detach().clone().requires_grad_(grads) for k, v in x.items()}
        with fusedops.use_backend(backend):
            y = _gate(op, xs)
            if grads:
                (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        return [y.detach()] + ([xs[k].grad for k in xs] if grads else [])

    name = {"fused_gdn_gate": "gdn_gate", "fused_kda_gate": "kda_gate"}.get(op, op)
    ref = run("ref")
    assert ref[0].isnan().any()  # the poison reaches the output
    for b in sorted({e["backend"] for e in fusedops.backends(name) if e["device"] == "cpu" and e["runnable_here"]}):
        for got, want in zip(run(b), ref):
            assert torch.equal(got.isnan(), want.isnan()), b
            assert torch.equal(got.isinf(), want.isinf()), b
            fin = want.isfinite()
            torch.testing.assert_close(got[fin].double(), want[fin].double(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(bool(CUDA_REASON), reason=LARGE_REASON)
@pytest.mark.parametrize("op", GATES)
def test_gate_outputs_past_int32_elements_on_cuda(op):
    """2^31 + 8 elements of the main input: the last row equals the first (64-bit offsets)."""
    n = 2**31 + 8
    HV = 8
    if op == "fused_kda_gate":
        g = torch.zeros(n // 32, 1, HV, 4, device="cuda")
        x = {"g": g, "A_log": torch.zeros(HV, device="cuda"), "dt_bias": torch.zeros(HV * 4, device="cuda")}
    elif op == "fused_gdn_gate":
        g = torch.zeros(n // HV, 1, HV, device="cuda")
        x = {"g": g, "A_log": torch.zeros(HV, device="cuda"), "dt_bias": torch.zeros(HV, device="cuda")}
    else:
        x = {"x": torch.zeros(n // HV, 1, HV, device="cuda")}
    m = _main_input(op)
    x[m][0].normal_()
    x[m][-1].copy_(x[m][0])
    y = _gate(op, x)
    assert torch.equal(y[-1], y[0]) and y[-1].abs().sum() > 0
