"""fusedops.compat.fla's gated delta rule: chunk_gated_delta_rule and
fused_recurrent_gated_delta_rule called as FLA 0.6.0's tests and GatedDeltaNet layer call them,
and FLA's chunk pipeline rebuilt from the mirrored sub-operators exactly as fla/ops/
gated_delta_rule/chunk.py composes them (gates in log2 units, keyword calls). Each is compared
with the native fusedops call (same kernels: bitwise) and with the float64 reference
(fusedops.reference) under the precision policy, the base being a plain PyTorch recurrence in
the input dtype."""

from __future__ import annotations

import math
import warnings

import fusedops
import pytest
import torch
import torch.nn.functional as F
from fusedops.compat.fla.ops.common.chunk_delta_h import (
    chunk_gated_delta_rule_bwd_dhu,
    chunk_gated_delta_rule_fwd_h,
)
from fusedops.compat.fla.ops.common.chunk_o import chunk_bwd_dqkwg, chunk_bwd_dv_local, chunk_fwd_o
from fusedops.compat.fla.ops.common.chunk_scaled_dot_kkt import chunk_scaled_dot_kkt_fwd
from fusedops.compat.fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from fusedops.compat.fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
from fusedops.compat.fla.ops.gated_delta_rule.gate import (
    fused_gdn_gate,
    gdn_gate_bwd,
    gdn_gate_chunk_cumsum,
    gdn_gate_fwd,
)
from fusedops.compat.fla.ops.gated_delta_rule.wy_fast import prepare_wy_repr_bwd, recompute_w_u_fwd
from fusedops.compat.fla.ops.utils import chunk_local_cumsum, prepare_chunk_indices, solve_tril
from fusedops.ops import gated_delta_rule as gdn

from tests.common.tolerance import assert_close
from tests.python.compat.compat_common import (
    bitwise,
    check_against_reference,
    delta_rule_chunked,
    delta_rule_recurrence,
    la_inputs,
    leaves,
)

# FLA's fla.ops.utils.constant.RCP_LN2 is 1.4426950216, 1/ln 2 rounded to float32; the float64
# tests use 1/ln 2 itself (the log2 units the sub-operators read).
RCP_LN2 = 1 / math.log(2)
CU = torch.tensor([0, 29, 70], dtype=torch.int32)


def _grads(outs, wrt, gouts):
    pairs = [(o, g) for o, g in zip(outs, gouts) if o is not None]
    got = torch.autograd.grad([o for o, _ in pairs], [t for t in wrt if t is not None],
                              [g for _, g in pairs], allow_unused=True)
    it = iter(got)
    return [next(it) if t is not None else None for t in wrt]


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_chunk_keyword_form_of_flas_tests_matches_native_and_float64(varlen):
    B, T = (1, 70) if varlen else (2, 70)
    cu = CU if varlen else None
    q, k, v, g, beta, h0 = la_inputs(B, T, 2, 4, 16, 16, torch.float32, 11, n_states=2)
    scale = 16 ** -0.5
    do, dht = torch.randn(B, T, 4, 16), torch.randn(2, 4, 16, 16)
    ins = leaves(q, k, v, g, beta, h0)
    kw = dict(cu_seqlens=cu, chunk_indices=prepare_chunk_indices(cu, 64)) if varlen else {}
    o, ht = chunk_gated_delta_rule(q=ins[0], k=ins[1], v=ins[2], g=ins[3], beta=ins[4], scale=scale,
                                   initial_state=ins[5], output_final_state=True, **kw)
    got = [o, ht] + _grads((o, ht), ins, (do, dht))
    nat = leaves(q, k, v, g, beta, h0)
    on, hn = fusedops.chunk_gated_delta_rule(*nat[:5], scale, nat[5], True, cu_seqlens=cu)
    want = [on, hn] + _grads((on, hn), nat, (do, dht))
    for a, b in zip(got, want):
        assert bitwise(a, b)
    r = leaves(q, k, v, g, beta, h0)
    o64, h64 = fusedops.reference.chunk_gated_delta_rule(*r[:5], scale, r[5], True, cu_seqlens=cu)
    ref = [o64, h64] + _grads((o64, h64), r, (do, dht))
    b_ = leaves(q, k, v, g, beta, h0)
    ob, hb = delta_rule_chunked(*b_[:5], scale, b_[5], cu)
    base = [ob, hb] + _grads((ob, hb), b_, (do, dht))
    check_against_reference("fla chunk_gated_delta_rule", got, base, ref, torch.float32)


