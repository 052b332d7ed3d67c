"""fusedops.compat.fla's KDA: chunk_kda and fused_recurrent_kda called as FLA 0.6.0's tests and
KimiDeltaAttention layer call them, and FLA's chunk_kda_bwd rebuilt from the mirrored
sub-operators exactly as fla/ops/kda/chunk_fwd.py and chunk_bwd.py compose them (gates in log2
units). Compared with the native fusedops call (bitwise) and the float64 reference."""

from __future__ import annotations

import math

import fusedops
import pytest
import torch
import torch.nn.functional as F
from fusedops.compat.fla.ops.common.chunk_delta_h import (
    chunk_gated_delta_rule_bwd_dhu,
    chunk_gated_delta_rule_fwd_h,
)
from fusedops.compat.fla.ops.kda import chunk_kda, fused_recurrent_kda
from fusedops.compat.fla.ops.kda.chunk_bwd import chunk_kda_bwd_dAv, chunk_kda_bwd_wy_dqkg_fused
from fusedops.compat.fla.ops.kda.chunk_intra import chunk_kda_bwd_intra, chunk_kda_fwd_intra
from fusedops.compat.fla.ops.kda.gate import fused_kda_gate, kda_gate_bwd, kda_gate_chunk_cumsum, kda_gate_fwd
from fusedops.compat.fla.ops.kda.wy_fast import recompute_w_u_fwd
from fusedops.compat.fla.ops.utils import chunk_local_cumsum
from fusedops.ops import kda as nkda

from tests.common.tolerance import assert_close
from tests.python.compat.compat_common import (
    bitwise,
    check_against_reference,
    delta_rule_chunked,
    la_inputs,
    leaves,
)

RCP_LN2 = 1 / math.log(2)  # FLA's constant is its float32 rounding
CU = torch.tensor([0, 29, 70], dtype=torch.int32)


def _grads(outs, wrt, gouts):
    return list(torch.autograd.grad([o for o in outs], wrt, gouts, allow_unused=True))


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_chunk_kda_keyword_form_matches_native_and_float64(varlen):
    B, T = (1, 70) if varlen else (2, 70)
    cu = CU if varlen else None
    q, k, v, g, beta, h0 = la_inputs(B, T, 2, 4, 16, 16, torch.float32, 31, kda=True, n_states=2)
    do, dht = torch.randn(B, T, 4, 16), torch.randn(2, 4, 16, 16)
    ins = leaves(q, k, v, g, beta, h0)
    o, ht = chunk_kda(q=ins[0], k=ins[1], v=ins[2], g=ins[3], beta=ins[4], scale=0.25,
                      initial_state=ins[5], output_final_state=True, cu_seqlens=cu)
    got = [o, ht] + _grads((o, ht), ins, (do, dht))
    nat = leaves(q, k, v, g, beta, h0)
    on, hn = fusedops.chunk_kda(*nat[:5], 0.25, nat[5], True, cu_seqlens=cu)
    for a, b in zip(got, [on, hn] + _grads((on, hn), nat, (do, dht))):
        assert bitwise(a, b)
    r = leaves(q, k, v, g, beta, h0)
    o64, h64 = fusedops.reference.chunk_kda(*r[:5], 0.25, r[5], True, cu_seqlens=cu)
    b_ = leaves(q, k, v, g, beta, h0)
    ob, hb = delta_rule_chunked(*b_[:5], 0.25, b_[5], cu)
    check_against_reference("fla chunk_kda", got, [ob, hb] + _grads((ob, hb), b_, (do, dht)),
                            [o64, h64] + _grads((o64, h64), r, (do, dht)), torch.float32)


def test_chunk_kda_positional_order_is_flas():
    """FLA's 10th-14th positions: use_gate_in_kernel, use_beta_sigmoid_in_kernel,
    allow_neg_eigval, safe_gate, lower_bound (fusedops' native 11th is A_log)."""
    q, k, v, a, b, h0 = la_inputs(1, 70, 2, 2, 16, 16, torch.float32, 32, kda=True)
    A_log, dt_bias = torch.randn(2) * 0.3, torch.randn(2 * 16)
    o, ht = chunk_kda(q, k, v, a, b, None, h0, True, True, True, True, True, True, -5.0, False, False,
                      False, None, None, None, False, None, A_log=A_log, dt_bias=dt_bias)
    on, hn = nkda.chunk_kda(q, k, v, a, b, initial_state=h0, output_final_state=True,
                            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log,
                            dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, safe_gate=True,
                            lower_bound=-5.0, allow_neg_eigval=True)
    assert bitwise(o, on) and bitwise(ht, hn)


