"""Kimi delta attention (chunk_kda, fused_recurrent_kda, the per-channel gate, the sub-operators)
through the torch layer.

Oracle: the per-token recurrence (docs/specs/linear_attention.md 9.1) in plain torch float64
(tests/common/linear_attention.py) differentiated by torch.autograd. Base of the precision policy:
the chunked algorithm (9.3) written here in plain torch in the input dtype for the chunk form (the
recurrence in the input dtype for the recurrent form). Every registered backend is forced in turn
(``backend_case``). The spec's RMS-ratio metric (section 13) is recorded with every comparison
(``--precision-report``).

Tests whose logic GDN shares are in test_linear_attention_families.py, run for both families
through ``FAMILY`` (below); this file holds KDA's own.
"""

from __future__ import annotations

import itertools
import math

import fusedops
import pytest
import torch
import torch.nn.functional as F
from fusedops import kda

from tests.common import linear_attention as lat
from tests.common.linear_attention import (
    DIFF,
    check,
    compare_all,
    l2n,
    leaves,
    spec_ratio,
    unit_lower_inverse,
    with_grads,
)
from tests.common.linear_attention import seqs as _seqs

OP = "chunk_kda"


# ---------------------------------------------------------------------------------------------
# Oracles and bases written here.


def preprocess(q, k, g, beta, opts, A_log=None, dt_bias=None):
    """The optional in-kernel transforms (sections 10, 11) in plain torch."""
    if opts.get("l2"):
        q, k = l2n(q), l2n(k)
    if opts.get("sig"):
        beta = (2.0 if opts.get("neg") else 1.0) * torch.sigmoid(beta)
    if opts.get("gate"):
        HV, K = g.shape[2], g.shape[3]
        b = dt_bias.reshape(HV, K) if opts.get("bias", True) else torch.zeros(HV, K, dtype=g.dtype)
        a = A_log.exp()[:, None] if opts.get("alog", True) else torch.ones(HV, 1, dtype=g.dtype)
        if "lb" in opts:
            g = opts["lb"] * torch.sigmoid(a * (g + b))
        else:
            g = -a * F.softplus(g + b, beta=1.0, threshold=20.0)
    return q, k, g, beta


def chunked(q, k, v, g, beta, scale, h0=None, cu=None, BT=64):
    """The chunked algorithm (section 9.3) in plain torch, per sequence, in the tensors' dtype:
    the base of the precision policy for chunk_kda."""
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
            C = c1 - c0
            Q, Kc, Vc, gm = (x[b, c0:c1].transpose(0, 1) for x in (q, k, v, g))  # [HV, C, D]
            gm = gm.cumsum(1)
            bt = beta[b, c0:c1].transpose(0, 1)
            incl = torch.ones(C, C, dtype=torch.bool).tril()
            diff = gm[:, :, None, :] - gm[:, None, :, :]
            E = torch.where(incl[:, :, None], diff, torch.full_like(diff, -math.inf)).exp()
            KE = E * Kc[:, None, :, :]
            Aqk = scale * torch.einsum("hik,hijk->hij", Q, KE)
            Lm = (bt[:, :, None] * torch.einsum("hik,hijk->hij", Kc, KE)).tril(-1)
            A = unit_lower_inverse(Lm)
            W = A @ (bt[:, :, None] * gm.exp() * Kc)
            U = A @ (bt[:, :, None] * Vc)
            Vn = U - W @ S
            rows.append((scale * (Q * gm.exp()) @ S + Aqk @ Vn).transpose(0, 1))
            gl = gm[:, -1]
            S = gl.exp()[:, :, None] * S + ((gl[:, None, :] - gm).exp() * Kc).transpose(-1, -2) @ Vn
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
    if opts.get("gate"):
        g = rn(B, T, HV, K)
    else:
        g = -gate_scale * (0.02 + 0.2 * F.softplus(rn(B, T, HV, K)))
        if opts.get("safe"):
            g = g.clamp(-5, -1e-3)
    d = {
        "q": q.to(dtype), "k": k.to(dtype), "v": rn(B, T, HV, V, mean=0.1).to(dtype),
        "g": g.float(),
        "beta": (rn(B, T, HV) if opts.get("sig") else torch.sigmoid(rn(B, T, HV))).float(),
        "h0": (0.5 * rn(N, HV, K, V)).float() if h0 else None,
        "A_log": rn(HV, mean=-0.5, std=0.3).float(), "dt_bias": rn(HV * K, std=0.5).float(),
        "do": rn(B, T, HV, V).to(dtype), "dht": rn(N, HV, K, V).float(),
    }
    return d