def test_chunk_positional_order_is_flas():
    """FLA's 9th-12th positions are use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
    allow_neg_eigval, state_v_first (fusedops' native 10th is cu_seqlens)."""
    q, k, v, g, beta, h0 = la_inputs(1, 70, 2, 2, 16, 16, torch.float32, 12)
    h0_vk = h0.transpose(-1, -2).contiguous()
    one = torch.tensor([0, 70], dtype=torch.int32)
    o, ht = chunk_gated_delta_rule(q, k, v, g, beta, None, h0_vk, True, True, True, True, True, one)
    on, hn = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                        use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                        allow_neg_eigval=True, cu_seqlens=torch.tensor([0, 70]))
    assert bitwise(o, on)
    assert bitwise(ht, hn.transpose(-1, -2).contiguous()) and ht.is_contiguous()


def test_chunk_layer_form_gate_in_kernel_and_chunk_size():
    """FLA's GatedDeltaNet layer: raw gate with A_log / dt_bias through **kwargs, beta logits,
    v-first states; chunk_size through **kwargs; unknown keywords ignored as in FLA."""
    q, k, v, a, b, h0 = la_inputs(1, 70, 2, 4, 16, 16, torch.float32, 13, n_states=2)
    A_log, dt_bias = torch.randn(4), torch.randn(4)
    o, ht = chunk_gated_delta_rule(q=q, k=k, v=v, g=a, beta=b, initial_state=h0.transpose(-1, -2),
                                   output_final_state=True, use_qk_l2norm_in_kernel=True,
                                   use_beta_sigmoid_in_kernel=True, allow_neg_eigval=False,
                                   state_v_first=True, cu_seqlens=CU, use_gate_in_kernel=True,
                                   A_log=A_log, dt_bias=dt_bias, chunk_size=32,
                                   position_ids=None)  # an HF keyword FLA ignores
    on, hn = gdn.chunk_gated_delta_rule(q, k, v, a, b, initial_state=h0, output_final_state=True,
                                        use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                        cu_seqlens=CU, use_gate_in_kernel=True, A_log=A_log,
                                        dt_bias=dt_bias, chunk_size=32)
    assert bitwise(o, on) and bitwise(ht, hn.transpose(-1, -2).contiguous())
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        o2, _ = chunk_gated_delta_rule(q, k, v, F.logsigmoid(a), b.sigmoid(), transpose_state_layout=True)
    assert bitwise(o2, gdn.chunk_gated_delta_rule(q, k, v, F.logsigmoid(a), b.sigmoid())[0])


def test_chunk_errors():
    q, k, v, g, beta, _ = la_inputs(1, 8, 2, 2, 16, 16, torch.float32, 14)
    with pytest.raises(NotImplementedError, match=r"fusedops.compat.fla: chunk_gated_delta_rule: "
                                                  r"cp_context of type object \(context parallelism\) is not supported"):
        chunk_gated_delta_rule(q, k, v, g, beta, cp_context=object())
    with pytest.raises(DeprecationWarning, match="head_first has been removed"):
        chunk_gated_delta_rule(q, k, v, g, beta, head_first=False)
    with pytest.raises(ValueError, match="chunk_size must be 16, 32 or 64"):
        chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=128)


def test_fused_recurrent_positional_order_and_forms():
    """FLA's order puts gk and gv before beta: beta is the 7th positional."""
    q, k, v, g, beta, h0 = la_inputs(1, 40, 2, 4, 16, 16, torch.float32, 15)
    o, ht = fused_recurrent_gated_delta_rule(q, k, v, g, None, None, beta, None, h0, True)
    on, hn = gdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=h0, output_final_state=True)
    assert bitwise(o, on) and bitwise(ht, hn)
    # per-key decay gk: the KDA recurrence
    _, _, _, gk, _, _ = la_inputs(1, 40, 2, 4, 16, 16, torch.float32, 16, kda=True)
    o, ht = fused_recurrent_gated_delta_rule(q=q, k=k, v=v, gk=gk, beta=beta, initial_state=h0,
                                             output_final_state=True, cu_seqlens=torch.tensor([0, 40]))
    on, hn = fusedops.fused_recurrent_kda(q, k, v, gk, beta, initial_state=h0, output_final_state=True,
                                          cu_seqlens=torch.tensor([0, 40]))
    assert bitwise(o, on) and bitwise(ht, hn)
    # the raw gate in the kernel, beta already a probability: the gate op, then the recurrence
    A_log, dt_bias = torch.randn(4) * 0.3, torch.randn(4)
    o, _ = fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, use_gate_in_kernel=True, A_log=A_log,
                                            dt_bias=dt_bias)
    assert bitwise(o, gdn.fused_recurrent_gated_delta_rule(q, k, v, gdn.fused_gdn_gate(g, A_log, dt_bias), beta=beta)[0])
    with pytest.raises(NotImplementedError, match="gv"):
        fused_recurrent_gated_delta_rule(q, k, v, gv=torch.zeros_like(v), beta=beta)
    with pytest.raises(NotImplementedError, match="g together with gk"):
        fused_recurrent_gated_delta_rule(q, k, v, g, gk, beta=beta)