def test_kimi_layer_forms_chunk_and_fused_recurrent():
    """FLA's KimiDeltaAttention layer calls: raw gate with A_log [HV] / dt_bias [HV*K], beta
    logits, v-first states, packed sequences; the decoding form agrees with the chunk form."""
    q, k, v, a, b, h0 = la_inputs(1, 70, 2, 4, 16, 16, torch.float32, 33, kda=True, n_states=2)
    A_log, dt_bias = torch.randn(4) * 0.3, torch.randn(4 * 16)
    hv = h0.transpose(-1, -2).contiguous()
    kw = dict(A_log=A_log, dt_bias=dt_bias, initial_state=hv, output_final_state=True,
              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              allow_neg_eigval=False, lower_bound=None, state_v_first=True, cu_seqlens=CU)
    o, ht = chunk_kda(q=q, k=k, v=v, g=a, beta=b, safe_gate=False, **kw)
    on, hn = nkda.chunk_kda(q, k, v, a, b, initial_state=h0, output_final_state=True,
                            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log,
                            dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, cu_seqlens=CU)
    assert bitwise(o, on) and bitwise(ht, hn.transpose(-1, -2).contiguous()) and ht.is_contiguous()
    orr, htr = fused_recurrent_kda(q=q, k=k, v=v, g=a, beta=b, **kw)
    torch.testing.assert_close(orr, o, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(htr, ht, rtol=1e-4, atol=1e-5)
    # allow_neg_eigval: beta = 2 sigmoid(b) in both forms
    kw["allow_neg_eigval"] = True
    o2, ht2 = fused_recurrent_kda(q=q, k=k, v=v, g=a, beta=b, **kw)
    o3, ht3 = chunk_kda(q=q, k=k, v=v, g=a, beta=b, **kw)
    torch.testing.assert_close(o2, o3, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ht2, ht3, rtol=1e-4, atol=1e-5)


def test_fused_recurrent_kda_positional_order_is_flas():
    """A_log and dt_bias are FLA's 6th and 7th positions."""
    q, k, v, a, b, h0 = la_inputs(2, 9, 2, 2, 16, 16, torch.float32, 34, kda=True)
    A_log, dt_bias = torch.randn(2) * 0.3, torch.randn(2 * 16)
    o, ht = fused_recurrent_kda(q, k, v, a, b.sigmoid(), A_log, dt_bias, None, h0, True, False, True)
    on, hn = nkda.fused_recurrent_kda(q, k, v, a, b.sigmoid(), initial_state=h0, output_final_state=True,
                                      use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    assert bitwise(o, on) and bitwise(ht, hn)


def test_chunk_kda_errors_and_ignored_arguments():
    q, k, v, g, beta, h0 = la_inputs(1, 8, 2, 2, 16, 16, torch.float32, 35, kda=True)
    with pytest.raises(NotImplementedError, match="cp_context"):
        chunk_kda(q, k, v, g, beta, cp_context=object())
    with pytest.raises(NotImplementedError, match="return_intermediate_states"):
        chunk_kda(q, k, v, g, beta, return_intermediate_states=True)
    o, _ = chunk_kda(q, k, v, g, beta, disable_recompute=True, use_graph=True, max_num_seqs=4,
                     chunk_indices=None)
    assert bitwise(o, nkda.chunk_kda(q, k, v, g, beta)[0])
    with pytest.raises(ValueError, match="chunk_size must be 32 or 64"):
        chunk_kda(q, k, v, g, beta, chunk_size=16)


def _fla_chunk_kda(q, k, v, g, beta, scale, h0, do, dht, cu, state_v_first):
    """fla/ops/kda/chunk_fwd.py's chunk_kda_fwd (to the final state) and chunk_bwd.py's
    chunk_kda_bwd on the mirrored sub-operators, FLA's keyword calls (gates in log2 units, kept
    in g's dtype)."""
    common = dict(cu_seqlens=cu, chunk_size=64)
    gc = chunk_local_cumsum(g=g, scale=RCP_LN2, output_dtype=None, **common)
    w, u, qg, kg, Aqk, Akk = chunk_kda_fwd_intra(q=q, k=k, v=v, gk=gc, beta=beta, scale=scale, **common)
    assert qg is None  # FLA: only with disable_recompute
    _, _, ht = chunk_gated_delta_rule_fwd_h(k=kg, w=w, u=u, gk=gc, initial_state=h0, output_final_state=True,
                                            state_v_first=state_v_first, **common)
    w, u, qg, kg = recompute_w_u_fwd(q=q, k=k, v=v, beta=beta, A=Akk, gk=gc, cu_seqlens=cu)
    h, v_new, _ = chunk_gated_delta_rule_fwd_h(k=kg, w=w, u=u, gk=gc, initial_state=h0, output_final_state=False,
                                               state_v_first=state_v_first, **common)
    dAqk, dv = chunk_kda_bwd_dAv(q=q, k=k, v=v_new, do=do, A=Aqk, scale=scale, **common)
    dh, dh0, dv = chunk_gated_delta_rule_bwd_dhu(q=qg, k=kg, w=w, gk=gc, h0=h0, dht=dht, do=do, dv=dv,
                                                 scale=scale, state_v_first=state_v_first, **common)
    dq, dk, dv, db, dg, dAkk = chunk_kda_bwd_wy_dqkg_fused(q=q, k=k, v=v, v_new=v_new, g=gc, beta=beta,
                                                           A=Akk, h=h, do=do, dh=dh, dv=dv, scale=scale,
                                                           state_v_first=state_v_first, **common)
    dq, dk, db, dg = chunk_kda_bwd_intra(q=q, k=k, g=gc, beta=beta, dAqk=dAqk, dAkk=dAkk, dq=dq, dk=dk,
                                         db=db, dg=dg, **common)
    dg = chunk_local_cumsum(dg, reverse=True, output_dtype=None, **common)
    H, HV = q.shape[2], v.shape[2]
    if HV > H:  # FLA's chunk_kda_bwd: dq, dk come per value head and are summed over each group
        dq = dq.view(*dq.shape[:2], H, HV // H, dq.shape[-1]).sum(dim=3)
        dk = dk.view(*dk.shape[:2], H, HV // H, dk.shape[-1]).sum(dim=3)
    return ht, dq, dk, dv, dg, db, dh0


@pytest.mark.parametrize("varlen,state_v_first,H", [(False, False, 2), (True, True, 2), (True, False, 1)])
def test_flas_chunk_kda_pipeline_on_the_mirrored_sub_operators(varlen, state_v_first, H):
    """The final state and every gradient of FLA's composition of the sub-operators are KDA's,
    in float64 on the reference backend (the states are float32 by the sub-operators'
    contracts, as in FLA)."""
    B, T = (1, 70) if varlen else (2, 70)
    cu = CU if varlen else None
    q, k, v, g, beta, h0 = la_inputs(B, T, H, 2, 16, 16, torch.float64, 36, kda=True, n_states=2)
    do, dht = torch.randn(B, T, 2, 16, dtype=torch.float64), torch.randn(2, 2, 16, 16)
    tr = (lambda t: t.transpose(-1, -2).contiguous()) if state_v_first else (lambda t: t)
    with fusedops.use_backend("ref"):
        ht, *grads = _fla_chunk_kda(q, k, v, g, beta, 0.25, tr(h0), do, tr(dht), cu, state_v_first)
    ours = [tr(ht)] + grads[:-1] + [tr(grads[-1])]
    r = leaves(q, k, v, g, beta, h0)
    o64, h64 = fusedops.reference.chunk_kda(*r[:5], 0.25, r[5], True, cu_seqlens=cu)
    ref = [h64] + _grads((o64, h64), r, (do, dht))
    b_ = leaves(q, k, v, g, beta, h0.double())
    ob, hb = delta_rule_chunked(*b_[:5], 0.25, b_[5], cu)
    base = [hb] + _grads((ob, hb), b_, (do, dht.double()))
    for name, a, b, rr in zip(("final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"), ours, base, ref):
        fp32 = name in ("final_state", "dh0")
        assert_close(a, b, rr, torch.float32 if fp32 else torch.float64, f"fla kda pipeline {name}")


def test_fwd_intra_returns_flas_six_tensors():
    q, k, v, g, beta, _ = la_inputs(1, 70, 2, 2, 16, 16, torch.float32, 37, kda=True)
    gc = chunk_local_cumsum(g, 64, scale=RCP_LN2, cu_seqlens=CU)
    out = chunk_kda_fwd_intra(q, k, v, gc, beta, None, CU, 64, None, False, -5.0, True)
    assert len(out) == 6
    w, u, qg, kg, Aqk, Akk = out
    gn = gc * math.log(2)
    Aqk2, Akk2 = nkda.chunk_kda_intra_A(q, k, gn, beta, cu_seqlens=CU)
    assert bitwise(Aqk, Aqk2) and bitwise(Akk, Akk2) and Aqk.dtype == k.dtype
    for a, b in zip((w, u, qg, kg), nkda.kda_recompute_w_u_fwd(k, v, beta, Akk2, gn, q=q, cu_seqlens=CU)):
        assert bitwise(a, b)
    with pytest.raises(ValueError, match="chunk_size (must be )?32 or 64"):
        chunk_kda_fwd_intra(q, k, v, gc, beta, chunk_size=16)


def test_backward_sub_operators_keep_dq_dk_per_value_head_with_gva():
    """FLA allocates dq, dk at the HV dimension (the caller sums each group): so do they."""
    q, k, v, g, beta, _ = la_inputs(1, 8, 1, 2, 16, 16, torch.float32, 38, kda=True)
    z = torch.zeros(1, 8, 2, 64)
    h = torch.zeros(1, 1, 2, 16, 16)
    dq, dk, *_ = chunk_kda_bwd_wy_dqkg_fused(q, k, v, v, g, beta, z, h, v, h, v)
    assert dq.shape == dk.shape == (1, 8, 2, 16)
    dq, dk, db, dg = chunk_kda_bwd_intra(q, k, g, beta, z, z, dq, dk, torch.zeros(1, 8, 2), torch.zeros_like(g))
    assert dq.shape == dk.shape == (1, 8, 2, 16)
    with pytest.raises(ValueError, match=r"dq must be per value head, \[B,T,HV,K\]=\[1, 8, 2, 16\]"):
        chunk_kda_bwd_intra(q, k, g, beta, z, z, torch.zeros(1, 8, 1, 16), torch.zeros(1, 8, 1, 16),
                            torch.zeros(1, 8, 2), torch.zeros_like(g))


def test_gate_call_forms():
    g = torch.randn(2, 5, 3, 8)
    A_log, dt_bias = torch.randn(3) * 0.3, torch.randn(24)
    y = fused_kda_gate(g, A_log, dt_bias)
    assert bitwise(y, nkda.fused_kda_gate(g, A_log, dt_bias))
    assert bitwise(fused_kda_gate(g[0], A_log, dt_bias), y[0])  # [..., H, K] of any rank
    assert kda_gate_fwd(g, A_log, dt_bias, None, torch.bfloat16).dtype == torch.bfloat16
    assert bitwise(kda_gate_fwd(g, None, dt_bias, -5.0), nkda.kda_gate_fwd(g, None, dt_bias, -5.0))
    dg, dA, db = kda_gate_bwd(g, A_log, dt_bias, torch.ones_like(g))
    ng = nkda.kda_gate_bwd(g, A_log, dt_bias, torch.ones_like(g))
    assert all(bitwise(a, b) for a, b in zip((dg, dA, db), ng))
    cs = kda_gate_chunk_cumsum(g, A_log, 64, scale=RCP_LN2, dt_bias=dt_bias)
    assert bitwise(cs, fusedops.gated_delta_rule.chunk_local_cumsum(nkda.kda_gate_fwd(g, A_log, dt_bias), 64,
                                                                    scale=RCP_LN2))
    x = F.logsigmoid(torch.randn(1, 4, 3, 8))
    assert bitwise(kda_gate_chunk_cumsum(x, None, 64, lower_bound=-3.0),
                   fusedops.gated_delta_rule.chunk_local_cumsum(nkda.kda_gate_fwd(x, None, None, -3.0), 64))
