"""Invalid and extreme inputs of the linear-attention operators (issue 39, items 1 and 2): the rows
of the "Invalid inputs" tables in src/ops/{gated_delta_rule,kda,linear_attention}/README.md.

The four top levels (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, chunk_kda,
fused_recurrent_kda) and the shared sub-operators (chunk_local_cumsum,
chunk_gated_delta_rule_fwd_h / _bwd_dhu, prepare_chunk_indices / _offsets) get every input
class: rank, shape, dtype, device, layout, empty tensors, varlen offsets and chunk tables,
NaN / Inf, and element counts past 2^31. Calls pass everything after q, k, v, g, beta by keyword
(the positional order beyond those follows flash-linear-attention's and may change).
"""

from __future__ import annotations

import re

import fusedops
import pytest
import torch
from fusedops import gated_delta_rule as gdn

CUDA_REASON = ("" if torch.cuda.is_available() and fusedops.built_with_cuda()
               else "needs a CUDA device and a CUDA build")
TOP = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda", "fused_recurrent_kda"]


def _backends(op: str, device: str) -> list[str]:
    """The backends registered for op (either direction) that can run here on device; never empty
    (the tests below would pass vacuously)."""
    ids = sorted({e["backend"] for e in fusedops.backends(op) if e["device"] == device and e["runnable_here"]})
    assert ids, f"no runnable backend of {op} on {device}"
    return ids


def _normal(seed: int, device: str):
    """rn(*shape, scale=1.0): normal fp32 tensors on device from one generator seeded with seed."""
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).float().to(device)

    return rn


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t's values with the last dimension strided (stride 2): the Python layer copies such inputs."""
    buf = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
    buf[..., 1::2] = t
    return buf[..., 1::2]


def _kda(op: str) -> bool:
    return "kda" in op


def _inputs(op: str, B=1, T=9, H=2, HV=2, K=8, V=8, dtype=torch.float32, device="cpu", N=None, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rn(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, dtype=torch.float64) * scale).to(device)

    N = B if N is None else N
    gshape = (B, T, HV, K) if _kda(op) else (B, T, HV)
    return {
        "q": rn(B, T, H, K, scale=0.3).to(dtype), "k": rn(B, T, H, K, scale=0.3).to(dtype),
        "v": rn(B, T, HV, V).to(dtype), "g": (-0.05 - 0.1 * rn(*gshape).abs()).float(),
        "beta": torch.sigmoid(rn(B, T, HV)).float(), "initial_state": (0.5 * rn(N, HV, K, V)).float(),
    }


def _call(op: str, x: dict, **kw):
    fn = getattr(fusedops, op)
    kw.setdefault("output_final_state", True)
    return fn(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], initial_state=x.get("initial_state"),
              scale=0.3, **kw)


# ---------------------------------------------------------------------------------------------
# values: cu_seqlens contents.

BAD_CU = [
    ([2, 5, 9], "cu_seqlens must start at 0"),
    ([0, 6, 3, 9], r"cu_seqlens must be non-decreasing, got cu_seqlens\[1\]=6 > cu_seqlens\[2\]=3"),
    ([0, 4, 8], r"cu_seqlens must end at T=9 \(the packed length\), got cu_seqlens\[2\]=8"),
    ([0, 4, 4096], r"cu_seqlens must end at T=9 \(the packed length\), got cu_seqlens\[2\]=4096"),
]


@pytest.mark.parametrize("op", TOP)
@pytest.mark.parametrize("cu,message", BAD_CU, ids=["start", "decreasing", "short", "long"])
def test_bad_cu_seqlens_raise_before_any_work(device, op, cu, message):
    """On every device: the Python layer reads cu_seqlens' values on the host (once per tensor, to
    build the chunk tables) and checks them against T at every call; under debug checks too."""
    x = _inputs(op, device=device, N=len(cu) - 1)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=message):
        _call(op, x, cu_seqlens=cu_t)
    with fusedops.debug_checks(), pytest.raises(ValueError, match=message):
        _call(op, x, cu_seqlens=cu_t)


@pytest.mark.parametrize("op", ["chunk_local_cumsum", "chunk_gated_delta_rule_fwd_h",
                                "chunk_gated_delta_rule_bwd_dhu"])
def test_shared_sub_operators_reject_bad_cu_seqlens(device, op):
    T = 9
    g = -torch.rand(1, T, 2, device=device)
    k = torch.randn(1, T, 2, 8, device=device)
    cu = torch.tensor([0, 6, 3, 9], device=device)
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        if op == "chunk_local_cumsum":
            gdn.chunk_local_cumsum(g, 32, cu_seqlens=cu)
        elif op == "chunk_gated_delta_rule_fwd_h":
            gdn.chunk_gated_delta_rule_fwd_h(k=k, w=k, u=torch.randn(1, T, 2, 8, device=device), g=g,
                                             chunk_size=32, cu_seqlens=cu)
        else:
            gdn.chunk_gated_delta_rule_bwd_dhu(q=k, k=k, w=k, do=torch.randn(1, T, 2, 8, device=device),
                                               dv=torch.randn(1, T, 2, 8, device=device), g=g,
                                               cu_seqlens=cu, chunk_size=32)