def test_fused_recurrent_layer_decoding_form_matches_float64():
    """GatedDeltaNet's decoding call: raw gate in kernel, beta logits, v-first state."""
    q, k, v, a, b, h0 = la_inputs(1, 3, 2, 4, 16, 16, torch.float32, 17)
    A_log, dt_bias = torch.randn(4) * 0.3, torch.randn(4)
    hv = h0.transpose(-1, -2).contiguous()
    o, ht = fused_recurrent_gated_delta_rule(q=q, k=k, v=v, g=a, beta=b, initial_state=hv,
                                             output_final_state=True, use_qk_l2norm_in_kernel=True,
                                             use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                                             use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                                             state_v_first=True)
    o64, h64 = fusedops.reference.chunk_gated_delta_rule(
        q, k, v, a, b, None, h0, True, True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    gb = -A_log.exp() * F.softplus(a + dt_bias)
    ob, hb = delta_rule_recurrence(F.normalize(q, dim=-1, eps=1e-3), F.normalize(k, dim=-1, eps=1e-3),
                                   v, gb, 2 * b.sigmoid(), 16 ** -0.5, h0)
    check_against_reference("fla fused_recurrent layer form", (o, ht.transpose(-1, -2)),
                            (ob, hb), (o64, h64), torch.float32)


def _fla_chunk_fwd_bwd(q, k, v, g, beta, scale, h0, do, dht, cu, state_v_first, chunk_size=64):
    """fla/ops/gated_delta_rule/chunk.py's chunk_gated_delta_rule_fwd / _bwd, on the mirrored
    sub-operators, with FLA's keyword calls (the gate cumsum in log2 units; kept in g's dtype
    here, FLA's default output_dtype being float32)."""
    ci = prepare_chunk_indices(cu, chunk_size) if cu is not None else None
    common = dict(cu_seqlens=cu, chunk_indices=ci)
    gc = chunk_local_cumsum(g, chunk_size=chunk_size, scale=RCP_LN2, output_dtype=None, **common)
    w, u, A = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=gc, beta=beta, chunk_size=chunk_size, **common)
    h, v_new, ht = chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=gc, initial_state=h0, output_final_state=True,
                                                state_v_first=state_v_first, chunk_size=chunk_size, **common)
    o = chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=gc, scale=scale, state_v_first=state_v_first,
                    chunk_size=chunk_size, **common)
    w, u = recompute_w_u_fwd(k=k, v=v, beta=beta, A=A, g=gc, **common)
    h, v_new, _ = chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=gc, initial_state=h0, output_final_state=False,
                                               state_v_first=state_v_first, chunk_size=chunk_size, **common)
    dv = chunk_bwd_dv_local(q=q, k=k, g=gc, do=do, scale=scale, chunk_size=chunk_size, **common)
    dh, dh0, dv = chunk_gated_delta_rule_bwd_dhu(q=q, k=k, w=w, g=gc, h0=h0, dht=dht, do=do, dv=dv, scale=scale,
                                                 state_v_first=state_v_first, chunk_size=chunk_size, **common)
    dq, dk, dw, dg = chunk_bwd_dqkwg(q=q, k=k, v=v_new, w=w, g=gc, h=h, dv=dv, do=do, dh=dh, scale=scale,
                                     state_v_first=state_v_first, chunk_size=chunk_size, **common)
    dk2, dv, db, dg2 = prepare_wy_repr_bwd(k=k, v=v, beta=beta, g=gc, A=A, dw=dw, du=dv, **common)
    dk.add_(dk2)
    dg.add_(dg2)
    dg = chunk_local_cumsum(dg, chunk_size=chunk_size, reverse=True, output_dtype=None, **common)
    return o, ht, dq, dk, dv, dg, db, dh0