def forced(backend):
    return fusedops.use_backend(**{OP: backend, "fused_recurrent_kda": backend, "kda_gate": backend,
                                   "l2norm": backend})


def run_ours(d, scale, cu, opts, BT, device, dtype=None, fn=None, final=True):
    x = leaves(d, DIFF, dtype, device)
    fn = fn or fusedops.chunk_kda
    gate = bool(opts.get("gate"))
    o, ht = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=scale, initial_state=x["h0"],
               output_final_state=final, use_qk_l2norm_in_kernel=bool(opts.get("l2")),
               use_gate_in_kernel=gate,
               A_log=x["A_log"] if gate and opts.get("alog", True) else None,
               dt_bias=x["dt_bias"] if gate and opts.get("bias", True) else None,
               use_beta_sigmoid_in_kernel=bool(opts.get("sig")), allow_neg_eigval=bool(opts.get("neg")),
               safe_gate=bool(opts.get("safe")), lower_bound=opts.get("lb"),
               cu_seqlens=None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device),
               chunk_size=BT)
    return with_grads(d, x, o, ht, opts, device, final)


def run_composite(d, scale, cu, opts, BT, dtype, kind="chunk"):
    """The oracle (float64 recurrence) or the base (chunked composite in dtype), with grads."""
    return lat.run_composite(d, scale, cu, opts, BT, dtype, kind, preprocess, chunked)


def _recurrent_as_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                        use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, lower_bound, cu_seqlens,
                        **_):
    return fusedops.fused_recurrent_kda(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
                                        use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                                        False, lower_bound, cu_seqlens=cu_seqlens)


# What test_linear_attention_families.py runs for this family.
FAMILY = lat.Family(
    name="kda", op=OP, chunk=fusedops.chunk_kda, recurrent=fusedops.fused_recurrent_kda,
    reference_chunk=fusedops.reference.chunk_kda, reference_recurrent=fusedops.reference.fused_recurrent_kda,
    per_channel_gate=True, make_inputs=make_inputs, run_ours=run_ours, run_composite=run_composite,
    recurrent_as_chunk=_recurrent_as_chunk, forced=forced)


# ---------------------------------------------------------------------------------------------
# The top level against the oracle, every backend and dtype.

