"""The native GDN / KDA functions called in flash-linear-attention 0.6.0's forms (positional
order from FLA's source: fla/ops/gated_delta_rule/{chunk,fused_recurrent}.py,
fla/ops/kda/{chunk,fused_recurrent}.py, fla/ops/common/{chunk_delta_h,chunk_o}.py; the signatures
themselves are pinned in tests/python/compat/test_compat_signatures.py), against the float64
per-token recurrence (tests/common/linear_attention.py) by the precision policy, and the options
the native functions gained with those signatures (state_v_first and g_gamma on the
sub-operators, the in-kernel beta sigmoid of the recurrent forms, chunk_indices checks)."""

from __future__ import annotations

import fusedops
import pytest
import torch
import torch.nn.functional as F
from fusedops.ops import gated_delta_rule as gdn
from fusedops.ops import kda

from tests.common.linear_attention import check, recurrence
from tests.python.compat.compat_common import bitwise, delta_rule_chunked, la_inputs

CU = torch.tensor([0, 29, 29, 70], dtype=torch.int64)
B, T, H, HV, K, V = 1, 70, 2, 4, 16, 8


def _grads(o, ht, leaves, do, dht):
    return torch.autograd.grad([o, ht], leaves, [do, dht], allow_unused=True)


def _against_recurrence(tag, run, inputs, make_beta, make_g=lambda g: g, transpose_state=False,
                        composite_fn=recurrence):
    """run(*leaves) -> (o, ht) in fp32 against the recurrence on make_beta(beta), make_g(g)
    (differentiable torch maps) in float64 (oracle), with ``composite_fn`` (the same algorithm
    as ours: the recurrence, or the chunked form for the chunk op) in fp32 as the tolerance base:
    o, final state and the gradient of every input."""
    q, k, v, g, beta, h0 = inputs
    gen = torch.Generator().manual_seed(99)
    do = torch.randn(B, T, HV, V, generator=gen)
    dht = torch.randn(3, HV, K, V, generator=gen)
    x = [t.detach().clone().requires_grad_() for t in inputs]
    h0_in = x[5].transpose(-1, -2) if transpose_state else x[5]
    o, ht = run(*x[:5], h0_in)
    ht = ht.transpose(-1, -2) if transpose_state else ht
    ours = (o, ht, *_grads(o, ht, x, do, dht))

    def composite(dt, fn):
        y = [t.detach().to(dt).requires_grad_() for t in inputs]
        ob, hb = fn(y[0], y[1], y[2], make_g(y[3]), make_beta(y[4]), K ** -0.5, y[5], CU)
        return (ob, hb, *_grads(ob, hb, y, do.to(dt), dht.to(dt)))

    base, ref = composite(torch.float32, composite_fn), composite(torch.float64, recurrence)
    for name, a, b, r in zip(("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"), ours, base, ref):
        check(f"{tag} {name}", a, b, r, torch.float32)


def test_chunk_gated_delta_rule_in_flas_positional_form():
    """All sixteen of FLA's positionals: beta logits (use_beta_sigmoid_in_kernel,
    allow_neg_eigval: 2 sigmoid), [V,K] states (state_v_first), cu_seqlens, its host copy and
    FLA's chunk_indices, cp_context None."""
    inputs = la_inputs(B, T, H, HV, K, V, torch.float32, 41, n_states=3)
    ci = gdn.prepare_chunk_indices(CU, 64)

    def run(q, k, v, g, logits, h0):
        return fusedops.chunk_gated_delta_rule(q, k, v, g, logits, None, h0, True, False, True, True, True,
                                               CU, CU.clone(), ci, None)

    _against_recurrence("chunk_gdn FLA form", run, inputs, lambda b: 2 * torch.sigmoid(b), transpose_state=True,
                        composite_fn=delta_rule_chunked)


def test_fused_recurrent_gated_delta_rule_in_flas_positional_form():
    """beta is FLA's 7th positional (after gk, gv); the in-kernel sigmoid (times 2) of the logits
    is FLA's math (fla/ops/gated_delta_rule/fused_recurrent.py: sigmoid, then * 2), applied before
    the recurrence and differentiable."""
    inputs = la_inputs(B, T, H, HV, K, V, torch.float32, 42, n_states=3)

    def run(q, k, v, g, logits, h0):
        return fusedops.fused_recurrent_gated_delta_rule(q, k, v, g, None, None, logits, None, h0, True, False,
                                                         False, None, None, True, True, True, CU)

    _against_recurrence("fused_recurrent_gdn FLA form", run, inputs, lambda b: 2 * torch.sigmoid(b),
                        transpose_state=True)