@pytest.mark.parametrize("varlen,state_v_first,chunk_size", [(False, False, 64), (True, False, 64),
                                                             (True, True, 32)])
def test_flas_chunk_pipeline_on_the_mirrored_sub_operators(varlen, state_v_first, chunk_size):
    """The sub-operators read FLA's log2 gates and return its natural-log gradients: FLA's own
    composition of them is the gated delta rule, forward and every gradient. Run in float64 on
    the reference backend, so that a wrong unit or layout cannot hide in rounding (the states
    and the partial gate gradients are float32 by the sub-operators' contracts, as in FLA:
    final_state, dh0 and dg are held to the float32 floor)."""
    B, T = (1, 70) if varlen else (2, 70)
    cu = CU if varlen else None
    q, k, v, g, beta, h0 = la_inputs(B, T, 2, 4, 16, 16, torch.float64, 21, n_states=2)
    h0 = h0.double()
    do, dht = torch.randn(B, T, 4, 16, dtype=torch.float64), torch.randn(2, 4, 16, 16, dtype=torch.float64)
    tr = (lambda t: t.transpose(-1, -2).contiguous()) if state_v_first else (lambda t: t)
    with fusedops.use_backend("ref"):
        o, ht, *grads = _fla_chunk_fwd_bwd(q, k, v, g, beta, 0.25, tr(h0), do, tr(dht), cu, state_v_first,
                                           chunk_size)
    ours = [o, tr(ht)] + grads[:-1] + [tr(grads[-1])]
    r = leaves(q, k, v, g, beta, h0)
    o64, h64 = fusedops.reference.chunk_gated_delta_rule(*r[:5], 0.25, r[5], True, cu_seqlens=cu)
    ref = [o64, h64] + _grads((o64, h64), r, (do, dht))
    b_ = leaves(q, k, v, g, beta, h0)
    ob, hb = delta_rule_chunked(*b_[:5], 0.25, b_[5], cu, chunk_size)
    base = [ob, hb] + _grads((ob, hb), b_, (do, dht))
    names = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0")
    for name, a, b, r in zip(names, ours, base, ref):
        fp32 = name in ("final_state", "dg", "dh0")  # float32 by the sub-operators' contracts
        assert_close(a, b, r, torch.float32 if fp32 else torch.float64, f"fla chunk pipeline {name}")


def test_g_gamma_is_a_fixed_per_head_log2_decay():
    """chunk_fwd_o / chunk_bwd_dv_local / chunk_bwd_dqkwg with g_gamma [HV] (FLA: g_gamma * (i+1)
    at position i of a chunk, log2 units) are the fusedops calls with the chunk-local cumsum of
    g_gamma * ln 2 repeated at every token; the forward of a fixed decay is the gated delta rule
    with g = g_gamma * ln 2 per token."""
    B, T, H, HV, K, V = 1, 70, 2, 4, 16, 16
    q, k, v, _, beta, h0 = la_inputs(B, T, H, HV, K, V, torch.float32, 23, n_states=2)
    gamma = -torch.rand(HV) * 0.3
    g_nat = (gamma * math.log(2)).expand(B, T, HV).contiguous()
    gc_nat = gdn.chunk_local_cumsum(g_nat, 64, cu_seqlens=CU)
    gc = chunk_local_cumsum(gamma.expand(B, T, HV).contiguous(), 64, cu_seqlens=CU)  # log2 units
    w, u, _ = chunk_gated_delta_rule_fwd_intra(k, v, gc, beta, cu_seqlens=CU)
    h, v_new, ht = chunk_gated_delta_rule_fwd_h(k, w, u, gc, initial_state=h0, output_final_state=True,
                                                cu_seqlens=CU)
    o = chunk_fwd_o(q, k, v_new, h, g_gamma=gamma, scale=0.25, cu_seqlens=CU)
    assert bitwise(o, gdn.chunk_fwd_o(q, k, v_new, h, gc_nat, scale=0.25, cu_seqlens=CU))
    o64, _ = fusedops.reference.chunk_gated_delta_rule(q, k, v, g_nat, beta, 0.25, h0, True, cu_seqlens=CU)
    ob, _ = delta_rule_chunked(q, k, v, g_nat, beta, 0.25, h0, CU)
    check_against_reference("g_gamma fwd", (o,), (ob,), (o64,), torch.float32)
    do = torch.randn_like(v)
    assert bitwise(chunk_bwd_dv_local(q, k, do, g_gamma=gamma, scale=0.25, cu_seqlens=CU),
                   gdn.chunk_bwd_dv_local(q, k, do, gc_nat, scale=0.25, cu_seqlens=CU))
    dh = torch.randn_like(h)
    a = chunk_bwd_dqkwg(q, k, v_new, do, h, dh, g_gamma=gamma, scale=0.25, cu_seqlens=CU)
    b = gdn.chunk_bwd_dqkwg(q, k, v_new, do, h, dh, g=gc_nat, dv=torch.zeros_like(v), scale=0.25,
                            cu_seqlens=CU)
    assert a[2] is None and a[3] is None  # FLA: no dw without w, no dg for g_gamma
    assert bitwise(a[0], b[0]) and bitwise(a[1], b[1])
    with pytest.raises(NotImplementedError, match="g together with g_gamma"):
        chunk_fwd_o(q, k, v_new, h, gc, gamma)
    with pytest.raises(NotImplementedError, match="precomputed attention matrix A"):
        chunk_bwd_dv_local(q, k, do, A=torch.zeros(B, T, HV, 64))


