"""Context-parallel chunk_gated_delta_rule and chunk_kda (docs/distributed.md).

Per layer and rank, with the plan's incoming / outgoing segments:
  forward:  la_cp_fwd_summary of the outgoing segment -> one all-gather of the [HV*K*(K+V)]
            summaries -> la_cp_fold_fwd: the incoming sequence's initial state -> the operator's
            ordinary local forward over the rank's sequences with those initial states.
  backward: la_cp_bwd_summary of the incoming segment (L) -> one all-gather of the [HV*K*V] L ->
            la_cp_fold_bwd: the gradient at the outgoing segment's end -> the ordinary local
            backward with it.
Everything the fold needs is in the plan: no value is read back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from ..ops import _linear_attention as _la
from ..ops import gated_delta_rule as _gdn
from ..ops import kda as _kda
from ._comm import all_gather_rows
from ._plan import ContextParallel

_OP_FOLD = "la_cp_fold"


@dataclass(frozen=True)
class _Opts:
    kda: bool
    scale: float
    output_final_state: bool
    l2: bool
    gate: bool
    sig: bool
    neg: bool
    chunk_size: int
    keep: bool = False  # GDN: keep W, U, h, Vnew for the backward
    safe_gate: bool = False  # KDA's gate options
    has_lb: bool = False
    lb: float = 0.0


def _acc(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _workspace(n: int, like: Tensor) -> Optional[Tensor]:
    return _la.workspace(n, like.device) if n else None


def _fwd_summary(o: _Opts, plan: ContextParallel, k, v, g, beta, A_log, dt_bias, summary: Tensor) -> None:
    """The outgoing segment's (M, S_loc) into summary (M = I, S_loc = 0 without one)."""
    s = plan.outgoing_start
    # The operator's own argument forms: the row-wise steps (l2norm, gate, sigmoid) take rows
    # that flatten with one stride (a slice of a fused projection may need a copy).
    k, g, beta = k[:, s:], g[:, s:], beta[:, s:]
    k = rows_view(k) if o.l2 else _la.last_unit(k)
    g = rows_view(g) if o.gate and not o.kda else _la.last_unit(g)
    beta = rows_view(beta) if o.sig else _la.last_unit(beta)
    t = [k, _la.last_unit(v[:, s:]), g, beta, A_log if o.gate else None, dt_bias if o.gate else None, summary,
         None]
    t[-1] = _workspace(_C.la_cp_fwd_summary_workspace_size(t, o.chunk_size, o.l2, o.gate, o.sig), k)
    _C.la_cp_fwd_summary(context("la_cp_fwd_summary", k), t, chunk_size=o.chunk_size,
                         use_qk_l2norm_in_kernel=o.l2, use_gate_in_kernel=o.gate,
                         use_beta_sigmoid_in_kernel=o.sig, allow_neg_eigval=o.neg, safe_gate=o.safe_gate,
                         has_lower_bound=o.has_lb, lower_bound=o.lb)


def _bwd_summary(o: _Opts, q, k, v, beta, gc, A, Aqk, w, do, dht, out: Tensor) -> None:
    """L of the incoming segment (the tensors given are already cut to it) into out [1,HV,K,V]."""
    t = [q, k, v, beta, gc, A, Aqk, w, do, dht, out, None]
    t[-1] = _workspace(_C.la_cp_bwd_summary_workspace_size(t, o.chunk_size), q)
    _C.la_cp_bwd_summary(context("la_cp_bwd_summary", q), t, scale=o.scale, chunk_size=o.chunk_size)


