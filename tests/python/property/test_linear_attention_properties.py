"""Property-based tests (hypothesis) of the linear-attention top levels: chunk_gated_delta_rule,
fused_recurrent_gated_delta_rule, chunk_kda, fused_recurrent_kda. Random shapes (1, primes, both
sides of the chunk sizes, grouped value heads, varlen with empty sequences), dtypes, chunk sizes
and options (initial state, output_final_state, in-kernel l2norm, the in-kernel gate in both KDA
forms, the beta sigmoid with negative eigenvalues, absent g / beta in the per-token forms); the
output, the final state and every gradient against the float64 per-token recurrence under the
precision policy, the base being the families' own composites (the chunked algorithm in the
input dtype for the chunk forms, the recurrence in the input dtype for the per-token forms;
tests/python/ops/test_gated_delta_rule.py, test_kda.py). Calls pass everything after q, k, v, g,
beta by keyword."""

from __future__ import annotations

import fusedops
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.common import linear_attention as lat
from tests.common import tolerance
from tests.python.property.common import DTYPES, SETTINGS, composite_of

# Lengths on both sides of the chunk sizes (16 / 32 / 64), 1 and primes.
LENGTHS = st.sampled_from([1, 2, 3, 5, 7, 13, 15, 16, 17, 31, 32, 33, 37, 63, 64, 65, 71])
HEADS = st.sampled_from([(1, 1), (1, 2), (2, 2), (2, 4), (3, 3)])  # (H, HV)
HEAD_DIMS = st.sampled_from([1, 3, 8, 16, 17, 32])

FAMILIES = {
    "gdn": ("test_gated_delta_rule", fusedops.chunk_gated_delta_rule, fusedops.fused_recurrent_gated_delta_rule,
            (16, 32, 64)),
    "kda": ("test_kda", fusedops.chunk_kda, fusedops.fused_recurrent_kda, (32, 64)),
}


def _module(family):
    return composite_of(FAMILIES[family][0], "make_inputs").__globals__


def _varlen(data, T):
    cuts = sorted(data.draw(st.lists(st.integers(0, T), max_size=3), label="cuts"))
    return [0, *cuts, T]


def _options(data, family, recurrent):
    opts = {"l2": data.draw(st.booleans(), label="l2")}
    if not recurrent or family == "kda":
        opts["gate"] = data.draw(st.booleans(), label="gate_in_kernel")
    if not recurrent:
        opts["sig"] = data.draw(st.booleans(), label="beta_sigmoid")
        opts["neg"] = opts["sig"] and data.draw(st.booleans(), label="allow_neg_eigval")
    if family == "kda" and opts.get("gate"):
        form = data.draw(st.sampled_from(["softplus", "lower_bound", "no_bias", "no_alog_lb"]), label="gate_form")
        if form == "lower_bound":
            opts["lb"] = -5.0
        elif form == "no_bias":
            opts["bias"] = False
        elif form == "no_alog_lb":
            opts["lb"], opts["alog"] = -3.0, False
        if not recurrent and data.draw(st.booleans(), label="safe_gate") and "lb" in opts:
            opts["safe"] = True
    return {k: v for k, v in opts.items() if v is not False or k in ("bias", "alog")}


def _call(family, recurrent, x, opts, scale, cu, BT, final, device):
    _, chunk, rec, _ = FAMILIES[family]
    gate = bool(opts.get("gate"))
    kw = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=scale, initial_state=x["h0"],
              output_final_state=final, use_qk_l2norm_in_kernel=bool(opts.get("l2")),
              cu_seqlens=None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device))
    if gate:
        kw.update(use_gate_in_kernel=True, A_log=x["A_log"] if opts.get("alog", True) else None,
                  dt_bias=x["dt_bias"] if opts.get("bias", True) else None)
    if family == "kda" and "lb" in opts:
        kw["lower_bound"] = opts["lb"]
    if not recurrent:
        kw.update(chunk_size=BT, use_beta_sigmoid_in_kernel=bool(opts.get("sig")),
                  allow_neg_eigval=bool(opts.get("neg")))
        if family == "kda":
            kw["safe_gate"] = bool(opts.get("safe"))
    return (rec if recurrent else chunk)(**kw)