def test_chunk_tables_that_do_not_match_cu_seqlens(device):
    """The Python layer builds the chunk tables from cu_seqlens' checked host values (kept per
    tensor) and the kernels read those: a caller's chunk_indices / chunk_offsets (flash-linear-
    attention's precomputed tables) must have their table's shape (else ValueError) and their
    contents are not used, so wrong contents give the correct result. (The C++ entry points read
    the caller's tables: LinearAttentionInvalid.ChunkTablesThatDoNotMatchCuSeqlensRaiseOnTheCpu.)"""
    g = -torch.rand(1, 70, 2, device=device)
    cu = torch.tensor([0, 30, 30, 70], device=device)
    good = gdn.prepare_chunk_indices(cu, 32)
    assert good.tolist() == [[0, 0], [2, 0], [2, 1]]
    bad = torch.tensor([[0, 0], [2, 0], [2, 7]], device=device)
    want = gdn.chunk_local_cumsum(g, 32, cu_seqlens=cu)
    assert torch.equal(gdn.chunk_local_cumsum(g, 32, cu_seqlens=cu, chunk_indices=bad), want)
    with pytest.raises(ValueError, match=re.escape("chunk_indices must be the [NT, 2] = [3, 2] table of cu_seqlens")):
        gdn.chunk_local_cumsum(g, 32, cu_seqlens=cu, chunk_indices=good[:2])
    k = torch.randn(1, 70, 2, 8, device=device)
    u = torch.randn(1, 70, 2, 8, device=device)
    h = gdn.chunk_gated_delta_rule_fwd_h(k=k, w=k, u=u, g=g, chunk_size=32, cu_seqlens=cu)[0]
    offs = torch.tensor([0, 1, 1, 4], device=device)
    assert torch.equal(gdn.chunk_gated_delta_rule_fwd_h(k=k, w=k, u=u, g=g, chunk_size=32, cu_seqlens=cu,
                                                        chunk_offsets=offs)[0], h)
    with pytest.raises(ValueError, match=re.escape("chunk_offsets must be the [N+1] = [4] table of cu_seqlens")):
        gdn.chunk_gated_delta_rule_fwd_h(k=k, w=k, u=u, g=g, chunk_size=32, cu_seqlens=cu, chunk_offsets=offs[:3])


@pytest.mark.skipif(bool(CUDA_REASON), reason=CUDA_REASON or "-")
def test_cuda_sub_operator_rejects_bad_cu_seqlens_at_the_call():
    """chunk_local_cumsum on CUDA reads cu_seqlens' values on the host (to build its tables) and
    raises at the call, with or without debug checks, and leaves no device report."""
    g = -torch.rand(1, 70, 2, device="cuda")
    cu = torch.tensor([0, 30, 90], device="cuda")
    fusedops.check_errors()
    for ctx in (fusedops.debug_checks(False), fusedops.debug_checks()):
        with ctx, pytest.raises(ValueError, match=r"cu_seqlens must end at T=70 \(the packed length\), got cu_seqlens\[2\]=90"):
            gdn.chunk_local_cumsum(g, 32, cu_seqlens=cu)
    fusedops.check_errors()


@pytest.mark.parametrize("fn", ["prepare_chunk_indices", "prepare_chunk_offsets"])
def test_table_builders_reject_bad_cu_seqlens(fn):
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        getattr(gdn, fn)(torch.tensor([0, 5, 2]), 32)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        getattr(gdn, fn)(torch.tensor([1, 5]), 32)
    with pytest.raises(ValueError, match="rank-1 int32/int64"):
        getattr(gdn, fn)(torch.tensor([0.0, 5.0]), 32)


# ---------------------------------------------------------------------------------------------
# rank, shape, dtype.


@pytest.mark.parametrize("op", TOP)
def test_rank_shape_and_dtype_errors(op):
    x = _inputs(op)
    bad = dict(x, q=x["q"][0])
    with pytest.raises(ValueError, match="rank|must have shape|\\[B,T,H,K\\]"):
        _call(op, bad)
    bad = dict(x, g=x["g"][..., :1] if not _kda(op) else x["g"][..., :3])
    with pytest.raises(ValueError, match="g must have shape"):
        _call(op, bad)
    bad = dict(x, v=x["v"].bfloat16())
    if "recurrent" in op:  # the per-token forms read every tensor in its own float dtype
        assert torch.equal(_call(op, bad)[0], _call(op, dict(bad, v=bad["v"].float()))[0])
    else:
        with pytest.raises((TypeError, ValueError), match="v must have the dtype of q"):
            _call(op, bad)
    bad = dict(x, q=x["q"].to(torch.int32), k=x["k"].to(torch.int32), v=x["v"].to(torch.int32))
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        _call(op, bad)
    bad = dict(x, initial_state=torch.zeros(3, 2, 8, 8))
    with pytest.raises(ValueError, match=r"initial_state must have shape"):
        _call(op, bad)
    with pytest.raises(ValueError, match="with cu_seqlens the batch size must be 1"):
        _call(op, _inputs(op, B=2), cu_seqlens=torch.tensor([0, 9]))
    cu_f = torch.tensor([0.0, 9.0])
    with pytest.raises((TypeError, ValueError), match="int32/int64|int32, int64"):
        _call(op, x, cu_seqlens=cu_f)
    with pytest.raises((TypeError, ValueError), match="rank"):
        _call(op, dict(x, initial_state=None), cu_seqlens=torch.tensor([[0, 9]]))