CASES = [
    # (name, B, T, H, HV, K, V, BT, cu, opts)
    ("B2 T70 GVA2 K24 V20 BT64", 2, 70, 1, 2, 24, 20, 64, None, {}),
    ("varlen [0,20,20,75] BT32", 1, 75, 2, 2, 20, 36, 32, [0, 20, 20, 75], {}),
    ("l2norm+gate+sigmoid(neg) BT32", 1, 45, 2, 4, 16, 16, 32, None,
     {"l2": True, "gate": True, "sig": True, "neg": True}),
    ("lower-bound gate + safe_gate BT64", 1, 50, 1, 2, 16, 8, 64, None,
     {"gate": True, "lb": -5.0, "safe": True}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_chunk_forward_and_gradients_match_float64_recurrence(backend_case, case):
    # KDA's float64 case passes the initial state (and its cotangent) in float64 too.
    lat.check_chunk_against_float64_recurrence(FAMILY, backend_case, case, double_state=True)


def _option_combinations():
    gates = [{}, {"gate": True}, {"gate": True, "bias": False}, {"gate": True, "lb": -3.0},
             {"gate": True, "lb": -5.0, "alog": False, "safe": True}, {"safe": True}]
    betas = [{}, {"sig": True}, {"sig": True, "neg": True}]
    out = []
    for l2, gate, beta, BT in itertools.product((False, True), gates, betas, (32, 64)):
        opts = dict(gate, **beta)
        if l2:
            opts["l2"] = True
        out.append((opts, BT))
    return out


def test_every_option_combination_matches_the_oracle(device):
    """Every flag combination the API accepts (l2norm x gate forms x beta forms x chunk sizes),
    fp32, against the float64 recurrence by the spec's RMS ratio."""
    for i, (opts, BT) in enumerate(_option_combinations()):
        d = make_inputs(1, 36, 1, 2, 8, 8, torch.float32, seed=100 + i, opts=opts)
        ours = run_ours(d, 0.4, None, opts, BT, device)
        ref = run_composite(d, 0.4, None, opts, BT, torch.float64, kind="recurrent")
        tag = f"{opts} BT={BT}"
        assert spec_ratio(ours[0], ref[0]) < 1e-5, tag
        assert spec_ratio(ours[1], ref[1]) < 1e-5, tag
        assert set(ours[2]) == set(ref[2]), tag
        for n in ours[2]:
            assert spec_ratio(ours[2][n], ref[2][n]) < 1e-4, (tag, n)


def test_fused_recurrent_gate_in_kernel_and_beta_sigmoid(device):
    """The per-token form with the gate in the kernel (both forms) and the beta sigmoid against
    the float64 recurrence. (Without g and beta, with the in-kernel l2norm:
    test_linear_attention_families.py::test_fused_recurrent_without_gate_and_beta_and_with_l2norm.)"""
    for opts in ({"gate": True, "sig": True, "l2": True}, {"gate": True, "lb": -2.0}):
        d = make_inputs(1, 25, 1, 2, 8, 8, torch.float32, seed=7, opts=opts)
        ours = run_ours(d, 0.5, None, opts, 64, device, fn=_recurrent_as_chunk)
        ref = run_composite(d, 0.5, None, opts, 64, torch.float64, kind="recurrent")
        base = run_composite(d, 0.5, None, opts, 64, torch.float32, kind="recurrent")
        compare_all(f"{device} fused_recurrent {opts}", ours, base, ref, torch.float32)


# ---------------------------------------------------------------------------------------------
# Structure: extreme gates, a single token.


@pytest.mark.parametrize("gate_in_kernel", [False, True])
def test_gates_of_minus_1000_stay_finite(device, gate_in_kernel):
    """The spec's varlen test sets dropped gate entries to -1000: a per-step log decay of -1000,
    or a raw gate input of -1000 (softplus ~ 0) with the gate in the kernel."""
    cu = [0, 15, 100, 130]
    opts = {"gate": True} if gate_in_kernel else {}
    d = make_inputs(1, 130, 1, 2, 16, 16, torch.float32, seed=15, cu=cu, opts=opts)
    mask = torch.rand(d["g"].shape, generator=torch.Generator().manual_seed(1)) < 0.3
    d["g"][mask] = -1000.0
    o, ht, g = run_ours(d, 0.25, cu, opts, 64, device)
    for t in [o, ht, *g.values()]:
        assert torch.isfinite(t).all()
    # close to the truth by the spec's RMS ratio (the fp32 chunk-local cumsum has an ulp of 6e-5
    # after a -1000 step, so exp(gamma_i - gamma_j) carries that relative error)
    ref = run_composite(d, 0.25, cu, opts, 64, torch.float64, kind="recurrent")
    assert spec_ratio(o, ref[0]) < 5e-3 and spec_ratio(ht, ref[1]) < 5e-3
    for n in g:
        assert spec_ratio(g[n], ref[2][n]) < 2e-2, n


def test_single_token_input(device):
    """T = 1 against the float64 recurrence. (T = 0: test_linear_attention_families.py::test_empty_inputs.)"""
    d = make_inputs(1, 1, 1, 2, 8, 8, torch.float32, seed=16)
    ours = run_ours(d, 0.3, None, {}, 64, device)
    ref = run_composite(d, 0.3, None, {}, 64, torch.float64, kind="recurrent")
    base = run_composite(d, 0.3, None, {}, 64, torch.float32, kind="chunk")
    compare_all(f"{device} T=1", ours, base, ref, torch.float32)


# ---------------------------------------------------------------------------------------------
# Sub-operators: composed in Python they reproduce chunk_kda's outputs and gradients, and the
# intra-chunk matrices match float64 torch oracles.


def test_sub_operators_compose_to_chunk_kda(device):
    B, T, H, HV, K, V, BT = 1, 90, 1, 2, 16, 12, 32
    cu = [0, 37, 37, 90]
    d = make_inputs(B, T, H, HV, K, V, torch.float32, seed=20, cu=cu)
    scale = 0.35
    cut = torch.tensor(cu, dtype=torch.int64, device=device)
    q, k, v, g, beta, h0 = (d[n].to(device) for n in ("q", "k", "v", "g", "beta", "h0"))
    do, dht = d["do"].to(device), d["dht"].to(device)
    # chunk_kda keeps the gate cumsum in float64 on the CPU (docs/precision.md, extreme gates).
    gc = kda.chunk_local_cumsum(g, BT, cu_seqlens=cut,
                                output_dtype=torch.float64 if device == "cpu" else torch.float)
    # flash-linear-attention 0.6.0's positional forms of the sub-operators.
    w, u, qg, kg, Aqk, Akk = kda.chunk_kda_fwd_intra(q, k, v, gc, beta, scale, cut, BT, None, False, None, True)
    h, vn, ht = kda.chunk_kda_fwd_h(kg, w, u, gk=gc, initial_state=h0, output_final_state=True,
                                    chunk_size=BT, cu_seqlens=cut)
    o = kda.chunk_kda_fwd_o(qg, Aqk, vn, h, scale, cut)
    ours = run_ours(d, scale, cu, {}, BT, device)
    torch.testing.assert_close(o, ours[0], rtol=0, atol=0)
    torch.testing.assert_close(ht, ours[1], rtol=0, atol=0)
    dAqk, dvl = kda.chunk_kda_bwd_dAv(q, k, vn, do, Aqk, scale, cut, BT)
    dh, dh0, dv2 = kda.chunk_kda_bwd_dhu(qg, kg, w, do, dvl, gk=gc, h0=h0, dht=dht, scale=scale,
                                         cu_seqlens=cut, chunk_size=BT)
    dq, dk, dv, db, dg, dAkk = kda.chunk_kda_bwd_wy_dqkg_fused(q, k, v, vn, gc, beta, Akk, h, do, dh, dv2,
                                                               scale, False, cut, BT)
    dq, dk, db, dg = kda.chunk_kda_bwd_intra(q, k, gc, beta, dAqk, dAkk, dq, dk, db, dg, cut, None, BT)
    dg = kda.chunk_local_cumsum(dg, BT, reverse=True, cu_seqlens=cut)
    for n, t in (("v", dv), ("beta", db), ("g", dg), ("h0", dh0)):
        torch.testing.assert_close(t, ours[2][n], rtol=0, atol=0, msg=n)
    # dq, dk per value head (FLA's layout): their sums over each group are chunk_kda's (the
    # kernel's group sum runs in another order: equal to fp32 rounding)
    assert dq.shape == (B, T, HV, K) and dk.shape == (B, T, HV, K)
    for n, t in (("q", dq), ("k", dk)):
        torch.testing.assert_close(t.unflatten(2, (H, HV // H)).sum(3), ours[2][n], rtol=1e-5, atol=1e-6, msg=n)
    # ... and each value head's is the gradient w.r.t. that head's copy of q, k (chunk_kda on q, k
    # repeated over the value heads: no GVA)
    rep = dict(d, q=d["q"].repeat_interleave(HV // H, 2), k=d["k"].repeat_interleave(HV // H, 2))
    per_head = run_ours(rep, scale, cu, {}, BT, device)
    for n, t in (("q", dq), ("k", dk)):
        torch.testing.assert_close(t, per_head[2][n], rtol=0, atol=0, msg=n)


def test_sub_fwd_intra_matches_float64(device):
    B, T, H, HV, K, BT = 2, 45, 1, 2, 24, 32
    d = make_inputs(B, T, H, HV, K, 8, torch.float32, seed=22, gate_scale=3.0)
    gc = torch.zeros(d["g"].shape, dtype=torch.float64)
    for b in range(B):
        for c0 in range(0, T, BT):
            gc[b, c0:c0 + BT] = d["g"][b, c0:c0 + BT].double().cumsum(0)
    Aqk, Akk = kda.chunk_kda_intra_A(d["q"].to(device), d["k"].to(device), gc.float().to(device),
                                     d["beta"].to(device), 0.6, None, BT)

    def oracle(dt):
        A1 = torch.zeros(B, T, HV, BT, dtype=dt)
        A2 = torch.zeros(B, T, HV, BT, dtype=dt)
        for b in range(B):
            for c0 in range(0, T, BT):
                c1 = min(c0 + BT, T)
                C = c1 - c0
                qq, kk = (d[n][b, c0:c1].to(dt).repeat_interleave(HV // H, 1).transpose(0, 1) for n in ("q", "k"))
                gm = gc[b, c0:c1].to(dt).transpose(0, 1)
                bt = d["beta"][b, c0:c1].to(dt).transpose(0, 1)
                incl = torch.ones(C, C, dtype=torch.bool).tril()
                diff = gm[:, :, None, :] - gm[:, None, :, :]
                E = torch.where(incl[:, :, None], diff, torch.full_like(diff, -math.inf)).exp()
                P = 0.6 * torch.einsum("hic,hjc,hijc->hij", qq, kk, E)
                L = (bt[:, :, None] * torch.einsum("hic,hjc,hijc->hij", kk, kk, E)).tril(-1)
                eye = torch.eye(C, dtype=dt)
                X = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
                A1[b, c0:c1, :, :C] = P.transpose(0, 1)
                A2[b, c0:c1, :, :C] = X.transpose(0, 1)
        return A1, A2

    r64, b32 = oracle(torch.float64), oracle(torch.float32)
    check(f"{device} fwd_intra Aqk", Aqk, b32[0], r64[0], torch.float32)
    check(f"{device} fwd_intra Akk", Akk, b32[1], r64[1], torch.float32)


@pytest.mark.parametrize("lb", [None, -4.0])
def test_fused_kda_gate_matches_float64(device, lb):
    HV, K = 3, 5
    gen = torch.Generator().manual_seed(23)
    g = torch.randn(2, 7, HV, K, generator=gen) * 3
    g[0, 0, 0, 0] = 30.0  # the softplus threshold branch
    A_log = torch.randn(HV, generator=gen)
    dt_bias = torch.randn(HV * K, generator=gen)
    dy = torch.randn(2, 7, HV, K, generator=gen)

    def comp(dt):
        x = [t.to(dt).requires_grad_() for t in (g, A_log, dt_bias)]
        opts = {"gate": True} if lb is None else {"gate": True, "lb": lb}
        y = preprocess(None, None, x[0], None, opts, x[1], x[2])[2]
        return y, torch.autograd.grad(y, x, dy.to(dt))

    x = [t.to(device).requires_grad_() for t in (g, A_log, dt_bias)]
    y = kda.fused_kda_gate(*x, lower_bound=lb)
    gr = torch.autograd.grad(y, x, dy.to(device))
    (y64, g64), (yb, gb) = comp(torch.float64), comp(torch.float32)
    check(f"{device} kda_gate lb={lb} y", y, yb, y64, torch.float32)
    for n, a, b, c in zip(("g", "A_log", "dt_bias"), gr, gb, g64):
        check(f"{device} kda_gate lb={lb} d{n}", a, b, c, torch.float32)


# ---------------------------------------------------------------------------------------------
# torch.library: opcheck and torch.compile.


def test_opcheck_top_level_ops():
    d = make_inputs(1, 20, 1, 2, 8, 8, torch.float32, seed=30)
    args = (d["q"], d["k"], d["v"], d["g"], d["beta"], 0.3, d["h0"], True, True, True, d["A_log"], d["dt_bias"],
            True, True, None, None, 32, False, False, 0.0)
    torch.library.opcheck(torch.ops.fusedops.chunk_kda_fwd.default, args)
    torch.library.opcheck(torch.ops.fusedops.fused_recurrent_kda_fwd.default,
                          (d["q"], d["k"], d["v"], d["g"], d["beta"], 0.3, d["h0"], True, None))
    torch.library.opcheck(torch.ops.fusedops.kda_gate_fwd.default, (d["g"], d["A_log"], d["dt_bias"], True, -2.0))


# ---------------------------------------------------------------------------------------------
# Errors


def test_errors():
    q, k, v, g, b = FAMILY.small_args()
    with pytest.raises(DeprecationWarning, match="head_first"):
        fusedops.chunk_kda(q, k, v, g, b, head_first=True)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        fusedops.chunk_kda(q, torch.randn(1, 8, 1, 8), v, g, b)
    with pytest.raises(ValueError, match="not a multiple of the 2 q/k heads"):
        fusedops.chunk_kda(q, k, torch.randn(1, 8, 3, 8), -torch.rand(1, 8, 3, 8), torch.rand(1, 8, 3))
    for bt in (16, 48):
        with pytest.raises(ValueError, match=f"chunk_size must be 32 or 64, got {bt}"):
            fusedops.chunk_kda(q, k, v, g, b, chunk_size=bt)
    q2, k2, v2, g2, b2 = FAMILY.small_args(B=2)
    with pytest.raises(ValueError, match="with cu_seqlens the batch size must be 1"):
        fusedops.chunk_kda(q2, k2, v2, g2, b2, cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="initial_state must be torch.float32"):
        fusedops.chunk_kda(q, k, v, g, b, initial_state=torch.zeros(1, 2, 8, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="initial_state must be torch.float32"):
        fusedops.fused_recurrent_kda(q, k, v, g, b, initial_state=torch.zeros(1, 2, 8, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[N,HV,K,V\] with N=1"):
        fusedops.chunk_kda(q, k, v, g, b, initial_state=torch.zeros(2, 2, 8, 8))
    with pytest.raises(ValueError, match="allow_neg_eigval requires use_beta_sigmoid_in_kernel"):
        fusedops.chunk_kda(q, k, v, g, b, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="use_gate_in_kernel requires A_log unless lower_bound is set"):
        fusedops.chunk_kda(q, k, v, g, b, use_gate_in_kernel=True)
    for lb in (None, -6.0, 0.0):
        with pytest.raises(ValueError, match=r"safe_gate with use_gate_in_kernel requires lower_bound in \[-5, 0\)"):
            fusedops.chunk_kda(q, k, v, g, b, use_gate_in_kernel=True, A_log=torch.zeros(2), safe_gate=True,
                               lower_bound=lb)
    qb, kb = torch.randn(1, 8, 2, 300), torch.randn(1, 8, 2, 300)
    with pytest.raises(ValueError, match="K must be <= 256"):
        fusedops.chunk_kda(qb, kb, v, torch.zeros(1, 8, 2, 300), b)
    with pytest.raises(TypeError, match="v must have the dtype of q"):
        fusedops.chunk_kda(q, k, v.bfloat16(), g, b)
    with pytest.raises(ValueError, match=r"g must have shape \[B,T,HV,K\]"):
        fusedops.chunk_kda(q, k, v, g[..., 0], b)
    with pytest.raises(ValueError, match=r"beta must have shape \[B,T,HV\]"):
        fusedops.chunk_kda(q, k, v, g, b[..., None])
    with pytest.raises(ValueError, match="dt_bias must be a contiguous tensor of HV\\*K=16 elements"):
        fusedops.chunk_kda(q, k, v, g, b, use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(2))
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        fusedops.chunk_kda(q, k, v, g, b, bogus=1)
    with fusedops.validation():
        with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
            fusedops.chunk_kda(q, k, v, g, b, cu_seqlens=torch.tensor([0, 6, 3, 8]))
        with pytest.raises(ValueError, match="cu_seqlens must end at T=8"):
            fusedops.chunk_kda(q, k, v, g, b, cu_seqlens=torch.tensor([0, 6, 12]))
    with pytest.raises(ValueError, match="A_log is required unless lower_bound is set"):
        kda.fused_kda_gate(g, None)


def test_compatibility_keywords():
    d = make_inputs(1, 40, 1, 2, 8, 8, torch.float32, seed=32, cu=[0, 17, 40])
    cu = torch.tensor([0, 17, 40], dtype=torch.int64)
    o1, h1 = fusedops.chunk_kda(d["q"], d["k"], d["v"], d["g"], d["beta"], 0.3, d["h0"], True, cu_seqlens=cu)
    # disable_recompute is accepted (W, U, h are always recomputed); cu_seqlens_cpu builds the indices
    o2, h2 = fusedops.chunk_kda(d["q"], d["k"], d["v"], d["g"], d["beta"], 0.3, d["h0"], True, cu_seqlens=cu,
                                cu_seqlens_cpu=cu.clone(), disable_recompute=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)
    with pytest.raises(NotImplementedError, match="return_intermediate_states is not supported"):
        fusedops.chunk_kda(d["q"], d["k"], d["v"], d["g"], d["beta"], return_intermediate_states=True)
