"""Gated delta rule (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, the sub-operators)
through the torch layer.

Oracle: the per-token recurrence (docs/specs/linear_attention.md 1.1) in plain torch float64
(tests/common/linear_attention.py) differentiated by torch.autograd. Base of the precision policy:
the chunked algorithm written here in plain torch in the input dtype for the chunk form (the
recurrence in the input dtype for the recurrent form). Every registered backend is forced in turn
(``backend_case``). The spec's RMS-ratio metric (section 13) is recorded with every comparison
(``--precision-report``).

Tests whose logic KDA shares are in test_linear_attention_families.py, run for both families
through ``FAMILY`` (below); this file holds GDN's own.
"""

from __future__ import annotations

import functools
import math

import fusedops
import pytest
import torch
import torch.nn.functional as F
from fusedops import gated_delta_rule as gdn

from tests.common import linear_attention as lat
from tests.common.linear_attention import (
    BITWISE,
    DIFF,
    check,
    l2n,
    leaves,
    spec_ratio,
    unit_lower_inverse,
    with_grads,
)
from tests.common.linear_attention import seqs as _seqs

OP = "chunk_gated_delta_rule"


# ---------------------------------------------------------------------------------------------
# Oracles and bases written here.


def preprocess(q, k, g, beta, opts, A_log=None, dt_bias=None):
    if opts.get("l2"):
        q, k = l2n(q), l2n(k)
    if opts.get("sig"):
        beta = (2.0 if opts.get("neg") else 1.0) * torch.sigmoid(beta)
    if opts.get("gate"):
        b = dt_bias if dt_bias is not None else torch.zeros_like(A_log)
        g = -A_log.exp() * F.softplus(g + b, beta=1.0, threshold=20.0)
    return q, k, g, beta