# ---------------------------------------------------------------------------------------------
# layout: strided inputs are read in place or copied; the result equals the contiguous call's.


@pytest.mark.parametrize("op", TOP)
def test_strided_inputs_match_contiguous(device, op):
    x = _inputs(op, B=2, T=40, device=device)
    o, ht = _call(op, x)
    y = {n: _strided(t) for n, t in x.items()}
    y["q"] = x["q"].transpose(0, 1).contiguous().transpose(0, 1)  # B and T swapped in memory
    o2, ht2 = _call(op, y)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


# ---------------------------------------------------------------------------------------------
# empty: T = 0, B = 0, empty sequences.


@pytest.mark.parametrize("op", TOP)
@pytest.mark.parametrize("shape", [(2, 0, None), (0, 9, None), (1, 0, [0, 0, 0]), (1, 40, [0, 0, 40, 40])],
                         ids=["T0", "B0", "varlen-T0", "empty-sequences"])
def test_empty_inputs(device, op, shape):
    B, T, cu = shape
    N = B if cu is None else len(cu) - 1
    x = _inputs(op, B=B, T=T, device=device, N=N)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    cu_t = None if cu is None else torch.tensor(cu, device=device)
    o, ht = _call(op, leaves, cu_seqlens=cu_t)
    assert o.shape == x["v"].shape and ht.shape == x["initial_state"].shape
    empty = [n for n in range(N) if cu is None and T == 0 or cu is not None and cu[n] == cu[n + 1]]
    for n in empty:
        assert torch.equal(ht[n].detach(), x["initial_state"][n]), f"sequence {n}"
    dht = torch.randn_like(ht)
    (o.sum() + (ht * dht).sum()).backward()
    for n in empty:
        assert torch.equal(leaves["initial_state"].grad[n], dht[n]), f"dh0 of sequence {n}"
    for n, t in leaves.items():
        assert t.grad is not None and t.grad.shape == t.shape and torch.isfinite(t.grad).all(), n


# ---------------------------------------------------------------------------------------------
# nonfinite: the float64 reference's NaN / Inf pattern, and untouched sequences bit for bit.


@pytest.mark.parametrize("op", TOP)
@pytest.mark.parametrize("where", ["k", "v", "q"])
def test_nonfinite_inputs_propagate_like_the_reference(device, runnable_backends, op, where):
    x = _inputs(op, B=3, T=40, device=device)
    dirty = dict(x)
    p = x[where].clone()
    p[0, 5, 0, 3] = float("nan")   # batch row 0
    p[1, 7, 1, 2] = float("inf")   # batch row 1; row 2 stays clean
    dirty[where] = p
    names = ("q", "k", "v", "g", "beta", "initial_state")

    def run(module, inputs, cast=lambda t: t):
        leaves = {n: cast(t).clone().requires_grad_() for n, t in inputs.items()}
        o, ht = getattr(module, op)(q=leaves["q"], k=leaves["k"], v=leaves["v"], g=leaves["g"],
                                    beta=leaves["beta"], initial_state=leaves["initial_state"], scale=0.3,
                                    output_final_state=True)
        gen = torch.Generator().manual_seed(1)
        do = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device, o.dtype)
        grads = torch.autograd.grad((o * do).sum() + ht.sum(), [leaves[n] for n in names])
        return [o.detach(), ht.detach(), *grads]

    ref = run(fusedops.reference, dirty, lambda t: t.cpu().double())
    assert runnable_backends(op, device)
    for backend in runnable_backends(op, device):
        with fusedops.use_backend(**{op: backend}):
            ours = run(fusedops, dirty)
            clean = run(fusedops, x)
        for i, (a, r, c) in enumerate(zip(ours, ref, clean)):
            what = f"{op} {backend} {where} output/gradient {i}"
            a = a.cpu()
            if "recurrent" in op:  # exactly the reference's NaN and Inf
                assert torch.equal(torch.isnan(a), torch.isnan(r)), \
                    f"{what}: NaN at {torch.isnan(a).nonzero().tolist()[:8]}, reference {torch.isnan(r).nonzero().tolist()[:8]}"
                assert torch.equal(torch.isinf(a), torch.isinf(r)), f"{what}: Inf pattern differs"
            elif i < 2:
                # o and final_state: every value the reference makes non-finite is non-finite; the
                # chunk products may also carry it to the earlier tokens of the poisoned chunk (a
                # zero weight times NaN). The gradients of the poisoned sequence are not compared:
                # where a zero weight meets NaN differs between the float64 and fp32 chunk
                # algorithms (and the per-token recurrence), and no pattern is the one truth.
                missing = ~torch.isfinite(r) & torch.isfinite(a)
                assert not missing.any(), f"{what}: finite at {missing.nonzero().tolist()[:8]} where the reference is not"
            # batch row 2 (and its state) never meets the poison: bit for bit a clean call's
            assert torch.equal(a[2], c[2].cpu()), f"{what}: batch row 2 differs from a clean call"


# ---------------------------------------------------------------------------------------------
# device: tensors of one call on two devices.


