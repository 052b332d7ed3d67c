"""Test helpers both linear-attention families' torch-layer tests (test_gated_delta_rule.py,
test_kda.py, test_linear_attention_families.py) share: the per-token recurrence in plain torch (the
float64 oracle; the gate is one decay per value head, g [B,T,HV], or one per key channel,
g [B,T,HV,K]), the unit lower inverse of the chunked bases, the comparison under the precision
policy with the RMS-ratio metric, the plumbing that runs a top level or a composite with
gradients, and ``Family``: what differs between the two families in the tests they share, with
the check of a chunk top level against the oracle that each family's ``backend_case`` test runs."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from tests.common import tolerance
from tests.common.tolerance import assert_close

BITWISE = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
           torch.float16: torch.int16}

# The differentiable inputs of a top level, in the order of make_inputs' dicts.
DIFF = ("q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")


def seqs(B, T, cu):
    """(batch row, first token, length) of each sequence."""
    if cu is None:
        return [(b, 0, T) for b in range(B)]
    cu = [int(x) for x in cu]
    return [(0, cu[i], cu[i + 1] - cu[i]) for i in range(len(cu) - 1)]


def l2n(x, eps=1e-6):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrence(q, k, v, g, beta, scale, h0=None, cu=None):
    """The per-token recurrence in plain torch (any dtype; float64 for the oracle). g [B,T,HV] or
    [B,T,HV,K] and beta may be None (no decay / beta = 1). Returns (o, final states [N,HV,K,V])."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    q, k = q.repeat_interleave(G, 2), k.repeat_interleave(G, 2)
    outs, finals = [], []
    for n, (b, t0, L) in enumerate(seqs(B, T, cu)):
        S = h0[n] if h0 is not None else q.new_zeros(HV, K, V)
        rows = []
        for t in range(t0, t0 + L):
            if g is not None:
                S = S * g[b, t].exp().reshape(HV, -1, 1)  # [HV,1,1] or [HV,K,1]
            p = torch.einsum("hkv,hk->hv", S, k[b, t])
            bt = beta[b, t][:, None] if beta is not None else 1.0
            delta = bt * (v[b, t] - p)
            S = S + k[b, t][:, :, None] * delta[:, None, :]
            rows.append(scale * torch.einsum("hkv,hk->hv", S, q[b, t]))
        outs.append(torch.stack(rows, 0) if rows else v.new_zeros(0, HV, V))
        finals.append(S)
    o = torch.stack(outs, 0) if cu is None else torch.cat(outs, 0)[None]
    return o, torch.stack(finals, 0)


def unit_lower_inverse(L):
    """(I + L)^{-1} of strictly lower [..., n, n] by forward substitution (any dtype)."""
    n = L.shape[-1]
    rows = []
    eye = torch.eye(n, dtype=L.dtype, device=L.device).expand(L.shape)
    for i in range(n):
        r = eye[..., i, :]
        for m in range(i):
            r = r - L[..., i, m, None] * rows[m]
        rows.append(r)
    return torch.stack(rows, -2)


def spec_ratio(ours, ref) -> float:
    """The RMS-ratio metric: RMS(ref - ours) / (RMS(ref) + 1e-8)."""
    a, b = ours.detach().double().cpu(), ref.detach().double().cpu()
    if b.numel() == 0:
        return 0.0
    return float((a - b).pow(2).mean().sqrt() / (b.pow(2).mean().sqrt() + 1e-8))


def check(name, ours, base, ref, dtype):
    v = assert_close(ours, base, ref, dtype, name)
    tolerance.report(f"{name} [spec RMS ratio {spec_ratio(ours, ref):.2e}]", v.err, v.base_err, v.rms_rel, v.tol)


def compare_all(tag, ours, base, ref, dtype):
    """o, final_state and every gradient of (o, final_state, {name: grad}) triples."""
    o, ht, g = ours
    ob, htb, gb = base
    o64, ht64, g64 = ref
    check(f"{tag} o", o, ob, o64, dtype)
    check(f"{tag} final_state", ht, htb, ht64, tolerance.coarsest(dtype, torch.float32))
    for n in g:
        dt = dtype if n in ("q", "k", "v") else tolerance.coarsest(dtype, torch.float32)
        check(f"{tag} d{n}", g[n], gb[n], g64[n], dt)


def leaves(d, names, dtype=None, device="cpu"):
    """Fresh leaf tensors requiring grad (None stays None), on device, optionally cast."""
    out = {}
    for n in names:
        t = d[n]
        if t is None:
            out[n] = None
            continue
        t = t.detach().to(device)
        if dtype is not None:
            t = t.to(dtype)
        out[n] = t.requires_grad_()
    return out


def wrt(x, opts):
    """The inputs a call with these options is differentiable in: the gate parameters only with the
    gate in the kernel (and each unless opts turns it off with alog / bias = False)."""
    out = []
    for n in DIFF:
        if x[n] is None:
            continue
        if n == "A_log" and not (opts.get("gate") and opts.get("alog", True)):
            continue
        if n == "dt_bias" and not (opts.get("gate") and opts.get("bias", True)):
            continue
        out.append(n)
    return out