def test_fused_recurrent_gated_delta_rule_per_key_decay_gk():
    """gk [B,T,HV,K] (FLA's 5th positional): the per-key decay of the KDA recurrence."""
    q, k, v, _, beta, h0 = la_inputs(B, T, H, HV, K, V, torch.float32, 43, n_states=3)
    gk = la_inputs(B, T, H, HV, K, V, torch.float32, 44, kda=True)[3]

    def run(q, k, v, gk, beta, h0):
        return fusedops.fused_recurrent_gated_delta_rule(q, k, v, None, gk, None, beta, None, h0, True,
                                                         cu_seqlens=CU)

    _against_recurrence("fused_recurrent_gdn gk", run, (q, k, v, gk, beta, h0), lambda b: b)
    o, ht = run(q, k, v, gk, beta, h0)
    on, hn = fusedops.fused_recurrent_kda(q, k, v, gk, beta, initial_state=h0, output_final_state=True,
                                          cu_seqlens=CU)
    assert bitwise(o, on) and bitwise(ht, hn)
    with pytest.raises(NotImplementedError, match="gv .*per-value decay"):
        fusedops.fused_recurrent_gated_delta_rule(q, k, v, None, None, torch.zeros_like(v), beta)
    with pytest.raises(NotImplementedError, match="g together with gk"):
        fusedops.fused_recurrent_gated_delta_rule(q, k, v, gk[..., 0], gk, None, beta)
    with pytest.raises(ValueError, match="allow_neg_eigval requires use_beta_sigmoid_in_kernel"):
        fusedops.fused_recurrent_gated_delta_rule(q, k, v, beta=beta, allow_neg_eigval=True)


def test_fused_recurrent_kda_in_flas_positional_form():
    """A_log and dt_bias are FLA's 6th and 7th positionals; the raw gate in the kernel
    (-exp(A_log) softplus(g + dt_bias), dt_bias [HV*K]) and 2 sigmoid(beta) with allow_neg_eigval."""
    q, k, v, _, beta, h0 = la_inputs(B, T, H, HV, K, V, torch.float32, 45, n_states=3)
    gen = torch.Generator().manual_seed(46)
    a = torch.randn(B, T, HV, K, generator=gen)
    A_log, dt_bias = torch.randn(HV, generator=gen) * 0.3, torch.randn(HV * K, generator=gen)

    def gate(x):
        Al, db = A_log.to(x.dtype), dt_bias.to(x.dtype).reshape(HV, K)
        return -Al.exp()[:, None] * F.softplus(x + db)

    def run(q, k, v, a, logits, h0):
        return fusedops.fused_recurrent_kda(q, k, v, a, logits, A_log, dt_bias, None, h0, True, False, True,
                                            True, True, None, False, CU)

    _against_recurrence("fused_recurrent_kda FLA form", run, (q, k, v, a, beta, h0), lambda b: 2 * torch.sigmoid(b),
                        gate)