class _LinearAttentionCP(torch.autograd.Function):
    """chunk_gated_delta_rule / chunk_kda over a context-parallel plan: the local operator with
    the initial states and end-state gradients that the other ranks' summaries give."""

    @staticmethod
    def forward(ctx, o: _Opts, plan: ContextParallel, q, k, v, g, beta, h0, A_log, dt_bias):
        HV, K, V = v.shape[2], q.shape[3], v.shape[3]
        T, acc, dev = q.shape[1], _acc(q), q.device
        # 1-2: the outgoing segment's summary, gathered from every rank.
        summary = torch.empty(HV * K * (K + V), dtype=acc, device=dev)
        _fwd_summary(o, plan, k, v, g, beta, A_log, dt_bias, summary)
        gathered = all_gather_rows(summary, plan.group)
        # 3: the initial states of the local sequences: the fold for the incoming one, the
        # caller's for those that start here.
        h0_loc = None
        if T and (plan.incoming is not None or (h0 is not None and plan.start_rows.numel())):
            h0_loc = plan.local_states(h0, "start", (HV, K, V), acc, dev)
            if plan.incoming is not None:
                start = h0[plan.incoming].contiguous() if h0 is not None else None
                _C.la_cp_fold_fwd(context(_OP_FOLD, gathered), gathered, start, plan.fold_lo, plan.rank, h0_loc[0])
        # 4: the local forward.
        want_ht = o.output_final_state and bool(plan.end_rows.numel())
        if T:
            out = _local_fwd(o, q, k, v, g, beta, h0_loc, want_ht, A_log, dt_bias, plan)
            saved = out[2:]
            o_loc, ht_loc = out[0], out[1]
        else:
            saved = ()
            o_loc, ht_loc = v.new_empty(1, 0, HV, V), None
        ht = q.new_empty(0, dtype=acc)
        if o.output_final_state:
            ht = plan.global_states(ht_loc, "end", (HV, K, V), acc, dev, empty_from=h0)
        # The M of the ranks after this one, for the backward fold.
        later = gathered[plan.rank + 1: plan.fold_hi].clone() if plan.outgoing is not None else None
        ctx.o, ctx.plan = o, plan
        ctx.has_h0 = h0 is not None
        ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, h0_loc, later, *saved)
        ctx.set_materialize_grads(False)
        return o_loc, ht

    @staticmethod
    def backward(ctx, do, dht):
        o, plan = ctx.o, ctx.plan
        q, k, v, g, beta, A_log, dt_bias, h0_loc, later, *saved = ctx.saved_tensors
        HV, K, V = v.shape[2], q.shape[3], v.shape[3]
        T, acc, dev = q.shape[1], _acc(q), q.device
        if do is None:
            do = torch.zeros(v.shape, dtype=v.dtype, device=dev)
        if dht is not None and dht.numel() == 0:
            dht = None
        # 1-2: L of the incoming segment, gathered from every rank.
        L = torch.zeros(1, HV, K, V, dtype=acc, device=dev)
        if plan.incoming is not None:
            ends_here = plan.incoming != plan.outgoing
            dht_in = dht[plan.incoming: plan.incoming + 1].to(acc).contiguous() if dht is not None and ends_here \
                else None
            _local_bwd_summary(o, q, k, v, beta, saved, do, dht_in, plan.incoming_end, L)
        gathered = all_gather_rows(L, plan.group)
        # 3: the gradients at the local sequences' ends: the fold for the outgoing one, the
        # caller's for those that end here.
        dht_loc = None
        if T and (plan.outgoing is not None or (dht is not None and plan.end_rows.numel())):
            dht_loc = plan.local_states(dht, "end", (HV, K, V), acc, dev)
            if plan.outgoing is not None:
                _C.la_cp_fold_bwd(context(_OP_FOLD, gathered), later, gathered[plan.rank + 1: plan.fold_hi], 0,
                                  later.shape[0], dht_loc[-1])
        # 4: the local backward.
        if T:
            dq, dk, dv, dg, dbeta, dh0_loc, dA, ddb = _local_bwd(o, q, k, v, g, beta, h0_loc, A_log, dt_bias, saved,
                                                                do, dht_loc, plan)
        else:
            dq, dk, dv, dg, dbeta = (torch.zeros_like(t) for t in (q, k, v, g, beta))
            dh0_loc = None
            dA = torch.zeros_like(A_log) if o.gate and A_log is not None else None
            ddb = torch.zeros_like(dt_bias) if o.gate and dt_bias is not None else None
        dh0 = None
        if ctx.has_h0 and ctx.needs_input_grad[7]:
            dh0 = plan.global_states(dh0_loc, "start", (HV, K, V), acc, dev, empty_from=dht)
        return (None, None, dq, dk, dv, dg, dbeta, dh0, dA if o.gate and A_log is not None else None,
                ddb if o.gate and dt_bias is not None else None)


def _local_fwd(o: _Opts, q, k, v, g, beta, h0_loc, want_ht, A_log, dt_bias, plan):
    """The operator's forward over the local sequences: (o, ht, *saved for its backward)."""
    cu, cu_cpu = plan.cu_seqlens, plan.cu_seqlens_cpu
    A_log, dt_bias = (A_log, dt_bias) if o.gate else (None, None)
    args = (q, k, v, g, beta, o.scale, h0_loc, want_ht, o.l2, o.gate, A_log, dt_bias, o.sig, o.neg, cu, cu_cpu,
            o.chunk_size)
    if o.kda:
        return _kda._chunk_fwd.impl(*args, o.safe_gate, o.has_lb, o.lb)
    return _gdn._chunk_fwd.impl(*args, o.keep)


def _local_bwd(o: _Opts, q, k, v, g, beta, h0_loc, A_log, dt_bias, saved, do, dht_loc, plan):
    cu, cu_cpu = plan.cu_seqlens, plan.cu_seqlens_cpu
    A_log, dt_bias = (A_log, dt_bias) if o.gate else (None, None)
    # saved: the forward op's outputs after (o, ht): q_normed, k_normed, q_rstd, k_rstd, g_cumsum,
    # beta_sigmoid, then the family's (KDA: Aqk, Akk; GDN: A, w, u, h, v_new).
    args = (q, k, v, g, beta, h0_loc, A_log, dt_bias, *saved[:6], cu, cu_cpu, do, dht_loc, o.scale, o.chunk_size,
            o.l2, o.gate, o.sig, o.neg)
    if o.kda:
        return _kda._chunk_fwd.bwd.impl(*args, *saved[6:8], o.safe_gate, o.has_lb, o.lb)
    return _gdn._chunk_fwd.bwd.impl(*args, saved[6], *(saved[7:11] if o.keep else (None,) * 4))


