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
from fusedops import _C, kda
from fusedops import gated_delta_rule as gdn
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
    bwd = gdn.gdn_gate_bwd if op == "fused_gdn_gate" else kda.kda_gate_bwd
    bad_dy = torch.randn(x["g"].shape[:-1] + (x["g"].shape[-1] + 1,))
    with pytest.raises(ValueError, match=rf"{name}: dy must have shape"):
        bwd(x["g"], x["A_log"], x["dt_bias"], bad_dy)
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
    backends = sorted({e["backend"] for e in fusedops.backends(name) if e["device"] == "cpu" and e["runnable_here"]})
    assert "cpu" in backends, backends  # the loop below must not pass vacuously
    for b in backends:
        for got, want in zip(run(b), ref):
            assert torch.equal(got.isnan(), want.isnan()), b
            assert torch.equal(got.isinf(), want.isinf()), b
            fin = want.isfinite()
            torch.testing.assert_close(got[fin].double(), want[fin].double(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(bool(CUDA_REASON), reason=LARGE_REASON)
@pytest.mark.parametrize("op", GATES)
def test_gate_outputs_past_int32_elements_on_cuda(op):
    """More than 2^31 elements of the main input: the last row equals the first (64-bit offsets)."""
    n = 2**31 + 8
    HV = 8
    if op == "fused_kda_gate":
        g = torch.zeros(2**31 // (HV * 4) + 2, 1, HV, 4, device="cuda")
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


# ---------------------------------------------------------------------------------------------
# la_cp_fwd_summary, la_cp_bwd_summary, la_cp_fold_fwd, la_cp_fold_bwd (the bindings that
# python/fusedops/distributed/_linear_attention.py calls).

H, HV, K, V, BT = 2, 2, 8, 8, 32
CP = ["la_cp_fwd_summary", "la_cp_bwd_summary", "la_cp_fold_fwd", "la_cp_fold_bwd"]


def _fwd_seg(Ts=20, seed=0, kda_gate=False, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    ru = lambda *s: torch.rand(*s, generator=gen)  # noqa: E731
    x = {"k": torch.nn.functional.normalize(rn(1, Ts, H, K), dim=-1), "v": rn(1, Ts, HV, V),
         "g": -ru(1, Ts, HV, K) if kda_gate else -ru(1, Ts, HV), "beta": ru(1, Ts, HV), "A_log": None,
         "dt_bias": None, "summary": torch.full((HV * K * (K + V),), NAN)}
    return {n: (t.to(device) if t is not None else None) for n, t in x.items()}


def _fwd_summary(x: dict, chunk_size=BT, workspace=None, **flags) -> torch.Tensor:
    opts = dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                allow_neg_eigval=False, safe_gate=False, has_lower_bound=False, lower_bound=0.0)
    opts.update(flags)
    t = [x[n] for n in ("k", "v", "g", "beta", "A_log", "dt_bias", "summary")] + [None]
    n = _C.la_cp_fwd_summary_workspace_size(t, chunk_size, opts["use_qk_l2norm_in_kernel"],
                                            opts["use_gate_in_kernel"], opts["use_beta_sigmoid_in_kernel"])
    t[-1] = workspace if workspace is not None else (la.workspace(n, x["k"].device) if n else None)
    _C.la_cp_fwd_summary(context("la_cp_fwd_summary", x["k"]), t, chunk_size=chunk_size, **opts)
    return x["summary"]


def _bwd_seg(Ts=20, seed=1, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    ru = lambda *s: torch.rand(*s, generator=gen)  # noqa: E731
    x = {"q": rn(1, Ts, H, K), "k": rn(1, Ts, H, K) * 0.3, "v": rn(1, Ts, HV, V), "beta": ru(1, Ts, HV),
         "g_cumsum": -ru(1, Ts, HV).cumsum(1), "A": torch.tril(rn(1, Ts, HV, BT) * 0.1), "Aqk": None, "w": None,
         "dout": rn(1, Ts, HV, V), "dht": None, "dh0": torch.full((1, HV, K, V), NAN)}
    return {n: (t.to(device) if t is not None else None) for n, t in x.items()}


def _bwd_summary(x: dict, chunk_size=BT, scale=0.5) -> torch.Tensor:
    t = [x[n] for n in ("q", "k", "v", "beta", "g_cumsum", "A", "Aqk", "w", "dout", "dht", "dh0")] + [None]
    n = _C.la_cp_bwd_summary_workspace_size(t, chunk_size)
    t[-1] = la.workspace(n, x["q"].device) if n else None
    _C.la_cp_bwd_summary(context("la_cp_bwd_summary", x["q"]), t, scale=scale, chunk_size=chunk_size)
    return x["dh0"]


def _fold_fwd(summaries, h0, lo, hi, state=None):
    state = torch.full((HV, K, V), NAN, device=summaries.device) if state is None else state
    _C.la_cp_fold_fwd(context("la_cp_fold", summaries), summaries, h0, lo, hi, state)
    return state


def _fold_bwd(summaries, dh0s, lo, hi, dstate=None):
    dstate = torch.full((HV, K, V), NAN, device=summaries.device) if dstate is None else dstate
    _C.la_cp_fold_bwd(context("la_cp_fold", summaries), summaries, dh0s, lo, hi, dstate)
    return dstate


def _fold_inputs(R=3, seed=2, device="cpu"):
    rn = _rn(seed)
    return rn(R, HV * K * (K + V)).to(device) * 0.3, rn(R, HV * K * V).to(device)


def _cp_call(op: str, **change):
    """One call of op with the given inputs replaced (a small valid call without any)."""
    if op == "la_cp_fwd_summary":
        return _fwd_summary(dict(_fwd_seg(), **change))
    if op == "la_cp_bwd_summary":
        return _bwd_summary(dict(_bwd_seg(), **change))
    s, L = _fold_inputs()
    x = dict(summaries=s, lo=0, hi=3)
    x.update(change)
    if op == "la_cp_fold_fwd":
        return _fold_fwd(x["summaries"], x.get("h0"), x["lo"], x["hi"], x.get("state"))
    return _fold_bwd(x["summaries"], x.get("dh0s", L), x["lo"], x["hi"], x.get("dstate"))


# (op, input replaced, its bad value, error type, message) for the rank, shape and dtype rows.
CP_ERRORS = [
    ("la_cp_fwd_summary", "k", torch.randn(20, H, K), ValueError, r"k must have rank 4, got rank 3"),
    ("la_cp_fwd_summary", "k", torch.randn(2, 20, H, K), ValueError, r"the segment must have batch size 1 .*got B=2"),
    ("la_cp_fwd_summary", "v", torch.randn(1, 19, HV, V), ValueError, r"v must have shape \[1,20,2,8\], got \[1,19,2,8\]"),
    ("la_cp_fwd_summary", "g", torch.randn(1, 20, 3), ValueError, r"g must have shape \[1,20,2\], got \[1,20,3\]"),
    ("la_cp_fwd_summary", "g", torch.randn(1, 20), ValueError, r"g must be \[1,Ts,HV\] .* or \[1,Ts,HV,K\]"),
    ("la_cp_fwd_summary", "beta", torch.rand(1, 20, 3), ValueError, r"beta must have shape \[1,20,2\]"),
    ("la_cp_fwd_summary", "k", torch.randn(1, 20, H, 300), ValueError, r"K must be in \[1, 256\]"),
    ("la_cp_fwd_summary", "summary", torch.empty(10), ValueError, r"summary must have shape \[256\], got \[10\]"),
    ("la_cp_fwd_summary", "k", torch.ones(1, 20, H, K, dtype=torch.int32), TypeError, r"k must have dtype in"),
    ("la_cp_fwd_summary", "beta", torch.ones(1, 20, HV, dtype=torch.int32), TypeError, r"beta must have dtype in"),
    ("la_cp_fwd_summary", "v", torch.randn(1, 20, HV, V).bfloat16(), TypeError, r"v must have the dtype of k"),
    ("la_cp_fwd_summary", "summary", torch.empty(256, dtype=torch.float64), ValueError, r"summary must be float32"),
    ("la_cp_bwd_summary", "q", torch.randn(20, H, K), ValueError, r"q must have rank 4, got rank 3"),
    ("la_cp_bwd_summary", "q", torch.randn(2, 20, H, K), ValueError, r"the segment must have batch size 1 .*got B=2"),
    ("la_cp_bwd_summary", "A", torch.randn(1, 20, HV, 16), ValueError, r"A must have shape \[1,20,2,32\]"),
    ("la_cp_bwd_summary", "dout", torch.randn(1, 20, HV, V + 1), ValueError, r"dout must have shape \[1,20,2,8\]"),
    ("la_cp_bwd_summary", "dht", torch.ones(1, HV, K, V + 1), ValueError, r"dht must have shape \[1,2,8,8\]"),
    ("la_cp_bwd_summary", "Aqk", torch.randn(1, 20, HV, BT), ValueError, r"Aqk is KDA's .* must not be given"),
    ("la_cp_bwd_summary", "g_cumsum", torch.randn(1, 20, HV, K), ValueError, r"Aqk is required"),
    ("la_cp_bwd_summary", "dout", torch.ones(1, 20, HV, V, dtype=torch.int32), TypeError, r"dout must have dtype in"),
    ("la_cp_bwd_summary", "k", torch.randn(1, 20, H, K).double(), TypeError, r"k must have the dtype of q"),
    ("la_cp_bwd_summary", "dh0", torch.empty(1, HV, K, V, dtype=torch.float64), ValueError, r"dh0 must be float32"),
    ("la_cp_fold_fwd", "summaries", torch.randn(256), ValueError, r"summaries must have rank 2, got rank 1"),
    ("la_cp_fold_fwd", "state", torch.empty(HV * K, V), ValueError, r"state must have rank 3"),
    ("la_cp_fold_fwd", "summaries", torch.randn(3, 255), ValueError, r"summaries must have shape \[3,256\]"),
    ("la_cp_fold_fwd", "h0", torch.ones(HV, K, V + 1), ValueError, r"h0 must have shape \[2,8,8\], got \[2,8,9\]"),
    ("la_cp_fold_fwd", "summaries", torch.randn(3, 256).bfloat16(), TypeError, r"summaries must have dtype in \{float32, float64\}"),
    ("la_cp_fold_fwd", "h0", torch.ones(HV, K, V, dtype=torch.int32), TypeError, r"h0 must have dtype in"),
    ("la_cp_fold_fwd", "state", torch.empty(HV, K, V, dtype=torch.float64), ValueError, r"state must be float32"),
    ("la_cp_fold_bwd", "dh0s", torch.randn(2, 128), ValueError, r"dh0s must have shape \[3,128\] \(\[R, HV\*K\*V\]\)"),
    ("la_cp_fold_bwd", "dh0s", torch.randn(3, 128).double(), TypeError, r"dh0s must have the dtype of summaries"),
    ("la_cp_fold_bwd", "dstate", torch.empty(HV, K), ValueError, r"dstate must have rank 3"),
]


@pytest.mark.parametrize("case", CP_ERRORS, ids=lambda c: c if isinstance(c, str) else None)
def test_cp_rank_shape_and_dtype_errors(case):
    op, name, bad, err, message = case
    with pytest.raises(err, match=f"fusedops: {op}: {message}"):
        _cp_call(op, **{name: bad})


@pytest.mark.skipif(bool(CUDA_REASON), reason=CUDA_REASON)
@pytest.mark.parametrize("op", CP)
def test_cp_inputs_on_two_devices_raise(op):
    with pytest.raises(ValueError, match="must be on"):
        if op == "la_cp_fwd_summary":
            _fwd_summary(dict(_fwd_seg(device="cuda"), summary=torch.empty(256)))
        elif op == "la_cp_bwd_summary":
            _bwd_summary(dict(_bwd_seg(device="cuda"), dout=torch.randn(1, 20, HV, V)))
        elif op == "la_cp_fold_fwd":
            _cp_call(op, summaries=_fold_inputs(device="cuda")[0], state=torch.empty(HV, K, V))
        else:
            s, L = _fold_inputs(device="cuda")
            _cp_call(op, summaries=s, dh0s=L.cpu(), dstate=torch.empty(HV, K, V, device="cuda"))


def test_cp_layouts():
    """Strided tokens and heads are read in place (the summaries equal the contiguous call's); a
    strided last dimension and non-contiguous outputs or summaries raise."""
    x = _fwd_seg()
    want = _fwd_summary(dict(x)).clone()
    padded = torch.zeros(1, 20, H + 1, K)
    padded[:, :, :H] = x["k"]
    assert torch.equal(_fwd_summary(dict(x, k=padded[:, :, :H], summary=torch.empty(256))), want)
    with pytest.raises(ValueError, match="la_cp_fwd_summary: k must have a contiguous last dimension"):
        _fwd_summary(dict(x, k=_strided(x["k"])))
    with pytest.raises(ValueError, match="la_cp_fwd_summary: summary must be contiguous"):
        _fwd_summary(dict(x, summary=torch.empty(512)[::2]))
    with pytest.raises(ValueError, match="la_cp_bwd_summary: q must have a contiguous last dimension"):
        _cp_call("la_cp_bwd_summary", q=_strided(torch.randn(1, 20, H, K)))
    with pytest.raises(ValueError, match="la_cp_bwd_summary: dht must be contiguous"):
        _cp_call("la_cp_bwd_summary", dht=_strided(torch.ones(1, HV, K, V)))
    with pytest.raises(ValueError, match="la_cp_fold_fwd: summaries must be contiguous"):
        _cp_call("la_cp_fold_fwd", summaries=_strided(torch.randn(3, 256)))
    with pytest.raises(ValueError, match="la_cp_fold_fwd: h0 must be contiguous"):
        _cp_call("la_cp_fold_fwd", h0=_strided(torch.ones(HV, K, V)))
    with pytest.raises(ValueError, match="la_cp_fold_fwd: state must be contiguous"):
        _cp_call("la_cp_fold_fwd", state=_strided(torch.empty(HV, K, V)))
    with pytest.raises(ValueError, match="la_cp_fold_bwd: dh0s must be contiguous"):
        _cp_call("la_cp_fold_bwd", dh0s=_strided(torch.randn(3, 128)))


@pytest.mark.parametrize("kda_gate", [False, True])
def test_cp_empty_segments_and_ranges(kda_gate):
    """A segment of no tokens: M = I, S_loc = 0; L = dht (0 without it); an empty fold range:
    the state is h0 (0 without it), the gradient 0."""
    s = _fwd_summary(_fwd_seg(0, kda_gate=kda_gate))
    eye = torch.eye(K).expand(HV, K, K).reshape(-1)
    assert torch.equal(s[: HV * K * K], eye) and not s[HV * K * K:].any()
    assert not _bwd_summary(_bwd_seg(0)).any()
    dht = torch.randn(1, HV, K, V)
    assert torch.equal(_bwd_summary(dict(_bwd_seg(0), dht=dht)), dht)
    summaries, L = _fold_inputs()
    h0 = torch.randn(HV, K, V)
    for lo in range(4):
        assert torch.equal(_fold_fwd(summaries, h0, lo, lo), h0)
        assert not _fold_fwd(summaries, None, lo, lo).any()
        assert not _fold_bwd(summaries, L, lo, lo).any()
    assert torch.equal(_fold_fwd(summaries[:0], h0, 0, 0), h0)  # R = 0 ranks
    # HV = 0 heads: nothing to fold, nothing written
    assert _fold_fwd(torch.randn(3, 0), None, 0, 3, torch.empty(0, K, V)).numel() == 0


def test_cp_option_and_range_values():
    for bad in (0, -1, 7):  # 0 divided the dimensions before the check (SIGFPE)
        with pytest.raises(ValueError, match=f"la_cp_fwd_summary: chunk_size must be 16, 32 or 64, got {bad}"):
            _fwd_summary(_fwd_seg(), chunk_size=bad)
        with pytest.raises(ValueError, match=f"la_cp_bwd_summary: chunk_size must be 16, 32 or 64, got {bad}"):
            _bwd_summary(_bwd_seg(), chunk_size=bad)
    with pytest.raises(ValueError, match="la_cp_fwd_summary: allow_neg_eigval requires use_beta_sigmoid_in_kernel"):
        _fwd_summary(_fwd_seg(), allow_neg_eigval=True)
    with pytest.raises(ValueError, match="la_cp_fwd_summary: use_gate_in_kernel requires A_log"):
        _fwd_summary(_fwd_seg(), use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=r"la_cp_fwd_summary: workspace must hold at least \d+ bytes"):
        _fwd_summary(_fwd_seg(), workspace=torch.empty(10, dtype=torch.uint8))
    with pytest.raises(ValueError, match="la_cp_bwd_summary: scale must be finite"):
        _bwd_summary(_bwd_seg(), scale=NAN)
    # dout may have its own float dtype (the top level's gradient dtype; its intermediates are then bf16):
    # the same L as the fp32 call on the same values, within bf16 rounding
    d = _bwd_seg()
    want = _bwd_summary(dict(d, dout=d["dout"].bfloat16().float())).clone()
    torch.testing.assert_close(_bwd_summary(dict(d, dout=d["dout"].bfloat16())), want, rtol=3e-2, atol=1e-3)
    with pytest.raises(ValueError, match="v has HV=3 heads, which is not a multiple of the 2 heads of k"):
        _fwd_summary(dict(_fwd_seg(), v=torch.randn(1, 20, 3, V), g=-torch.rand(1, 20, 3), beta=torch.rand(1, 20, 3),
                          summary=torch.empty(3 * K * (K + V))))
    for op in ("la_cp_fold_fwd", "la_cp_fold_bwd"):
        for lo, hi in ((2, 1), (0, 4), (-1, 1)):
            with pytest.raises(ValueError, match=rf"{op}: the fold range must satisfy 0 <= lo <= hi <= R=3, "
                                                 rf"got lo={lo}, hi={hi}"):
                _cp_call(op, lo=lo, hi=hi)


def test_cp_nonfinite_propagate():
    """NaN / Inf reach exactly what depends on them: a NaN value channel of one token makes S_loc
    NaN in that head's value column only (M is the clean call's, bit for bit); an Inf key makes
    that head's M and S_loc non-finite; a NaN dout of head 0 makes L NaN in head 0 only; a NaN in
    one rank's summary reaches the folds that cross that rank only."""
    M = HV * K * K
    clean = _fwd_summary(_fwd_seg()).clone()
    x = _fwd_seg()
    x["v"][0, 3, 0, 5] = NAN
    s = _fwd_summary(x)
    assert torch.equal(s[:M], clean[:M])
    S = s[M:].view(HV, K, V)
    assert S[0, :, 5].isnan().all() and S.isnan().sum() == K
    assert torch.equal(S[1], clean[M:].view(HV, K, V)[1])
    x = _fwd_seg()
    x["k"][0, 3, 1, 0] = INF
    s = _fwd_summary(x)
    assert not s[:M].view(HV, K, K)[1].isfinite().all() and s[:M].view(HV, K, K)[0].isfinite().all()
    d = _bwd_seg()
    d["dout"][0, 3, 0, 0] = NAN
    L = _bwd_summary(d)
    assert L[0, 0].isnan().any() and not L[0, 1].isnan().any()
    summaries, Ls = _fold_inputs()
    summaries[1, 5] = NAN
    Ls[1, 7] = INF
    assert _fold_fwd(summaries, None, 0, 3).isnan().any()
    assert torch.equal(_fold_fwd(summaries, None, 2, 3), _fold_fwd(summaries.clone(), None, 2, 3))
    assert not _fold_fwd(summaries, None, 2, 3).isnan().any()
    assert not _fold_bwd(summaries, Ls, 0, 3).isfinite().all()
    assert _fold_bwd(summaries, Ls, 2, 3).isfinite().all()


@pytest.mark.skipif(bool(CUDA_REASON), reason=LARGE_REASON)
def test_cp_fold_past_int32_elements_on_cuda():
    """summaries of 2^31 + 2^20 elements (R = 2049 ranks of HV*K*(K+V) = 2^20): folding the last
    rank alone, forward and backward, equals folding a copy of it at row 0 (64-bit offsets)."""
    hv, k, v = 32, 128, 128
    R = 2049
    summaries = torch.zeros(R, hv * k * (k + v), device="cuda")
    summaries[-1].normal_()
    state = torch.empty(hv, k, v, device="cuda")
    _C.la_cp_fold_fwd(context("la_cp_fold", summaries), summaries, None, R - 1, R, state)
    first = summaries[-1:].clone()
    want = torch.empty_like(state)
    _C.la_cp_fold_fwd(context("la_cp_fold", first), first, None, 0, 1, want)
    assert torch.equal(state, want) and want.abs().sum() > 0
    # The backward fold reads the same rows of M: L of R ranks, all zero but the last.
    L = torch.zeros(R, hv * k * v, device="cuda")
    L[-1].normal_()
    _C.la_cp_fold_bwd(context("la_cp_fold", summaries), summaries, L, R - 1, R, state)
    _C.la_cp_fold_bwd(context("la_cp_fold", first), first, L[-1:].clone(), 0, 1, want)
    assert torch.equal(state, want)