def test_sub_operators_state_v_first_is_the_transposed_layout():
    """chunk_gated_delta_rule_fwd_h / _bwd_dhu, chunk_fwd_o and chunk_bwd_dqkwg with
    state_v_first take and return [..., V, K] states: the transposes of the [K,V] call's,
    bitwise, and contiguous as FLA allocates them."""
    q, k, v, g, beta, h0 = la_inputs(B, T, H, HV, K, V, torch.float32, 47, n_states=3)
    gc = gdn.chunk_local_cumsum(g, 64, cu_seqlens=CU)
    A = gdn.solve_tril(gdn.chunk_scaled_dot_kkt_fwd(k, gc, beta, CU, 64), CU)
    w, u = gdn.recompute_w_u_fwd(k, v, beta, A, gc, CU)
    h, vn, ht = gdn.chunk_gated_delta_rule_fwd_h(k, w, u, gc, None, h0, True, 64, True, False, CU)
    tv = lambda t: t.transpose(-1, -2).contiguous()  # noqa: E731
    h2, vn2, ht2 = gdn.chunk_gated_delta_rule_fwd_h(k, w, u, gc, None, tv(h0), True, 64, True, True, CU)
    assert bitwise(h2, tv(h)) and bitwise(vn2, vn) and bitwise(ht2, tv(ht)) and h2.is_contiguous()
    o = gdn.chunk_fwd_o(q, k, vn, h, gc, None, None, False, CU, 64)
    assert bitwise(gdn.chunk_fwd_o(q, k, vn, h2, gc, None, None, True, CU, 64), o)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    dv = gdn.chunk_bwd_dv_local(q, k, do, gc, None, None, None, CU, 64)
    dh, dh0, dv2 = gdn.chunk_gated_delta_rule_bwd_dhu(q, k, w, do, dv, gc, None, h0, dht, None, False, CU, 64)
    dh_, dh0_, dv2_ = gdn.chunk_gated_delta_rule_bwd_dhu(q, k, w, do, dv, gc, None, tv(h0), tv(dht), None, True,
                                                         CU, 64)
    assert bitwise(dh_, tv(dh)) and bitwise(dh0_, tv(dh0)) and bitwise(dv2_, dv2)
    a = gdn.chunk_bwd_dqkwg(q, k, vn, do, h, dh, w, gc, None, dv2, None, False, CU, 64)
    b = gdn.chunk_bwd_dqkwg(q, k, vn, do, h2, dh_, w, gc, None, dv2, None, True, CU, 64)
    assert all(bitwise(x, y) for x, y in zip(a, b))


def test_sub_operators_g_gamma_is_a_fixed_per_step_decay():
    """g_gamma [HV] (natural-log units, as every native gate) equals a per-token gate g_gamma
    whose chunk-local cumsum is passed as g; no dg for it (FLA's)."""
    q, k, v, _, _, h0 = la_inputs(B, T, H, HV, K, V, torch.float32, 48, n_states=3)
    gamma = -torch.rand(HV) * 0.2
    gc = gdn.chunk_local_cumsum(gamma.expand(B, T, HV).contiguous(), 64, cu_seqlens=CU, output_dtype=None)
    h = torch.randn(1, 2, HV, K, V)  # the 2 chunks of the sequences 29, 0, 41
    o = gdn.chunk_fwd_o(q, k, v, h, None, gamma, 0.3, False, CU, 64)
    assert bitwise(o, gdn.chunk_fwd_o(q, k, v, h, gc, None, 0.3, False, CU, 64))
    do = torch.randn_like(v)
    assert bitwise(gdn.chunk_bwd_dv_local(q, k, do, None, gamma, None, 0.3, CU, 64),
                   gdn.chunk_bwd_dv_local(q, k, do, gc, None, None, 0.3, CU, 64))
    dh = torch.randn_like(h)
    a = gdn.chunk_bwd_dqkwg(q, k, v, do, h, dh, None, None, gamma, None, 0.3, False, CU, 64)
    b = gdn.chunk_bwd_dqkwg(q, k, v, do, h, dh, None, gc, None, torch.zeros_like(v), 0.3, False, CU, 64)
    assert a[3] is None and bitwise(a[0], b[0]) and bitwise(a[1], b[1])
    with pytest.raises(ValueError, match=r"g_gamma must have shape \[HV\]=\[4\]"):
        gdn.chunk_fwd_o(q, k, v, h, None, gamma[:2], cu_seqlens=CU)
    with pytest.raises(NotImplementedError, match="g together with g_gamma"):
        gdn.chunk_fwd_o(q, k, v, h, gc, gamma, cu_seqlens=CU)
    with pytest.raises(NotImplementedError, match="precomputed attention matrix A"):
        gdn.chunk_bwd_dv_local(q, k, do, gc, None, torch.zeros(B, T, HV, 64), cu_seqlens=CU)