@pytest.mark.skipif(bool(CUDA_REASON), reason=CUDA_REASON or "-")
@pytest.mark.parametrize("op", TOP)
def test_tensors_on_two_devices_raise(op):
    x = _inputs(op, device="cuda")
    for name in x:
        mixed = dict(x, **{name: x[name].cpu()})
        with pytest.raises((ValueError, RuntimeError), match="must be on|same device|Expected all tensors"):
            _call(op, mixed)
    with pytest.raises((ValueError, RuntimeError), match="must be on|same device|Expected all tensors"):
        gdn.chunk_local_cumsum(x["g"], 32, cu_seqlens=torch.tensor([0, 9]),
                               chunk_indices=torch.tensor([[0, 0]], device="cuda"))
    # the shared sub-operators: each of their tensors on the CPU in a CUDA call
    y = _sub_inputs(device="cuda")
    for sub in SUBOPS:
        for name in ("g", "k", "w"):
            with pytest.raises((ValueError, RuntimeError), match="must be on|same device|Expected all tensors"):
                _run_sub(sub, dict(y, **{name: y[name].cpu()}))
    for ops, inputs, run, main in CHUNK_SUBOPS.values():
        z = inputs(device="cuda")
        for sub in ops:
            with pytest.raises((ValueError, RuntimeError), match="must be on|same device|Expected all tensors"):
                run(sub, dict(z, **{main(sub): z[main(sub)].cpu()}))


# ---------------------------------------------------------------------------------------------
# int32: element counts past 2^31.


@pytest.mark.skipif(bool(CUDA_REASON), reason="2^31 output elements need >= 4 GiB: CUDA only (a CPU run "
                    "would need the same host memory and minutes of CI time)")
@pytest.mark.parametrize("op", TOP)
def test_outputs_past_int32_elements_on_cuda(op):
    """o of more than 2^31 elements from inputs whose batch rows repeat one row (expanded views):
    the last batch row equals the first, and both equal a call on that row alone."""
    T, HV, V = 64, 2, 64
    B = 2 ** 31 // (T * HV * V) + 2
    one = _inputs(op, B=1, T=T, H=2, HV=HV, K=64, V=V, dtype=torch.bfloat16, device="cuda")
    big = {n: t.expand(B, *t.shape[1:]) for n, t in one.items() if n != "initial_state"}
    big["initial_state"] = None
    with torch.no_grad():
        o, _ = _call(op, big, output_final_state=False)
        o1, _ = _call(op, dict(one, initial_state=None), output_final_state=False)
    assert torch.equal(o[-1], o[0]) and torch.equal(o[-1], o1[0])
    fusedops.check_errors()


# ---------------------------------------------------------------------------------------------
# The shared sub-operators: chunk_local_cumsum, chunk_gated_delta_rule_fwd_h / _bwd_dhu.

SUBOPS = ["chunk_local_cumsum", "chunk_gated_delta_rule_fwd_h", "chunk_gated_delta_rule_bwd_dhu"]


def _sub_inputs(B=1, T=70, device="cpu", N=None, seed=0):
    rn = _normal(seed, device)

    N = B if N is None else N
    return {"g": -0.05 - 0.1 * rn(B, T, 2).abs(), "q": rn(B, T, 2, 8, scale=0.3), "k": rn(B, T, 2, 8, scale=0.3),
            "w": rn(B, T, 2, 8, scale=0.3), "u": rn(B, T, 2, 8), "do": rn(B, T, 2, 8), "dv": rn(B, T, 2, 8),
            "h0": rn(N, 2, 8, 8), "dht": rn(N, 2, 8, 8)}


def _run_sub(op, x, **kw):
    if op == "chunk_local_cumsum":
        return (gdn.chunk_local_cumsum(x["g"], 32, **kw),)
    if op == "chunk_gated_delta_rule_fwd_h":
        return gdn.chunk_gated_delta_rule_fwd_h(k=x["k"], w=x["w"], u=x["u"], g=x["g"], initial_state=x["h0"],
                                                output_final_state=True, chunk_size=32, **kw)
    return gdn.chunk_gated_delta_rule_bwd_dhu(q=x["q"], k=x["k"], w=x["w"], do=x["do"], dv=x["dv"], g=x["g"],
                                              h0=x["h0"], dht=x["dht"], scale=0.3, chunk_size=32, **kw)


@pytest.mark.parametrize("op", SUBOPS)
def test_sub_operator_rank_shape_and_dtype_errors(op):
    x = _sub_inputs()
    main = {"chunk_local_cumsum": "g", "chunk_gated_delta_rule_fwd_h": "k", "chunk_gated_delta_rule_bwd_dhu": "k"}[op]
    with pytest.raises(ValueError, match="rank"):
        _run_sub(op, dict(x, **{main: x[main][0]}))
    other = {"chunk_local_cumsum": None, "chunk_gated_delta_rule_fwd_h": "u", "chunk_gated_delta_rule_bwd_dhu": "do"}[op]
    if other:
        with pytest.raises(ValueError, match=f"{other if other != 'do' else 'dout'} must have shape"):
            _run_sub(op, dict(x, **{other: x[other][:, :-1]}))
    else:  # chunk_indices of another shape
        cu = torch.tensor([0, 30, 70])
        with pytest.raises(ValueError, match=r"chunk_indices must be the \[NT, 2\] = \[3, 2\] table"):
            _run_sub(op, x, cu_seqlens=cu, chunk_indices=torch.zeros(3, 3, dtype=torch.int64))
    with pytest.raises((TypeError, ValueError)):
        _run_sub(op, dict(x, g=x["g"].to(torch.int32), k=x["k"].to(torch.int32)))
    with pytest.raises((TypeError, ValueError), match="int32/int64|int32, int64"):
        _run_sub(op, x, cu_seqlens=torch.tensor([0.0, 70.0]))