def _local_bwd_summary(o: _Opts, q, k, v, beta, saved, do, dht_in, end: int, out: Tensor) -> None:
    """L of the incoming segment (local tokens [0, end)) from the forward's saved tensors."""
    qn, kn = saved[0], saved[1]
    qs, ks = (qn, kn) if o.l2 else (q, k)
    gc, bs = saved[4], saved[5]
    if o.kda:
        Aqk, Akk = saved[6], saved[7]
        A, w = Akk, None
    else:
        A, Aqk = saved[6], None
        w = saved[7] if o.keep else None
    bb = bs if o.sig else beta
    cut = lambda t: None if t is None else _la.last_unit(t[:, :end])  # noqa: E731
    _bwd_summary(o, cut(qs), cut(ks), cut(v), cut(bb), cut(gc), cut(A), cut(Aqk), cut(w), cut(do), dht_in, out)


# ---------------------------------------------------------------------------------------------
# Entry points (called by chunk_gated_delta_rule / chunk_kda with cp=...).


def _plan_of(op: str, cp, cp_context) -> ContextParallel:
    if cp is not None and cp_context is not None:
        raise ValueError(f"fusedops: {op}: pass cp or its alias cp_context, not both")
    plan = cp if cp is not None else cp_context
    if not isinstance(plan, ContextParallel):
        raise TypeError(f"fusedops: {op}: cp must be a plan made by fusedops.distributed.context_parallel, "
                        f"got {type(plan).__name__}")
    return plan


def _check(op: str, plan, q: Tensor, v: Tensor, cu_seqlens, initial_state) -> None:
    if not isinstance(plan, ContextParallel):
        raise TypeError(f"fusedops: {op}: cp must be a plan made by fusedops.distributed.context_parallel, "
                        f"got {type(plan).__name__}")
    if cu_seqlens is not None:
        raise ValueError(f"fusedops: {op}: with cp the sequences come from the plan; pass cu_seqlens=None "
                         "(the plan's global cu_seqlens describe the batch)")
    if q.shape[0] != 1 or q.shape[1] != plan.num_tokens:
        raise ValueError(f"fusedops: {op}: with cp the inputs are this rank's tokens of the packed batch, "
                         f"[1, {plan.num_tokens}, ...], got q of shape {list(q.shape)}")
    if q.device != plan.device and not (q.device.type == plan.device.type == "cuda"):
        raise ValueError(f"fusedops: {op}: the inputs are on {q.device} but the plan on {plan.device}")
    if initial_state is not None and initial_state.shape[0] != plan.num_seqs:
        raise ValueError(f"fusedops: {op}: with cp initial_state holds every global sequence: "
                         f"[{plan.num_seqs}, HV, K, V], got {list(initial_state.shape)}")


def chunk_gated_delta_rule_cp(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                              cp, cp_context, *, chunk_size, use_gate_in_kernel, A_log, dt_bias,
                              use_beta_sigmoid_in_kernel, allow_neg_eigval, keep_intermediates,
                              cu_seqlens=None):
    """chunk_gated_delta_rule's cp path (its arguments already checked and normalised there:
    scale a float, the initial state in the [K,V] layout)."""
    cp = _plan_of("chunk_gated_delta_rule", cp, cp_context)
    _check("chunk_gated_delta_rule", cp, q, v, cu_seqlens, initial_state)
    if keep_intermediates is None:
        keep_intermediates = q.device.type == "cpu"
    o = _Opts(False, float(scale), bool(output_final_state), bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
              bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), int(chunk_size),
              keep=bool(keep_intermediates) and torch.is_grad_enabled())
    out, ht = _LinearAttentionCP.apply(o, cp, q, k, v, g, beta, initial_state, A_log, dt_bias)
    return out, (ht if output_final_state else None)


def chunk_kda_cp(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                 cp, cp_context, *, chunk_size, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                 allow_neg_eigval, safe_gate, lower_bound, cu_seqlens=None):
    """chunk_kda's cp path (arguments checked and normalised there)."""
    cp = _plan_of("chunk_kda", cp, cp_context)
    _check("chunk_kda", cp, q, v, cu_seqlens, initial_state)
    has_lb = lower_bound is not None
    o = _Opts(True, float(scale), bool(output_final_state), bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
              bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), int(chunk_size), safe_gate=bool(safe_gate),
              has_lb=has_lb, lb=float(lower_bound) if has_lb else 0.0)
    out, ht = _LinearAttentionCP.apply(o, cp, q, k, v, g, beta, initial_state, A_log, dt_bias)
    return out, (ht if output_final_state else None)