def test_chunk_indices_are_checked_against_cu_seqlens():
    q, k, v, g, beta, _ = la_inputs(B, T, H, HV, K, V, torch.float32, 49)
    ok = gdn.prepare_chunk_indices(CU, 64)
    o, _ = fusedops.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=CU, chunk_indices=ok)
    assert bitwise(o, fusedops.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=CU)[0])
    with pytest.raises(ValueError, match=r"chunk_indices must be the \[NT, 2\] = \[2, 2\] table .*chunk_size=64"):
        fusedops.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=CU, chunk_indices=gdn.prepare_chunk_indices(CU, 16))
    with pytest.raises(ValueError, match="pass it with cu_seqlens"):
        gdn.chunk_local_cumsum(g, 64, chunk_indices=ok)
    with pytest.raises(ValueError, match=r"chunk_offsets must be the \[N\+1\]"):
        gdn.chunk_gated_delta_rule_fwd_h(k, k.repeat_interleave(2, 2), v, g, cu_seqlens=CU,
                                         chunk_offsets=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        fusedops.chunk_gated_delta_rule(q, k, v, g, beta, not_an_option=1)


@pytest.mark.parametrize("fn", [gdn.fused_gdn_gate, gdn.gdn_gate_fwd])
def test_gdn_gate_output_dtype(fn):
    gen = torch.Generator().manual_seed(50)
    a, A_log, dt_bias = torch.randn(B, T, HV, generator=gen), torch.randn(HV, generator=gen), torch.randn(HV)
    y = fn(a, A_log, dt_bias)
    assert y.dtype == torch.float32
    assert bitwise(fn(a, A_log, dt_bias, torch.bfloat16), y.to(torch.bfloat16))
    assert fn(a.double(), A_log.double(), dt_bias.double(), None).dtype == torch.float64
    x = torch.randn(B, T, HV, K, generator=gen)
    assert kda.fused_kda_gate(x, A_log, None, None, torch.bfloat16).dtype == torch.bfloat16


def test_calls_in_the_former_positional_order_fail_clearly():
    """A call written for fusedops' order before FLA's (arguments after beta by position) raises a
    TypeError / ValueError naming the order instead of running with arguments in other roles."""
    q, k, v, g, beta, h0 = la_inputs(B, T, H, HV, K, V, torch.float32, 51, n_states=3)
    gk = la_inputs(B, T, H, HV, K, V, torch.float32, 52, kda=True)[3]
    order = "positional order"
    with pytest.raises(TypeError, match=f"use_beta_sigmoid_in_kernel must be a bool, got Tensor .*{order}"):
        fusedops.chunk_gated_delta_rule(q, k, v, g, beta, None, h0, True, False, CU)  # was: 10th cu_seqlens
    with pytest.raises(ValueError, match="gk .*must have shape \\[B,T,HV,K\\].*beta is the 7th positional"):
        fusedops.fused_recurrent_gated_delta_rule(q, k, v, g, beta)  # was: 5th beta
    with pytest.raises(TypeError, match=f"A_log must be a tensor or None, got float .*{order}"):
        fusedops.fused_recurrent_kda(q, k, v, gk, beta, 0.7, h0, True)  # was: 6th scale
    with pytest.raises(TypeError, match=f"use_beta_sigmoid_in_kernel must be a bool, got Tensor .*{order}"):
        fusedops.chunk_kda(q, k, v, gk, beta, None, None, False, False, True, torch.zeros(HV))  # was: 11th A_log
    with pytest.raises(TypeError, match=f"output_dtype must be a torch.dtype or None, got bool .*{order}"):
        gdn.chunk_local_cumsum(g, 64, False, None, None, False)  # was: 6th head_first
    with pytest.raises(TypeError, match=f"chunk_indices must be a tensor or None, got dtype .*{order}"):
        gdn.solve_tril(torch.zeros(1, T, HV, 64), CU, torch.bfloat16)  # was: 3rd output_dtype
    with pytest.raises(TypeError, match=f"g_gamma must be a tensor or None, got float .*{order}"):
        gdn.chunk_fwd_o(q, k, v, torch.zeros(1, 2, HV, K, V), g, 0.3, CU)  # was: 6th scale
    with pytest.raises(TypeError, match=f"state_v_first must be a bool, got Tensor .*{order}"):
        gdn.chunk_gated_delta_rule_fwd_h(k, k, v, g, None, None, False, 64, True, CU)  # was: 10th cu_seqlens
    with pytest.raises(TypeError, match=f"scale must be a number or None, got bool .*{order}"):
        fusedops.fused_recurrent_kda(q, k, v, gk, beta, None, None, True)