@pytest.mark.parametrize("op", SUBOPS)
def test_sub_operator_strided_inputs_match_contiguous(device, op):
    x = _sub_inputs(B=2, device=device)
    y = {n: _strided(t) for n, t in x.items()}
    y["k"] = x["k"].transpose(0, 1).contiguous().transpose(0, 1)
    for a, b in zip(_run_sub(op, x), _run_sub(op, y)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("op", SUBOPS)
@pytest.mark.parametrize("shape", [(2, 0, None), (1, 0, [0, 0]), (1, 70, [0, 0, 70, 70])],
                         ids=["T0", "varlen-T0", "empty-sequences"])
def test_sub_operator_empty_inputs(device, op, shape):
    B, T, cu = shape
    N = B if cu is None else len(cu) - 1
    x = _sub_inputs(B=B, T=T, device=device, N=N)
    outs = _run_sub(op, x, cu_seqlens=None if cu is None else torch.tensor(cu, device=device))
    for o in outs:
        assert o is not None and torch.isfinite(o).all()
    if op != "chunk_local_cumsum":
        empty = [n for n in range(N) if cu is None or cu[n] == cu[n + 1]]
        end = outs[2] if op == "chunk_gated_delta_rule_fwd_h" else outs[1]  # final state / dh0
        start = x["h0"] if op == "chunk_gated_delta_rule_fwd_h" else x["dht"]
        for n in empty:
            assert torch.equal(end[n], start[n]), f"sequence {n}"


@pytest.mark.parametrize("op", SUBOPS)
def test_sub_operator_nonfinite_like_the_ref_backend(device, op):
    """NaN in one gate (cumsum) or key (the state recurrences) of batch row 0, +Inf in row 1: every
    backend gives the float64 ref backend's NaN / Inf pattern; row 2 is bit for bit a clean call's."""
    x = _sub_inputs(B=3, device=device)
    dirty = dict(x)
    name = "g" if op == "chunk_local_cumsum" else "k"
    p = x[name].clone()
    p[(0, 40) + (0,) * (p.dim() - 2)] = float("nan")
    p[(1, 7) + (1,) * (p.dim() - 2)] = float("inf")
    dirty[name] = p
    with fusedops.use_backend(**{op: "ref"}):
        ref = [t.cpu() for t in _run_sub(op, {n: t.cpu().double() if n in ("g", "q", "k", "w", "u", "do", "dv") else
                                                 t.cpu() for n, t in dirty.items()})]
    for backend in _backends(op, device):
        with fusedops.use_backend(**{op: backend}):
            ours, clean = _run_sub(op, dirty), _run_sub(op, x)
        for i, (a, r, c) in enumerate(zip(ours, ref, clean)):
            what = f"{op} {backend} output {i}"
            a = a.cpu()
            assert torch.equal(torch.isnan(a), torch.isnan(r)), \
                f"{what}: NaN at {torch.isnan(a).nonzero().tolist()[:6]}, ref {torch.isnan(r).nonzero().tolist()[:6]}"
            assert torch.equal(torch.isinf(a), torch.isinf(r)), f"{what}: Inf pattern differs"
            if a.shape[0] == 3:
                assert torch.equal(a[2], c.cpu()[2]), f"{what}: batch row 2 differs from a clean call"


@pytest.mark.skipif(bool(CUDA_REASON), reason="2^31 output elements need >= 4 GiB: CUDA only (a CPU run "
                    "would need the same host memory and minutes of CI time)")
@pytest.mark.parametrize("op", SUBOPS)
def test_sub_operator_outputs_past_int32_elements_on_cuda(op):
    """Outputs of more than 2^31 elements from inputs whose batch rows repeat one row (expanded):
    the last batch row equals the first."""
    x1 = _sub_inputs(B=1, T=64, device="cuda")
    per = {"chunk_local_cumsum": 64 * 2, "chunk_gated_delta_rule_fwd_h": 64 * 2 * 8,
           "chunk_gated_delta_rule_bwd_dhu": 64 * 2 * 8}[op]
    B = 2 ** 31 // per + 2
    x = {n: t.expand(B, *t.shape[1:]) for n, t in x1.items()}
    x["h0"] = x["dht"] = None
    with torch.no_grad():
        outs = _run_sub(op, x)
    for o in outs:
        if o is not None and o.shape[0] == B:
            assert torch.equal(o[-1], o[0])
    fusedops.check_errors()


# ---------------------------------------------------------------------------------------------
# The families' chunk sub-operators (flash-linear-attention's building blocks): GDN's and KDA's.

GDN_SUBOPS = ["chunk_scaled_dot_kkt_fwd", "solve_tril", "recompute_w_u_fwd", "prepare_wy_repr_bwd", "chunk_fwd_o",
              "chunk_bwd_dv_local", "chunk_bwd_dqkwg"]
BT = 32


def _gdn_sub_inputs(B=2, T=70, device="cpu", seed=0):
    rn = _normal(seed, device)

    NT = -(-T // BT)
    x = {"q": rn(B, T, 2, 8, scale=0.3), "k": rn(B, T, 2, 8, scale=0.3), "v": rn(B, T, 2, 8),
         "g": gdn.chunk_local_cumsum(-0.05 - 0.1 * rn(B, T, 2).abs(), BT), "beta": torch.sigmoid(rn(B, T, 2)),
         "do": rn(B, T, 2, 8), "dw": rn(B, T, 2, 8), "du": rn(B, T, 2, 8), "dv": rn(B, T, 2, 8),
         "w": rn(B, T, 2, 8, scale=0.3), "h": rn(B, NT, 2, 8, 8), "dh": rn(B, NT, 2, 8, 8)}
    x["A"] = gdn.solve_tril(gdn.chunk_scaled_dot_kkt_fwd(k=x["k"], g=x["g"], beta=x["beta"], chunk_size=BT))
    return x


def _run_gdn_sub(op, x, **kw):
    f = getattr(gdn, op)
    if op == "chunk_scaled_dot_kkt_fwd":
        out = f(k=x["k"], g=x["g"], beta=x["beta"], chunk_size=BT, **kw)
    elif op == "solve_tril":
        out = f(A=x["A"], **kw)
    elif op == "recompute_w_u_fwd":
        out = f(k=x["k"], v=x["v"], beta=x["beta"], A=x["A"], g=x["g"], **kw)
    elif op == "prepare_wy_repr_bwd":
        out = f(k=x["k"], v=x["v"], beta=x["beta"], A=x["A"], dw=x["dw"], du=x["du"], g=x["g"], **kw)
    elif op == "chunk_fwd_o":
        out = f(q=x["q"], k=x["k"], v=x["v"], h=x["h"], g=x["g"], scale=0.3, chunk_size=BT, **kw)
    elif op == "chunk_bwd_dv_local":
        out = f(q=x["q"], k=x["k"], do=x["do"], g=x["g"], scale=0.3, chunk_size=BT, **kw)
    else:
        out = f(q=x["q"], k=x["k"], v=x["v"], do=x["do"], h=x["h"], dh=x["dh"], w=x["w"], g=x["g"], dv=x["dv"],
                scale=0.3, chunk_size=BT, **kw)
    return [t for t in (out if isinstance(out, tuple) else (out,)) if t is not None]


def _main(op):
    return "A" if op == "solve_tril" else ("k" if op in ("chunk_scaled_dot_kkt_fwd", "recompute_w_u_fwd",
                                                        "prepare_wy_repr_bwd") else "q")


KDA_SUBOPS = ["chunk_kda_intra_A", "chunk_kda_fwd_intra", "kda_recompute_w_u_fwd", "chunk_kda_fwd_o", "chunk_kda_bwd_dAv",
              "chunk_kda_bwd_wy_dqkg_fused", "chunk_kda_bwd_intra"]


def _kda_sub_inputs(B=2, T=70, device="cpu", seed=0):
    from fusedops import kda

    rn = _normal(seed, device)

    NT = -(-T // BT)
    x = {"q": rn(B, T, 2, 8, scale=0.3), "k": rn(B, T, 2, 8, scale=0.3), "v": rn(B, T, 2, 8),
         "g": gdn.chunk_local_cumsum(-0.05 - 0.1 * rn(B, T, 2, 8).abs(), BT), "beta": torch.sigmoid(rn(B, T, 2)),
         "do": rn(B, T, 2, 8), "dv": rn(B, T, 2, 8), "v_new": rn(B, T, 2, 8), "h": rn(B, NT, 2, 8, 8),
         "dh": rn(B, NT, 2, 8, 8), "dq": rn(B, T, 2, 8), "dk": rn(B, T, 2, 8), "db": rn(B, T, 2),
         "dg": rn(B, T, 2, 8), "dAqk": rn(B, T, 2, BT), "dAkk": rn(B, T, 2, BT)}
    x["Aqk"], x["A"] = kda.chunk_kda_intra_A(q=x["q"], k=x["k"], gk=x["g"], beta=x["beta"], scale=0.3,
                                             chunk_size=BT)
    return x


def _run_kda_sub(op, x, **kw):
    from fusedops import kda

    f = getattr(kda, op)
    if op == "chunk_kda_intra_A":
        out = f(q=x["q"], k=x["k"], gk=x["g"], beta=x["beta"], scale=0.3, chunk_size=BT, **kw)
    elif op == "chunk_kda_fwd_intra":
        out = f(q=x["q"], k=x["k"], v=x["v"], gk=x["g"], beta=x["beta"], scale=0.3, chunk_size=BT,
                disable_recompute=True, **kw)
    elif op == "kda_recompute_w_u_fwd":
        out = f(k=x["k"], v=x["v"], beta=x["beta"], A=x["A"], gk=x["g"], q=x["q"], **kw)
    elif op == "chunk_kda_fwd_o":
        out = f(qg=x["q"], Aqk=x["Aqk"], v=x["v"], h=x["h"], scale=0.3, **kw)
    elif op == "chunk_kda_bwd_dAv":
        out = f(q=x["q"], k=x["k"], v=x["v"], do=x["do"], A=x["Aqk"], scale=0.3, chunk_size=BT, **kw)
    elif op == "chunk_kda_bwd_wy_dqkg_fused":
        out = f(q=x["q"], k=x["k"], v=x["v"], v_new=x["v_new"], g=x["g"], beta=x["beta"], A=x["A"], h=x["h"],
                do=x["do"], dh=x["dh"], dv=x["dv"], scale=0.3, chunk_size=BT, **kw)
    else:
        out = f(q=x["q"], k=x["k"], g=x["g"], beta=x["beta"], dAqk=x["dAqk"], dAkk=x["dAkk"], dq=x["dq"],
                dk=x["dk"], db=x["db"], dg=x["dg"], chunk_size=BT, **kw)
    return [t for t in (out if isinstance(out, tuple) else (out,)) if t is not None]


def _kda_main(op):
    return {"chunk_kda_fwd_o": "v", "chunk_kda_bwd_dAv": "do"}.get(op, "k")


# family -> (operators, inputs, runner, the input the tests poison / reshape)
CHUNK_SUBOPS = {"gdn": (GDN_SUBOPS, _gdn_sub_inputs, _run_gdn_sub, _main),
                "kda": (KDA_SUBOPS, _kda_sub_inputs, _run_kda_sub, _kda_main)}
CHUNK_CASES = [(f, op) for f, (ops, *_) in CHUNK_SUBOPS.items() for op in ops]
REGISTRY = {"recompute_w_u_fwd": "recompute_w_u", "prepare_wy_repr_bwd": "recompute_w_u",
            "chunk_scaled_dot_kkt_fwd": "chunk_scaled_dot_kkt", "kda_recompute_w_u_fwd": "kda_recompute_w_u",
            "chunk_kda_intra_A": "chunk_kda_fwd_intra"}


def _case_id(case):
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("case", CHUNK_CASES, ids=_case_id)
def test_chunk_sub_operator_errors(case):
    """Rank raises a clear error (never an IndexError from reading a shape); another input's shape,
    integer inputs, a chunk_indices of another shape than cu_seqlens' table and a bad cu_seqlens
    raise before any work; a caller's chunk_indices of the right shape is not read (the kept table
    built from cu_seqlens is), so wrong contents give the correct result."""
    family, op = case
    _, inputs, run, main = CHUNK_SUBOPS[family]
    x = inputs(B=1)
    m = main(op)
    with pytest.raises((ValueError, TypeError), match="rank|must have shape"):
        run(op, dict(x, **{m: x[m][0]}))
    if family == "gdn":
        other = "beta" if op in ("chunk_scaled_dot_kkt_fwd", "recompute_w_u_fwd", "prepare_wy_repr_bwd") else \
            ("A" if op == "solve_tril" else "do" if op != "chunk_fwd_o" else "v")
        bad = x[other][..., :-1] if op == "solve_tril" else x[other][:, :-1]
        with pytest.raises(ValueError, match="must have shape|must be 16, 32 or 64|rank"):
            run(op, dict(x, **{other: bad}))
    with pytest.raises((TypeError, ValueError)):
        run(op, dict(x, **{m: x[m].to(torch.int32)}))
    cu = torch.tensor([0, 30, 70])
    bad_ci = torch.tensor([[0, 0], [1, 0], [1, 5]])  # the right shape, wrong contents: not used
    for a, b in zip(run(op, x, cu_seqlens=cu, chunk_indices=bad_ci), run(op, x, cu_seqlens=cu)):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=re.escape("chunk_indices must be the [NT, 2] = [3, 2] table")):
        run(op, x, cu_seqlens=cu, chunk_indices=bad_ci[:2])
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        run(op, x, cu_seqlens=torch.tensor([0, 50, 30, 70]))


@pytest.mark.parametrize("case", CHUNK_CASES, ids=_case_id)
def test_chunk_sub_operator_layouts_and_empty_inputs(device, case):
    family, op = case
    _, inputs, run, _ = CHUNK_SUBOPS[family]
    x = inputs(device=device)
    y = {n: _strided(t) for n, t in x.items()}
    for a, b in zip(run(op, x), run(op, y)):
        assert torch.equal(a, b)
    for o in run(op, inputs(T=0, device=device)):
        assert o.numel() == 0
    v = inputs(B=1, device=device)  # an empty sequence among others
    for o in run(op, v, cu_seqlens=torch.tensor([0, 0, 30, 30, 70], device=device)):
        assert torch.isfinite(o).all()


@pytest.mark.parametrize("case", CHUNK_CASES, ids=_case_id)
def test_chunk_sub_operator_nonfinite_like_the_ref_backend(device, case):
    """NaN in one token of batch row 0's main input, +Inf in row 1's: every backend gives a
    non-finite value wherever the float64 ref backend does, and besides those only in the rows of
    the poisoned chunk (a zero weight of the chunk products times NaN); row 2 is bit for bit a
    clean call's."""
    family, op = case
    _, inputs, run, main = CHUNK_SUBOPS[family]
    x = inputs(B=3, device=device)
    m = main(op)
    p = x[m].clone()
    p[(0, 40) + (0,) * (p.dim() - 3) + (3,)] = float("nan")
    p[(1, 7) + (1,) * (p.dim() - 3) + (1,)] = float("inf")
    dirty = dict(x, **{m: p})
    reg = REGISTRY.get(op, op)
    with fusedops.use_backend(**{reg: "ref"}):
        ref = [t.cpu() for t in run(op, {n: t.cpu().double() for n, t in dirty.items()})]
    for backend in _backends(reg, device):
        with fusedops.use_backend(**{reg: backend}):
            ours, clean = run(op, dirty), run(op, x)
        for i, (a, r, c) in enumerate(zip(ours, ref, clean)):
            what = f"{op} {backend} output {i}"
            a = a.cpu()
            missing = ~torch.isfinite(r) & torch.isfinite(a)
            assert not missing.any(), f"{what}: finite at {missing.nonzero().tolist()[:6]} where ref is not"
            if a.dim() >= 2 and a.shape[1] == 70:  # token-major outputs: extra ones only in the poisoned chunks
                allowed = torch.zeros(a.shape, dtype=torch.bool)
                allowed[0, BT:2 * BT] = True
                allowed[1, :BT] = True
                extra = ~torch.isfinite(a) & torch.isfinite(r) & ~allowed
                assert not extra.any(), f"{what}: non-finite outside the poisoned chunks at {extra.nonzero().tolist()[:6]}"
            assert torch.equal(a[2], c.cpu()[2]), f"{what}: batch row 2 differs from a clean call"


STATE_CASES = [("gdn", "chunk_fwd_o", ("h",)), ("gdn", "chunk_bwd_dqkwg", ("h", "dh")),
               ("kda", "chunk_kda_fwd_o", ("h",)), ("kda", "chunk_kda_bwd_wy_dqkg_fused", ("h", "dh"))]


@pytest.mark.parametrize("case", STATE_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_strided_state_inputs_give_the_contiguous_result(device, case):
    """h / dh snapshots passed as views (batch rows sharing row 0's states through expand, stride 0;
    a slice of a wider tensor) give exactly the results of the same states made contiguous: the
    state kernels read states densely, so the functions pass them contiguous (on CUDA an expanded h
    read past its memory: an illegal address at 2^21 expanded rows, H100 run of a440a2f)."""
    family, op, names = case
    _, inputs, run, _ = CHUNK_SUBOPS[family]
    x = inputs(B=2, T=64, device=device)
    views = {}
    for n in names:
        views[n] = x[n][:1].expand(x[n].shape)  # stride 0 along B
    want = run(op, dict(x, **{n: v.contiguous() for n, v in views.items()}))
    got = run(op, dict(x, **views))
    for a, b in zip(got, want):
        assert torch.equal(a, b), f"{op}: an expanded state gave another result than its contiguous copy"
    wide = {n: torch.cat([x[n], x[n]], dim=-1)[..., : x[n].shape[-1]] for n in names}  # a sliced view
    assert not any(w.is_contiguous() for w in wide.values())
    want = run(op, dict(x, **{n: w.contiguous() for n, w in wide.items()}))
    got = run(op, dict(x, **wide))
    for a, b in zip(got, want):
        assert torch.equal(a, b), f"{op}: a sliced state gave another result than its contiguous copy"


@pytest.mark.parametrize("fn", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda",
                                "fused_recurrent_kda"])
def test_strided_initial_state_and_dht_give_the_contiguous_result(device, fn):
    """The top levels' initial_state and the incoming final-state gradient as expanded views (batch
    rows sharing one state, stride 0): the same output, final state and gradients as their
    contiguous copies (the state kernels read states densely; the functions pass them so)."""
    torch.manual_seed(0)
    B, T, H, K, V = 2, 40, 2, 8, 8
    from fusedops import kda
    f = getattr(kda if "kda" in fn else gdn, fn)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=device), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=device), dim=-1)
    v = torch.randn(B, T, H, V, device=device)
    g = -torch.rand(*((B, T, H, K) if "kda" in fn else (B, T, H)), device=device) * 0.2
    beta = torch.rand(B, T, H, device=device)
    h0 = torch.randn(1, H, K, V, device=device).expand(B, H, K, V)
    dht = torch.randn(1, H, K, V, device=device).expand(B, H, K, V)

    def run(h0, dht):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta)]
        h = h0.detach().requires_grad_()
        q_, k_, v_, g_, b_ = leaves
        o, ht = f(q_, k_, v_, g=g_, beta=b_, initial_state=h, output_final_state=True)
        torch.autograd.backward([o, ht], [torch.ones_like(o), dht])
        return [o, ht] + [t.grad for t in leaves] + [h.grad]

    for a, b in zip(run(h0, dht), run(h0.contiguous(), dht.contiguous())):
        assert torch.equal(a, b), fn


@pytest.mark.skipif(bool(CUDA_REASON), reason="2^31 output elements need >= 8 GiB: CUDA only (a CPU run "
                    "would need the same host memory and minutes of CI time)")
@pytest.mark.parametrize("case", CHUNK_CASES, ids=_case_id)
def test_chunk_sub_operator_outputs_past_int32_elements_on_cuda(case):
    """Outputs of more than 2^31 elements from inputs broadcast along B (expanded views): the last
    batch row of every output equals the first."""
    family, op = case
    _, inputs, run, _ = CHUNK_SUBOPS[family]
    x1 = inputs(B=1, T=64, device="cuda")
    wide = op in ("chunk_scaled_dot_kkt_fwd", "solve_tril", "chunk_kda_intra_A", "chunk_kda_fwd_intra",
                  "chunk_kda_bwd_dAv")
    B = 2 ** 31 // (64 * 2 * (BT if wide else 8)) + 2
    x = {n: t.expand(B, *t.shape[1:]) for n, t in x1.items()}
    with torch.no_grad():
        outs = run(op, x)
    assert max(o.numel() for o in outs) > 2 ** 31
    for o in outs:
        assert torch.equal(o[-1], o[0])
    fusedops.check_errors()