def test_sub_operator_positional_orders():
    """solve_tril's 3rd/4th positions (chunk_indices, output_dtype) and chunk_local_cumsum's 6th
    (output_dtype) are FLA's; the gate functions map to fusedops' with FLA's output dtypes."""
    B, T, HV = 1, 70, 4
    _, k, v, g, beta, _ = la_inputs(B, T, 2, HV, 16, 16, torch.float32, 24)
    ci = prepare_chunk_indices(CU, 64)
    assert torch.equal(ci, gdn.prepare_chunk_indices(CU, 64)) and ci.dtype == CU.dtype
    g2 = g * RCP_LN2  # FLA's units; the compat layer hands fusedops g2 * ln 2
    A = chunk_scaled_dot_kkt_fwd(k, g2, beta, CU, 64, torch.float32, ci)
    assert bitwise(A, gdn.chunk_scaled_dot_kkt_fwd(k, g2 * math.log(2), beta, CU, 64))
    Ai = solve_tril(A, CU, ci, torch.bfloat16)
    assert Ai.dtype == torch.bfloat16 and bitwise(Ai, gdn.solve_tril(A, CU, ci, torch.bfloat16))
    assert solve_tril(A, CU, None, None).dtype == torch.float32
    c = chunk_local_cumsum(g, 64, False, 2.0, CU, torch.float64, ci)
    assert c.dtype == torch.float64 and bitwise(c, gdn.chunk_local_cumsum(g, 64, scale=2.0, cu_seqlens=CU,
                                                                          output_dtype=torch.float64))
    with pytest.raises(DeprecationWarning, match="head_first"):
        chunk_local_cumsum(g, 64, head_first=False)
    A_log, dt_bias, a = torch.randn(HV), torch.randn(HV), torch.randn(B, T, HV)
    assert bitwise(fused_gdn_gate(a, A_log, dt_bias), gdn.fused_gdn_gate(a, A_log, dt_bias))
    assert gdn_gate_fwd(a, A_log, dt_bias, torch.bfloat16).dtype == torch.bfloat16
    dg, dA, db = gdn_gate_bwd(a, A_log, dt_bias, torch.ones(B, T, HV))
    assert [t.dtype for t in (dg, dA, db)] == [torch.float32] * 3 and dA.shape == (HV,)
    cs = gdn_gate_chunk_cumsum(a, A_log, 64, scale=RCP_LN2, dt_bias=dt_bias, cu_seqlens=CU)
    assert bitwise(cs, gdn.chunk_local_cumsum(gdn.gdn_gate_fwd(a, A_log, dt_bias), 64, scale=RCP_LN2,
                                              cu_seqlens=CU))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w, u, Ai = chunk_gated_delta_rule_fwd_intra(k, v, g2, beta, CU, 64, ci)
    assert Ai.dtype == k.dtype and bitwise(Ai, gdn.solve_tril(A, CU, output_dtype=k.dtype))
    w2, u2 = recompute_w_u_fwd(k, v, beta, Ai, g2, CU, ci)
    assert bitwise(w, w2) and bitwise(u, u2)
