"""Inputs and plain PyTorch composites shared by the compat tests (the tolerance "base" runs them
in the input dtype; the float64 oracle is fusedops.reference)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tests.common.tolerance import assert_close


def spans(B: int, T: int, cu):
    return ([(b, 0, T) for b in range(B)] if cu is None else
            [(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)])


def delta_rule_recurrence(q, k, v, g, beta, scale, h0=None, cu=None):
    """The gated delta rule token by token: ``S = decay S; S += k (beta (v - S^T k))^T;
    o = scale S^T q`` with decay ``exp(g)`` per head (g ``[B,T,HV]``, GDN) or per key channel
    (g ``[B,T,HV,K]``, KDA); GVA by repeating q/k heads. Returns ``(o, final states)``."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    q, k = q.repeat_interleave(HV // H, 2), k.repeat_interleave(HV // H, 2)
    o = v.new_zeros(B, T, HV, V)
    finals = []
    for n, (b, s, e) in enumerate(spans(B, T, cu)):
        S = h0[n].to(v.dtype) if h0 is not None else v.new_zeros(HV, K, V)
        for t in range(s, e):
            decay = g[b, t].exp()
            S = S * (decay[:, None, None] if g.dim() == 3 else decay[:, :, None])
            delta = beta[b, t][:, None] * (v[b, t] - torch.einsum("hk,hkv->hv", k[b, t], S))
            S = S + torch.einsum("hk,hv->hkv", k[b, t], delta)
            o[b, t] = scale * torch.einsum("hk,hkv->hv", q[b, t], S)
        finals.append(S)
    return o, torch.stack(finals)


def delta_rule_chunked(q, k, v, g, beta, scale, h0=None, cu=None, BT=64):
    """The chunked algorithm in plain torch, in the inputs' dtype (the tolerance base of the
    chunk forms): per chunk, ``A = (I + beta (K K^T . Gamma)_strict)^{-1}``, ``W = A (beta
    e^g K)``, ``U = A (beta V)``, ``V' = U - W S``, ``O = scale (e^g Q S + (Q K^T . Gamma) V')``,
    ``S = e^{g_last} S + (e^{g_last - g} K)^T V'`` with ``Gamma`` the gate ratios per key
    channel (one per head for a scalar gate)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    q, k = q.repeat_interleave(HV // H, 2), k.repeat_interleave(HV // H, 2)
    outs, finals = [], []
    for n, (b, s, e) in enumerate(spans(B, T, cu)):
        S = h0[n].to(v.dtype) if h0 is not None else v.new_zeros(HV, K, V)
        rows = []
        for c0 in range(s, e, BT):
            c1 = min(c0 + BT, e)
            C = c1 - c0
            Q, Kc, Vc = (x[b, c0:c1].transpose(0, 1) for x in (q, k, v))  # [HV, C, D]
            gm = g[b, c0:c1].transpose(0, 1).cumsum(1)  # [HV, C] or [HV, C, K]
            if gm.dim() == 2:
                gm = gm[..., None].expand(HV, C, K)
            bt = beta[b, c0:c1].transpose(0, 1)[..., None]  # [HV, C, 1]
            incl = torch.ones(C, C, dtype=torch.bool).tril()
            diff = gm[:, :, None, :] - gm[:, None, :, :]  # [HV, C, C, K]
            Gam = torch.where(incl[None, :, :, None], diff, torch.full_like(diff, -math.inf)).exp()
            QK = torch.einsum("hic,hjc,hijc->hij", Q, Kc, Gam)
            KK = torch.einsum("hic,hjc,hijc->hij", Kc, Kc, Gam).tril(-1)
            eye = torch.eye(C, dtype=v.dtype).expand(HV, C, C)
            A = torch.linalg.solve_triangular(eye + bt * KK, eye, upper=False, unitriangular=True)
            W = A @ (bt * gm.exp() * Kc)
            U = A @ (bt * Vc)
            Vn = U - W @ S
            rows.append((scale * ((gm.exp() * Q) @ S + QK @ Vn)).transpose(0, 1))
            gl = gm[:, -1:, :]  # [HV, 1, K]
            S = gl.transpose(1, 2).exp() * S + ((gl - gm).exp() * Kc).transpose(1, 2) @ Vn
        outs.append(torch.cat(rows, 0) if rows else v.new_zeros(0, HV, V))
        finals.append(S)
    o = torch.stack(outs, 0) if cu is None else torch.cat(outs, 0)[None]
    return o, torch.stack(finals)


def la_inputs(B, T, H, HV, K, V, dtype, seed, kda=False, n_states=None):
    """q, k (normalised), v, a log decay g (``[B,T,HV]``, or ``[B,T,HV,K]`` for KDA), beta in
    (0, 1), and fp32 initial states for ``n_states`` sequences (default B)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = rnd(B, T, H, K).to(dtype)
    k = F.normalize(rnd(B, T, H, K), dim=-1).to(dtype)
    v = rnd(B, T, HV, V).to(dtype)
    g = (F.logsigmoid(rnd(B, T, HV, K)) * 0.5 if kda else F.logsigmoid(rnd(B, T, HV))).to(dtype)
    beta = torch.sigmoid(rnd(B, T, HV)).to(dtype)
    h0 = (rnd(n_states or B, HV, K, V) * 0.5).float()
    return q, k, v, g, beta, h0


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def check_against_reference(name, ours, base, ref, dtype):
    """assert_close on each (ours, base, ref64) triple of tuples of tensors."""
    for i, (a, b, r) in enumerate(zip(ours, base, ref)):
        if a is None and r is None:
            continue
        assert_close(a, b, r, dtype, f"{name}[{i}]")


def bitwise(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