def chunked(q, k, v, g, beta, scale, h0=None, cu=None, BT=64):
    """The chunked algorithm (sections 1.3-1.4) in plain torch, per sequence, in the tensors'
    dtype: the base of the precision policy for chunk_gated_delta_rule."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    q, k = q.repeat_interleave(G, 2), k.repeat_interleave(G, 2)
    outs, finals = [], []
    for n, (b, t0, L) in enumerate(_seqs(B, T, cu)):
        S = h0[n] if h0 is not None else q.new_zeros(HV, K, V)
        rows = []
        for c0 in range(t0, t0 + L, BT):
            c1 = min(c0 + BT, t0 + L)
            Q, Kc, Vc = (x[b, c0:c1].transpose(0, 1) for x in (q, k, v))  # [HV, C, D]
            gm = g[b, c0:c1].transpose(0, 1).cumsum(-1)  # [HV, C]
            bt = beta[b, c0:c1].transpose(0, 1)
            C = c1 - c0
            mask = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
            diff = gm[:, :, None] - gm[:, None, :]
            Gam = torch.where(mask, diff, torch.full_like(diff, -math.inf)).exp()
            Lm = ((bt[:, :, None] * (Kc @ Kc.transpose(-1, -2))) * Gam).tril(-1)
            A = unit_lower_inverse(Lm)
            W = A @ ((bt * gm.exp())[:, :, None] * Kc)
            U = A @ (bt[:, :, None] * Vc)
            Vn = U - W @ S
            out = scale * (gm.exp()[:, :, None] * (Q @ S) + ((Q @ Kc.transpose(-1, -2)) * Gam) @ Vn)
            rows.append(out.transpose(0, 1))
            gl = gm[:, -1:]
            S = gl.exp()[:, :, None] * S + ((gl - gm).exp()[:, :, None] * Kc).transpose(-1, -2) @ Vn
        outs.append(torch.cat(rows, 0) if rows else v.new_zeros(0, HV, V))
        finals.append(S)
    o = torch.stack(outs, 0) if cu is None else torch.cat(outs, 0)[None]
    return o, torch.stack(finals, 0)


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(B, T, H, HV, K, V, dtype, seed, cu=None, opts=None, h0=True, gate_scale=1.0):
    opts = opts or {}
    gen = torch.Generator().manual_seed(seed)
    N = B if cu is None else len(cu) - 1

    def rn(*s, std=1.0, mean=0.0):
        return torch.randn(*s, generator=gen, dtype=torch.float64) * std + mean

    q, k = rn(B, T, H, K, mean=0.1), rn(B, T, H, K, mean=0.1)
    if not opts.get("l2"):
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    d = {
        "q": q.to(dtype), "k": k.to(dtype), "v": rn(B, T, HV, V, mean=0.1).to(dtype),
        "g": (2 * rn(B, T, HV) if opts.get("gate") else -gate_scale * (0.02 + 0.3 * F.softplus(rn(B, T, HV)))).float(),
        "beta": (rn(B, T, HV) if opts.get("sig") else torch.sigmoid(rn(B, T, HV))).float(),
        "h0": (0.5 * rn(N, HV, K, V)).float() if h0 else None,
        "A_log": rn(HV, mean=-1.0, std=0.3).float(), "dt_bias": rn(HV, std=0.5).float(),
        "do": rn(B, T, HV, V).to(dtype), "dht": rn(N, HV, K, V).float(),
    }
    return d


def forced(backend):
    # cuda_sm90 registers only the top level; its l2norm is cuda_sm80's.
    return fusedops.use_backend(**{OP: backend, "l2norm": "cuda_sm80" if backend == "cuda_sm90" else backend})


def run_ours(d, scale, cu, opts, BT, device, dtype=None, fn=None, final=True):
    x = leaves(d, DIFF, dtype, device)
    fn = fn or fusedops.chunk_gated_delta_rule
    o, ht = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=scale, initial_state=x["h0"],
               output_final_state=final, use_qk_l2norm_in_kernel=bool(opts.get("l2")),
               cu_seqlens=None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device),
               chunk_size=BT, use_gate_in_kernel=bool(opts.get("gate")),
               A_log=x["A_log"] if opts.get("gate") else None,
               dt_bias=x["dt_bias"] if opts.get("gate") else None,
               use_beta_sigmoid_in_kernel=bool(opts.get("sig")), allow_neg_eigval=bool(opts.get("neg")))
    return with_grads(d, x, o, ht, opts, device, final)


def run_composite(d, scale, cu, opts, BT, dtype, kind="chunk"):
    """The oracle (float64 recurrence) or the base (chunked composite in dtype), with grads."""
    return lat.run_composite(d, scale, cu, opts, BT, dtype, kind, preprocess, chunked)


def _recurrent_as_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                        cu_seqlens, chunk_size, **_):
    return fusedops.fused_recurrent_gated_delta_rule(q, k, v, g, None, None, beta, scale, initial_state,
                                                     output_final_state, use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)


# What test_linear_attention_families.py runs for this family.
FAMILY = lat.Family(
    name="gdn", op=OP, chunk=fusedops.chunk_gated_delta_rule, recurrent=fusedops.fused_recurrent_gated_delta_rule,
    reference_chunk=fusedops.reference.chunk_gated_delta_rule,
    reference_recurrent=fusedops.reference.fused_recurrent_gated_delta_rule, per_channel_gate=False,
    make_inputs=make_inputs, run_ours=run_ours, run_composite=run_composite, recurrent_as_chunk=_recurrent_as_chunk,
    forced=forced)


# ---------------------------------------------------------------------------------------------
# The top level against the oracle, every backend and dtype.

CASES = [
    # (name, B, T, H, HV, K, V, BT, cu, opts)
    ("B2 T70 GVA2 K32 V24 BT64", 2, 70, 1, 2, 32, 24, 64, None, {}),
    ("varlen [0,20,20,75] BT16", 1, 75, 2, 2, 20, 36, 16, [0, 20, 20, 75], {}),
    ("l2norm+gate+sigmoid(neg) BT32", 1, 45, 2, 4, 16, 16, 32, None,
     {"l2": True, "gate": True, "sig": True, "neg": True}),
    # K = V = 128 at chunk 64: the CUDA backend's 16-bit tensor-core kernels.
    ("B2 T100 K128 V128 BT64", 2, 100, 2, 2, 128, 128, 64, None, {}),
    ("varlen [0,70,150] GVA2 K128 V128 BT64", 1, 150, 1, 2, 128, 128, 64, [0, 70, 150], {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_chunk_forward_and_gradients_match_float64_recurrence(backend_case, case):
    lat.check_chunk_against_float64_recurrence(FAMILY, backend_case, case)


# ---------------------------------------------------------------------------------------------
# Structure: varlen tables, extremes, kept intermediates.


def test_varlen_tables_are_built_once_per_cu_seqlens_tensor(device, monkeypatch):
    """cu_seqlens' host values (a GPU synchronization each) are read once per tensor: the
    backward and later calls with the same, unchanged tensor reuse them; an in-place change of the
    tensor or another tensor reads them again, and the results follow the new values."""
    from fusedops.ops import _linear_attention as mod

    reads = []
    real = mod._host_seqlens

    def counted(*args):
        reads.append(1)
        return real(*args)

    monkeypatch.setattr(mod, "_host_seqlens", counted)
    monkeypatch.setattr(mod, "_seq_cache", [])
    cu_a, cu_b = [0, 30, 30, 77], [0, 50, 64, 77]
    d = make_inputs(1, 77, 2, 2, 16, 16, torch.float32, seed=21, cu=cu_a)

    def step(cu_t):
        x = leaves(d, DIFF, None, device)
        o, ht = fusedops.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=0.3,
                                                initial_state=x["h0"], output_final_state=True,
                                                cu_seqlens=cu_t, chunk_size=16)
        gr = torch.autograd.grad([o, ht], [x[n] for n in ("q", "k", "v", "g", "beta", "h0")],
                                 [d["do"].to(device), d["dht"].to(device)])
        return [o, ht, *gr]

    cu_t = torch.tensor(cu_a, dtype=torch.int32, device=device)
    first = step(cu_t)
    assert len(reads) == 1
    again = step(cu_t)
    assert len(reads) == 1
    x = leaves(d, DIFF, None, device)  # another chunk size: new tables from the kept values
    fusedops.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=0.3, cu_seqlens=cu_t,
                                    chunk_size=32)
    assert len(reads) == 1
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    cu_t.copy_(torch.tensor(cu_b, dtype=torch.int32))  # in place: the version counter moves
    changed = step(cu_t)
    assert len(reads) == 2
    fresh = step(torch.tensor(cu_b, dtype=torch.int32, device=device))
    assert len(reads) == 3
    for a, b in zip(changed, fresh):
        assert torch.equal(a, b)
    assert not torch.equal(changed[0], first[0])


def test_varlen_inference_tensors_are_read_every_call(device):
    """Under torch.inference_mode a cu_seqlens tensor has no version counter: its values are read
    at every call, so an in-place change still takes effect."""
    d = make_inputs(1, 77, 2, 2, 16, 16, torch.float32, seed=22, cu=[0, 30, 77])
    x = {n: d[n].to(device) for n in ("q", "k", "v", "g", "beta")}
    with torch.inference_mode():
        cu_t = torch.tensor([0, 30, 77], dtype=torch.int32, device=device)
        first, _ = fusedops.chunk_gated_delta_rule(**x, scale=0.3, cu_seqlens=cu_t, chunk_size=16)
        cu_t[1] = 50
        changed, _ = fusedops.chunk_gated_delta_rule(**x, scale=0.3, cu_seqlens=cu_t, chunk_size=16)
    fresh, _ = fusedops.chunk_gated_delta_rule(
        **x, scale=0.3, cu_seqlens=torch.tensor([0, 50, 77], dtype=torch.int32, device=device), chunk_size=16)
    assert torch.equal(changed, fresh)
    assert not torch.equal(changed, first)


def test_extreme_gates_and_betas_stay_finite(device):
    d = make_inputs(1, 100, 1, 2, 16, 16, torch.float32, seed=15)
    d["g"][0, 3::7] = -1000.0
    d["beta"][0, 0::2] = 1e-7
    d["beta"][0, 1::2] = 1 - 1e-7
    o, ht, g = run_ours(d, 0.25, None, {}, 64, device)
    for t in [o, ht, *g.values()]:
        assert torch.isfinite(t).all()
    # still close to the truth by the spec's RMS ratio (the max-abs policy cannot apply: the fp32
    # chunk-local cumsum has an ulp of 6e-5 after a -1000 step)
    ref = run_composite(d, 0.25, None, {}, 64, torch.float64, kind="recurrent")
    assert spec_ratio(o, ref[0]) < 5e-3
    for n in g:
        assert spec_ratio(g[n], ref[2][n]) < 2e-2, n


@pytest.mark.parametrize("K,dtype,cu", [(32, torch.float32, None), (32, torch.float32, [0, 50, 50, 130]),
                                        (128, torch.bfloat16, [0, 70, 130])], ids=["K32", "K32-varlen", "K128-bf16"])
def test_kept_intermediates_give_the_recomputing_backward_bitwise(device, K, dtype, cu):
    # keep_intermediates: the backward reads the forward's W, U, h, Vnew instead of recomputing them
    # with the same kernels, so every output and gradient is bitwise the same.
    opts = {"l2": True, "gate": True, "sig": True}
    B, T, HV = (1 if cu else 2), 130, 4
    d = make_inputs(B, T, 2, HV, K, K, dtype, seed=18, cu=cu, opts=opts)
    runs, saved = [], []
    for keep in (False, True):
        counted = []

        def pack(t, counted=counted):
            counted.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            runs.append(run_ours(d, 0.2, cu, opts, 64, device, dtype=dtype,
                                 fn=functools.partial(fusedops.chunk_gated_delta_rule, keep_intermediates=keep)))
        saved.append(sum(counted))
    # keep=True saves exactly W, U, Vnew [B,T,HV,K] and the h snapshots [B (1 varlen),NT,HV,K,V] more.
    NT = sum(-(-(e - s) // 64) for s, e in zip(cu, cu[1:])) if cu else -(-T // 64)
    assert saved[1] - saved[0] == 3 * B * T * HV * K + B * NT * HV * K * K
    for a, b in ((runs[0][0], runs[1][0]), (runs[0][1], runs[1][1])):
        assert torch.equal(a.view(BITWISE[a.dtype]), b.view(BITWISE[b.dtype]))
    for n in runs[0][2]:
        a, b = runs[0][2][n], runs[1][2][n]
        assert torch.equal(a.view(BITWISE[a.dtype]), b.view(BITWISE[b.dtype])), n


# ---------------------------------------------------------------------------------------------
# Sub-operators against float64 torch oracles written here.


def _chunks(B, T, cu, BT):
    for b, t0, L in _seqs(B, T, cu):
        for c in range(t0, t0 + L, BT):
            yield b, c, min(c + BT, t0 + L)


SUB = [("fixed B2 T41 K24 V20 BT32", 2, 41, 2, 4, 24, 20, 32, None),
       ("varlen [0,15,15,37,60] BT16", 1, 60, 2, 2, 20, 36, 16, [0, 15, 15, 37, 60])]


@pytest.fixture(params=SUB, ids=[s[0] for s in SUB])
def sub(request):
    name, B, T, H, HV, K, V, BT, cu = request.param
    d = make_inputs(B, T, H, HV, K, V, torch.float32, seed=21, cu=cu)
    cut = None if cu is None else torch.tensor(cu, dtype=torch.int64)
    return dict(B=B, T=T, H=H, HV=HV, K=K, V=V, BT=BT, cu=cu, cut=cut, d=d, G=HV // H)


def _gc(s):
    out = torch.zeros(s["d"]["g"].shape, dtype=torch.float64)
    for b, c0, c1 in _chunks(s["B"], s["T"], s["cu"], s["BT"]):
        out[b, c0:c1] = s["d"]["g"][b, c0:c1].double().cumsum(0)
    return out


def test_sub_chunk_local_cumsum(sub, device):
    s = sub
    gen = torch.Generator().manual_seed(3)
    for S in (None, 5):
        g = torch.randn(s["B"], s["T"], s["HV"], *(() if S is None else (S,)), generator=gen)
        for reverse in (False, True):
            out = gdn.chunk_local_cumsum(g.to(device), s["BT"], reverse=reverse, scale=1.5,
                                         cu_seqlens=None if s["cut"] is None else s["cut"].to(device))
            ref = torch.zeros(g.shape, dtype=torch.float64)
            for b, c0, c1 in _chunks(s["B"], s["T"], s["cu"], s["BT"]):
                x = g[b, c0:c1].double()
                ref[b, c0:c1] = 1.5 * (x.flip(0).cumsum(0).flip(0) if reverse else x.cumsum(0))
            base = torch.zeros_like(g)
            for b, c0, c1 in _chunks(s["B"], s["T"], s["cu"], s["BT"]):
                x = g[b, c0:c1]
                base[b, c0:c1] = 1.5 * (x.flip(0).cumsum(0).flip(0) if reverse else x.cumsum(0))
            assert out.dtype == torch.float32
            check(f"{device} cumsum S={S} reverse={reverse}", out, base, ref, torch.float32)


def test_sub_reverse_cumsum_is_a_true_suffix_sum(device):
    g = torch.ones(1, 64, 1)
    g[:, :32] = 1e8
    out = gdn.chunk_local_cumsum(g.to(device), 64, reverse=True).cpu()
    assert torch.equal(out[0, 32:, 0], torch.arange(32, 0, -1, dtype=torch.float32))


def _kkt_ref(s, gc, dt=torch.float64):
    d = s["d"]
    A = torch.zeros(s["B"], s["T"], s["HV"], s["BT"], dtype=dt)
    for b, c0, c1 in _chunks(s["B"], s["T"], s["cu"], s["BT"]):
        C = c1 - c0
        k = d["k"][b, c0:c1].to(dt).repeat_interleave(s["G"], 1).transpose(0, 1)
        bt = d["beta"][b, c0:c1].to(dt).transpose(0, 1)
        gm = gc[b, c0:c1].to(dt).transpose(0, 1)
        diff = (gm[:, :, None] - gm[:, None, :]).tril(-1)
        L = (bt[:, :, None] * (k @ k.transpose(-1, -2)) * diff.exp()).tril(-1)
        A[b, c0:c1, :, :C] = L.transpose(0, 1)
    return A


def test_sub_kkt_and_solve_tril(sub, device):
    s = sub
    gc = _gc(s)
    cu = None if s["cut"] is None else s["cut"].to(device)
    A = gdn.chunk_scaled_dot_kkt_fwd(s["d"]["k"].to(device), gc.float().to(device), s["d"]["beta"].to(device),
                                     cu, s["BT"])
    check(f"{device} kkt", A, _kkt_ref(s, gc, torch.float32), _kkt_ref(s, gc), torch.float32)
    L = _kkt_ref(s, gc)
    Ai = gdn.solve_tril(L.float().to(device), cu)
    ref = torch.zeros_like(L)
    base = torch.zeros(L.shape)
    for b, c0, c1 in _chunks(s["B"], s["T"], s["cu"], s["BT"]):
        C = c1 - c0
        blk = L[b, c0:c1, :, :C].transpose(0, 1)
        ref[b, c0:c1, :, :C] = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + blk).transpose(0, 1)
        base[b, c0:c1, :, :C] = unit_lower_inverse(blk.float()).transpose(0, 1)
    check(f"{device} solve_tril", Ai, base, ref, torch.float32)


def _wu(s, gc, A, dt):
    d = s["d"]
    k = d["k"].to(dt).repeat_interleave(s["G"], 2)
    eg = gc.to(dt).exp()
    W = torch.zeros(s["B"], s["T"], s["HV"], s["K"], dtype=dt)
    U = torch.zeros(s["B"], s["T"], s["HV"], s["V"], dtype=dt)
    for b, c0, c1 in _chunks(s["B"], s["T"], s["cu"], s["BT"]):
        C = c1 - c0
        Am = A[b, c0:c1, :, :C].to(dt).transpose(0, 1).tril()
        bt = d["beta"][b, c0:c1].to(dt).transpose(0, 1)
        W[b, c0:c1] = (Am @ ((bt * eg[b, c0:c1].transpose(0, 1))[..., None] * k[b, c0:c1].transpose(0, 1))).transpose(0, 1)
        U[b, c0:c1] = (Am @ (bt[..., None] * d["v"][b, c0:c1].to(dt).transpose(0, 1))).transpose(0, 1)
    return W, U


def test_sub_recompute_w_u_and_its_backward(sub, device):
    s = sub
    gc = _gc(s)
    A = torch.zeros(s["B"], s["T"], s["HV"], s["BT"], dtype=torch.float64)
    L = _kkt_ref(s, gc)
    for b, c0, c1 in _chunks(s["B"], s["T"], s["cu"], s["BT"]):
        C = c1 - c0
        A[b, c0:c1, :, :C] = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + L[b, c0:c1, :, :C].transpose(0, 1)).transpose(0, 1)
    A32 = A.float()
    cu = None if s["cut"] is None else s["cut"].to(device)
    d = s["d"]
    w, u = gdn.recompute_w_u_fwd(d["k"].to(device), d["v"].to(device), d["beta"].to(device), A32.to(device),
                                 gc.float().to(device), cu)
    W64, U64 = _wu(s, gc, A32.double(), torch.float64)
    W32, U32 = _wu(s, gc.float(), A32, torch.float32)
    check(f"{device} w", w, W32, W64, torch.float32)
    check(f"{device} u", u, U32, U64, torch.float32)
    # Backward by autograd of the float64 forward: the gradient w.r.t. the pre-inverse L flows
    # through A = (I + L)^{-1}, L built from k, beta, g (section 5 / B5).
    gen = torch.Generator().manual_seed(4)
    dW, dU = torch.randn(W64.shape, generator=gen), torch.randn(U64.shape, generator=gen)

    def wu_from_inputs(k, v, beta, gcum, dt):
        s2 = dict(s, d=dict(d, k=k, v=v, beta=beta))
        Lm = _kkt_ref(s2, gcum, dt)
        Am = torch.zeros_like(Lm)
        for b, c0, c1 in _chunks(s["B"], s["T"], s["cu"], s["BT"]):
            C = c1 - c0
            blk = Lm[b, c0:c1, :, :C].transpose(0, 1)
            Am[b, c0:c1, :, :C] = unit_lower_inverse(blk).transpose(0, 1)
        return _wu(s2, gcum, Am, dt)

    def grads(dt):
        x = [t.detach().to(dt).requires_grad_() for t in (d["k"], d["v"], d["beta"], gc)]
        Wd, Ud = wu_from_inputs(*x, dt)
        return torch.autograd.grad([Wd, Ud], x, [dW.to(dt), dU.to(dt)])

    g64, g32 = grads(torch.float64), grads(torch.float32)
    dk, dv, dbeta, dg = gdn.prepare_wy_repr_bwd(d["k"].to(device), d["v"].to(device), d["beta"].to(device),
                                                A32.to(device), dW.to(device), dU.to(device), gc.float().to(device), cu)
    for name, ours, base, ref in zip(("dk", "dv", "dbeta", "dg"), (dk, dv, dbeta, dg), g32, g64):
        check(f"{device} wy {name}", ours, base, ref, torch.float32)


def test_sub_state_pieces(sub, device):
    """fwd_h, chunk_fwd_o, chunk_bwd_dv_local, bwd_dhu and chunk_bwd_dqkwg composed as in section
    1.5 equal torch.autograd of the chunked forward written here (float64)."""
    s = sub
    d = s["d"]
    cu = None if s["cut"] is None else s["cut"].to(device)
    gc = _gc(s).float()
    gen = torch.Generator().manual_seed(6)
    w = (0.3 * torch.randn(s["B"], s["T"], s["HV"], s["K"], generator=gen))
    u = torch.randn(s["B"], s["T"], s["HV"], s["V"], generator=gen)
    scale = 0.4
    dv_ = lambda t: t.to(device)  # noqa: E731
    h, vn, ht = gdn.chunk_gated_delta_rule_fwd_h(dv_(d["k"]), dv_(w), dv_(u), dv_(gc), initial_state=dv_(d["h0"]),
                                                 output_final_state=True, chunk_size=s["BT"], cu_seqlens=cu)
    o = gdn.chunk_fwd_o(dv_(d["q"]), dv_(d["k"]), vn, h, dv_(gc), None, scale, False, cu, s["BT"])

    def forward(q, k, w, u, gcum, h0, dt):
        """Sections 6 and 7 written with torch: o, ht, v_new."""
        G = s["G"]
        qq, kk = q.repeat_interleave(G, 2), k.repeat_interleave(G, 2)
        o_parts = {b: [] for b in range(s["B"])}
        vn_parts = {b: [] for b in range(s["B"])}
        finals = []
        for n, (b, t0, L) in enumerate(_seqs(s["B"], s["T"], s["cu"])):
            X = h0[n]
            for c0 in range(t0, t0 + L, s["BT"]):
                c1 = min(c0 + s["BT"], t0 + L)
                Kc, Qc = kk[b, c0:c1].transpose(0, 1), qq[b, c0:c1].transpose(0, 1)
                Wc, Uc = w[b, c0:c1].transpose(0, 1), u[b, c0:c1].transpose(0, 1)
                gm = gcum[b, c0:c1].transpose(0, 1)
                Vn = Uc - Wc @ X
                C = c1 - c0
                mask = torch.ones(C, C, dtype=torch.bool).tril()
                diff = gm[:, :, None] - gm[:, None, :]
                Gam = torch.where(mask, diff, torch.full_like(diff, -math.inf)).exp()
                out = scale * (gm.exp()[..., None] * (Qc @ X) + ((Qc @ Kc.transpose(-1, -2)) * Gam) @ Vn)
                o_parts[b].append(out.transpose(0, 1))
                vn_parts[b].append(Vn.transpose(0, 1))
                gl = gm[:, -1:]
                X = gl.exp()[..., None] * X + ((gl - gm).exp()[..., None] * Kc).transpose(-1, -2) @ Vn
            finals.append(X)

        def cat(parts):
            return torch.stack([torch.cat(parts[b], 0) for b in range(s["B"])], 0)

        return cat(o_parts), torch.stack(finals, 0), None, cat(vn_parts)

    o64, ht64, _, vn64 = forward(d["q"].double(), d["k"].double(), w.double(), u.double(), gc.double(), d["h0"].double(),
                                 torch.float64)
    o32, ht32, _, vn32 = forward(d["q"], d["k"], w, u, gc, d["h0"], torch.float32)
    check(f"{device} fwd_h v_new", vn, vn32, vn64, torch.float32)
    check(f"{device} fwd_h ht", ht, ht32, ht64, torch.float32)
    check(f"{device} chunk_fwd_o", o, o32, o64, torch.float32)
    # Backward pieces composed (B2-B4) against autograd of the forward above.
    do, dht = d["do"], d["dht"]
    dvl = gdn.chunk_bwd_dv_local(dv_(d["q"]), dv_(d["k"]), dv_(do), dv_(gc), None, None, scale, cu, s["BT"])
    dh, dh0, dv2 = gdn.chunk_gated_delta_rule_bwd_dhu(dv_(d["q"]), dv_(d["k"]), dv_(w), dv_(do), dvl, dv_(gc),
                                                      h0=dv_(d["h0"]), dht=dv_(dht), scale=scale, cu_seqlens=cu,
                                                      chunk_size=s["BT"])
    dq, dk, dw, dg = gdn.chunk_bwd_dqkwg(dv_(d["q"]), dv_(d["k"]), vn, dv_(do), h, dh, dv_(w), dv_(gc), None, dv2,
                                         scale, False, cu, s["BT"])

    def grads(dt):
        x = [t.detach().to(dt).requires_grad_() for t in (d["q"], d["k"], w, u, gc, d["h0"])]
        oo, hh, _, _ = forward(*x, dt)
        return torch.autograd.grad([oo, hh], x, [do.to(dt), dht.to(dt)])

    g64, g32 = grads(torch.float64), grads(torch.float32)
    # dv2 is the gradient w.r.t. v_new = dL/du; dw = -dv2 h^T is the gradient w.r.t. w.
    check(f"{device} bwd_dhu dv2 (= du)", dv2, g32[3], g64[3], torch.float32)
    check(f"{device} bwd_dhu dh0", dh0, g32[5], g64[5], torch.float32)
    check(f"{device} dqkwg dq", dq, g32[0], g64[0], torch.float32)
    check(f"{device} dqkwg dw", dw, g32[2], g64[2], torch.float32)
    # dk of dqkwg is the part through q/k of the output and state (w, u held fixed): autograd's dk.
    check(f"{device} dqkwg dk", dk, g32[1], g64[1], torch.float32)
    # dg of dqkwg: the gradient w.r.t. the chunk-local cumsum
    check(f"{device} dqkwg dg", dg, g32[4], g64[4], torch.float32)


def test_fused_gdn_gate_matches_float64(device):
    gen = torch.Generator().manual_seed(9)
    g = (torch.randn(3, 17, 4, generator=gen) * 8).to(device).requires_grad_()
    A = torch.randn(4, generator=gen).to(device).requires_grad_()
    b = torch.randn(4, generator=gen).to(device).requires_grad_()
    y = gdn.fused_gdn_gate(g, A, b)
    dy = torch.randn(y.shape, generator=gen).to(device)
    gr = torch.autograd.grad(y, [g, A, b], dy)
    x64 = [t.detach().double().cpu().requires_grad_() for t in (g, A, b)]
    y64 = -x64[1].exp() * F.softplus(x64[0] + x64[2], threshold=20.0)
    g64 = torch.autograd.grad(y64, x64, dy.double().cpu())
    x32 = [t.detach().cpu().requires_grad_() for t in (g, A, b)]
    y32 = -x32[1].exp() * F.softplus(x32[0] + x32[2], threshold=20.0)
    g32 = torch.autograd.grad(y32, x32, dy.cpu())
    check(f"{device} gate y", y, y32, y64, torch.float32)
    for n, a, bb, c in zip(("dg", "dA_log", "ddt_bias"), gr, g32, g64):
        check(f"{device} gate {n}", a, bb, c, torch.float32)


# ---------------------------------------------------------------------------------------------
# torch.library: opcheck and torch.compile.


def test_opcheck_top_level_ops(device):
    d = {n: t.to(device) if t is not None else None
         for n, t in make_inputs(1, 20, 1, 2, 8, 8, torch.float32, seed=30).items()}
    for keep in (False, True):
        args = (d["q"], d["k"], d["v"], d["g"], d["beta"], 0.3, d["h0"], True, True, True, d["A_log"],
                d["dt_bias"], True, True, None, None, 16, keep)
        torch.library.opcheck(torch.ops.fusedops.chunk_gated_delta_rule_fwd.default, args)
    # Varlen with kept intermediates: the fake gives h a data-dependent chunk count.
    dv = {n: t.to(device) if t is not None else None
          for n, t in make_inputs(1, 20, 1, 2, 8, 8, torch.float32, seed=32, cu=[0, 7, 20]).items()}
    cu = torch.tensor([0, 7, 20], dtype=torch.int32, device=device)
    args = (dv["q"], dv["k"], dv["v"], dv["g"], dv["beta"], 0.3, dv["h0"], True, False, False, None, None,
            False, False, cu, None, 16, True)
    torch.library.opcheck(torch.ops.fusedops.chunk_gated_delta_rule_fwd.default, args)
    torch.library.opcheck(torch.ops.fusedops.fused_recurrent_gated_delta_rule_fwd.default,
                          (d["q"], d["k"], d["v"], d["g"], d["beta"], 0.3, d["h0"], True, None))
    torch.library.opcheck(torch.ops.fusedops.gdn_gate_fwd.default, (d["g"], d["A_log"], d["dt_bias"]))


# ---------------------------------------------------------------------------------------------
# Errors


def test_errors():
    q, k, v, g, b = FAMILY.small_args()
    with pytest.raises(DeprecationWarning, match="head_first"):
        fusedops.chunk_gated_delta_rule(q, k, v, g, b, head_first=True)
    with pytest.raises(ValueError, match=r"q and k must have the same number of heads"):
        fusedops.chunk_gated_delta_rule(q, torch.randn(1, 8, 1, 8), v, g, b)
    with pytest.raises(ValueError, match=r"v has HV=3 heads, which is not a multiple of the 2 heads"):
        fusedops.chunk_gated_delta_rule(q, k, torch.randn(1, 8, 3, 8), -torch.rand(1, 8, 3), torch.rand(1, 8, 3))
    with pytest.raises(ValueError, match="chunk_size must be 16, 32 or 64, got 48"):
        fusedops.chunk_gated_delta_rule(q, k, v, g, b, chunk_size=48)
    q2, k2, v2, g2, b2 = FAMILY.small_args(B=2)
    with pytest.raises(ValueError, match="with cu_seqlens the batch size must be 1"):
        fusedops.chunk_gated_delta_rule(q2, k2, v2, g2, b2, cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[1,2,8,8\]"):
        fusedops.chunk_gated_delta_rule(q, k, v, g, b, initial_state=torch.zeros(2, 2, 8, 8))
    with pytest.raises(ValueError, match="allow_neg_eigval requires use_beta_sigmoid_in_kernel"):
        fusedops.chunk_gated_delta_rule(q, k, v, g, b, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="use_gate_in_kernel requires A_log"):
        fusedops.chunk_gated_delta_rule(q, k, v, g, b, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="not both"):
        fusedops.chunk_gated_delta_rule(q, k, v, g, b, state_v_first=True, transpose_state_layout=True)
    qb, kb = torch.randn(1, 8, 2, 300), torch.randn(1, 8, 2, 300)
    with pytest.raises(ValueError, match="K must be <= 256"):
        fusedops.chunk_gated_delta_rule(qb, kb, v, g, b)
    with pytest.raises(TypeError, match="v must have the dtype of q"):
        fusedops.chunk_gated_delta_rule(q, k, v.bfloat16(), g, b)
    with pytest.raises(ValueError, match=r"g must have shape \[1,8,2\]"):
        fusedops.chunk_gated_delta_rule(q, k, v, g[..., :1], b)
    with fusedops.validation():
        with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
            fusedops.chunk_gated_delta_rule(q, k, v, g, b, cu_seqlens=torch.tensor([0, 6, 3, 8]))
        with pytest.raises(ValueError, match="cu_seqlens must end at T=8"):
            fusedops.chunk_gated_delta_rule(q, k, v, g, b, cu_seqlens=torch.tensor([0, 6, 12]))
    with pytest.raises(ValueError, match="g must have rank 3"):
        gdn.chunk_local_cumsum(torch.randn(4, 4), 64)
    with pytest.raises(ValueError, match="chunk_size must be a power of 2"):
        gdn.chunk_local_cumsum(g, 48)
    with pytest.raises(ValueError, match="A's last dimension .* must be 16, 32 or 64, got 48"):
        gdn.solve_tril(torch.zeros(1, 8, 2, 48))