def _check(family, recurrent, device, data, dtype, seed):
    mod = _module(family)
    varlen = data.draw(st.booleans(), label="varlen")
    B = 1 if varlen else data.draw(st.integers(1, 2), label="B")
    T = data.draw(LENGTHS, label="T")
    H, HV = data.draw(HEADS, label="H, HV")
    K, V = data.draw(HEAD_DIMS, label="K"), data.draw(HEAD_DIMS, label="V")
    BT = data.draw(st.sampled_from(FAMILIES[family][3]), label="chunk_size")
    cu = _varlen(data, T) if varlen else None
    opts = _options(data, family, recurrent)
    if opts.get("l2") and K == 1:
        # With in-kernel l2norm at K = 1 the normalized q, k are +-1 and their gradients are a
        # cancellation of two O(1) terms (exactly ~eps / |k|^3): an fp32 result is off by about an
        # ulp of those terms, above the policy's floor of the ~0 result. Such a head dim is drawn
        # without l2norm (found by this test: dk 1.2x the floor at T = K = V = 1).
        K = 2
    h0 = data.draw(st.booleans(), label="initial_state")
    final = data.draw(st.booleans(), label="output_final_state")
    drop = recurrent and data.draw(st.sampled_from(["none", "g", "beta", "both"]), label="absent") or "none"
    if drop != "none" and opts.get("gate"):
        drop = "beta" if drop == "g" else drop.replace("both", "beta")
    d = mod["make_inputs"](B, T, H, HV, K, V, dtype, seed=seed, cu=cu, opts=opts, h0=h0)
    if drop in ("g", "both"):
        d["g"] = None
    if drop in ("beta", "both"):
        d["beta"] = None
    if not final:
        d["dht"] = torch.zeros_like(d["dht"])
    scale = K ** -0.5

    x = lat.leaves(d, lat.DIFF, None, device)
    o, ht = _call(family, recurrent, x, opts, scale, cu, BT, final, device)
    outs, gos = [o], [d["do"].to(device, o.dtype)]
    if final:
        outs.append(ht)
        gos.append(d["dht"].to(device))
    else:
        assert ht is None
    names = lat.wrt(x, opts)
    grads = torch.autograd.grad(outs, [x[n] for n in names], gos, allow_unused=True)
    ours = {n: (g if g is not None else torch.zeros_like(x[n])) for n, g in zip(names, grads)}

    kind = "recurrent" if recurrent else "chunk"
    ref = mod["run_composite"](d, scale, cu, opts, BT, torch.float64, kind="recurrent")
    base = mod["run_composite"](d, scale, cu, opts, BT, dtype, kind=kind)
    tag = f"{family} {'recurrent' if recurrent else 'chunk'} {device} {dtype} seed={seed}"
    lat.check(f"{tag} o", o, base[0], ref[0], dtype)
    if final:
        lat.check(f"{tag} final_state", ht, base[1], ref[1], tolerance.coarsest(dtype, torch.float32))
    for n in names:
        dt = dtype if n in ("q", "k", "v") else tolerance.coarsest(dtype, torch.float32)
        if n in ("A_log", "dt_bias"):
            # The gate parameters' gradients are sums over all B*T tokens of per-token terms
            # (dgate_t * dgate_t/dparam) whose own errors the policy bounds (dg above); their sum
            # is held to the policy's floor times the number of terms (the worst-case accumulation).
            # At tiny sizes (K = V = 1) the composite's sum can be exact to an ulp where ours, from
            # the chunk pipeline's dg, is ~15 ulps off, over the plain floor.
            base_err = tolerance.max_abs_error(base[2][n], ref[2][n])
            err = tolerance.max_abs_error(ours[n], ref[2][n])
            bound = 2 * base_err + tolerance.floor_for(dt) * max(1.0, float(ref[2][n].abs().max())) * max(1, B * T)
            assert err <= bound, f"{tag} d{n}: max-abs err {err:.3e} vs {bound:.3e} (base err {base_err:.3e})"
            continue
        lat.check(f"{tag} d{n}", ours[n], base[2][n], ref[2][n], dt)


@pytest.mark.parametrize("family,recurrent", [("gdn", False), ("gdn", True), ("kda", False), ("kda", True)],
                         ids=["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda",
                              "fused_recurrent_kda"])
@SETTINGS
@given(dtype=DTYPES, data=st.data(), seed=st.integers(0, 2**20))
def test_linear_attention_top_level(device, family, recurrent, dtype, data, seed):
    _check(family, recurrent, device, data, dtype, seed)