def with_grads(d, x, o, ht, opts, device, final=True):
    """(o, final_state, {name: grad}) of a library call on the leaves x, from the upstream
    gradients d["do"] (and d["dht"] when final)."""
    outs, gos = [o], [d["do"].to(device, o.dtype)]
    if final:
        outs.append(ht)
        gos.append(d["dht"].to(device))
    names = wrt(x, opts)
    gr = torch.autograd.grad(outs, [x[n] for n in names], gos)
    return o, ht, dict(zip(names, gr))


def run_composite(d, scale, cu, opts, BT, dtype, kind, preprocess, chunked):
    """The oracle (kind "recurrence": the float64 recurrence) or the base (kind "chunk": the
    family's chunked composite in dtype) after the family's preprocess, with gradients."""
    x = leaves(d, DIFF, dtype)
    q, k, g, beta = preprocess(x["q"], x["k"], x["g"], x["beta"], opts, x["A_log"], x["dt_bias"])
    if kind == "chunk":
        o, ht = chunked(q, k, x["v"], g, beta, scale, x["h0"], cu, BT)
    else:
        o, ht = recurrence(q, k, x["v"], g, beta, scale, x["h0"], cu)
    outs, gos = [o, ht], [d["do"].to(dtype), d["dht"].to(dtype)]
    names = wrt(x, opts)
    gr = torch.autograd.grad(outs, [x[n] for n in names], gos, allow_unused=True)
    return o, ht, {n: (gg if gg is not None else torch.zeros_like(x[n])) for n, gg in zip(names, gr)}


@dataclass(frozen=True)
class Family:
    """What differs between the two families in the tests they share: one per family test module
    (its ``FAMILY``), with that module's adapters. ``recurrent`` and ``reference_recurrent`` take
    beta by keyword (GDN's per-token form has gk and gv before it, FLA's order)."""

    name: str  # "gdn" / "kda": the test ids
    op: str  # the chunk form's registry name (the module's OP)
    chunk: Callable  # fusedops.chunk_*
    recurrent: Callable  # fusedops.fused_recurrent_*
    reference_chunk: Callable  # fusedops.reference.chunk_*
    reference_recurrent: Callable  # fusedops.reference.fused_recurrent_*
    per_channel_gate: bool  # g [B,T,HV,K] (KDA) rather than [B,T,HV] (GDN)
    make_inputs: Callable  # (B, T, H, HV, K, V, dtype, seed, cu=None, opts=None, ...) -> dict
    run_ours: Callable  # (d, scale, cu, opts, BT, device, ...) -> (o, final_state, {name: grad})
    run_composite: Callable  # (d, scale, cu, opts, BT, dtype, kind) -> the same, of the composite
    recurrent_as_chunk: Callable  # the per-token form called with the chunk form's arguments
    forced: Callable  # (backend) -> context forcing the family's ops onto that backend

    def small_args(self, B=1, T=8, H=2, HV=2, K=8, V=8):
        """Unseeded q, k, v, g, beta (g of the family's shape) for calls that must raise."""
        g_shape = (B, T, HV, K) if self.per_channel_gate else (B, T, HV)
        return (torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, HV, V), -torch.rand(*g_shape),
                torch.rand(B, T, HV))


def check_chunk_against_float64_recurrence(fam, backend_case, case, double_state=False):
    """The top level on one forced (device, backend, dtype) against the float64 recurrence, with the
    family's chunked composite in that dtype as the base, forward and every gradient. case: (name,
    B, T, H, HV, K, V, BT, cu, opts); 16-bit storage runs the plain cases only. double_state: the
    initial state and its cotangent in float64 when the inputs are."""
    name, B, T, H, HV, K, V, BT, cu, opts = case
    bc = backend_case
    if bc.dtype in (torch.bfloat16, torch.float16) and opts:
        pytest.skip("16-bit storage runs the plain cases (the options are checked in fp32/fp64)")
    d = fam.make_inputs(B, T, H, HV, K, V, bc.dtype, seed=zlib.crc32(name.encode()) % 1000, cu=cu, opts=opts)
    if double_state and bc.dtype == torch.float64:
        d["h0"], d["dht"] = d["h0"].double(), d["dht"].double()
    scale = K ** -0.5
    with fam.forced(bc.backend):
        ours = fam.run_ours(d, scale, cu, opts, BT, bc.device)
    assert ours[0].dtype == bc.dtype and ours[1].dtype == (torch.float64 if bc.dtype == torch.float64 else torch.float32)
    ref = fam.run_composite(d, scale, cu, opts, BT, torch.float64, kind="recurrent")
    base = fam.run_composite(d, scale, cu, opts, BT, bc.dtype, kind="chunk")
    compare_all(f"{bc.id} {name}", ours, base, ref, bc.dtype)
