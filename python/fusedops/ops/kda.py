"""Kimi delta attention (KDA, docs/specs/linear_attention.md section 9): the gated delta rule with a
per-key-channel decay ``g [B,T,HV,K]``.

Top level (differentiable, torch.library custom ops):
    chunk_kda(q, k, v, g, beta, ...)            -> (o, final_state)
    fused_recurrent_kda(q, k, v, g, beta, ...)  -> (o, final_state)
    fused_kda_gate(g, A_log, dt_bias, lower_bound) -> the per-channel gate of section 11
Sub-operators (plain functions): chunk_kda_fwd_intra (flash-linear-attention's six outputs) and
chunk_kda_intra_A (its two intra-chunk matrices), kda_recompute_w_u_fwd, chunk_kda_fwd_o,
chunk_kda_bwd_dAv, chunk_kda_bwd_wy_dqkg_fused, chunk_kda_bwd_intra, kda_gate_fwd, kda_gate_bwd;
the pipeline also uses chunk_local_cumsum (vector variant), chunk_gated_delta_rule_fwd_h and
chunk_gated_delta_rule_bwd_dhu (``gk`` variants), re-exported here as chunk_kda_fwd_h /
chunk_kda_bwd_dhu. The plumbing shared with the gated delta rule (varlen tables, custom-op bodies)
is in _linear_attention.py.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context
from .._op import DifferentiableOp, PlainOp
from . import _linear_attention as la
from ._linear_attention import chunk_gated_delta_rule_bwd_dhu as chunk_kda_bwd_dhu
from ._linear_attention import chunk_gated_delta_rule_fwd_h as chunk_kda_fwd_h
from ._linear_attention import chunk_local_cumsum
from .gated_delta_rule import beta_in_kernel, out_dtype

_OP = "chunk_kda"
_OP_REC = "fused_recurrent_kda"

__all__ = [
    "chunk_kda",
    "fused_recurrent_kda",
    "fused_kda_gate",
    "chunk_kda_fwd_intra",
    "chunk_kda_intra_A",
    "kda_recompute_w_u_fwd",
    "chunk_kda_fwd_o",
    "chunk_kda_bwd_dAv",
    "chunk_kda_bwd_wy_dqkg_fused",
    "chunk_kda_bwd_intra",
    "chunk_kda_fwd_h",
    "chunk_kda_bwd_dhu",
    "chunk_local_cumsum",
    "kda_gate_fwd",
    "kda_gate_bwd",
]

_T3 = tuple[Tensor, Tensor, Tensor]


# ---------------------------------------------------------------------------------------------
# chunk_kda


class _Kda(la.ChunkFamily):
    name = "chunk_kda"
    extra = (("safe_gate", bool), ("has_lb", bool), ("lb", float))
    saved = ("Aqk", "Akk")
    bwd_extra = extra

    def allocate(self, c, extra, nt):
        return [c.k.new_empty(c.B, c.T, c.HV, c.chunk_size), c.k.new_empty(c.B, c.T, c.HV, c.chunk_size)]

    def forward_flags(self, extra):
        return extra


_chunk_fwd = la.chunk_op(_Kda())


def _check_state_dtype(op: str, q: Tensor, initial_state: Tensor) -> None:
    want = torch.float64 if q.dtype == torch.float64 else torch.float32
    if initial_state.dtype != want:
        la.fail(op, f"initial_state must be {want} (the state is kept in {want}), got {initial_state.dtype}")


def chunk_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: Optional[float] = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    cp_context=None,
    use_graph: bool = False,
    max_num_seqs: Optional[int] = None,
    *,
    chunk_size: int = 64,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    cp=None,
    transpose_state_layout: Optional[bool] = None,
    **kwargs,
):
    """Chunked Kimi delta attention (flash-linear-attention 0.6.0's ``chunk_kda``: the same
    positional order, keyword names and defaults; fusedops' own options and the ones
    flash-linear-attention reads from ``**kwargs`` (chunk_size, A_log, dt_bias) are keyword-only).

    Per sequence and value head, with state ``S`` ([K,V], fp32, ``initial_state`` or 0)::

        S = diag(exp(g_t)) S;  delta = beta_t (v_t - S^T k_t);  S += k_t delta^T;  o_t = scale S^T q_t

    computed chunk by chunk (``chunk_size`` 32 or 64). q, k ``[B,T,H,K]``; v ``[B,T,HV,V]``
    (``HV % H == 0``); g ``[B,T,HV,K]`` a per-step log decay, or with ``use_gate_in_kernel`` the
    raw input of ``-exp(A_log) softplus(g + dt_bias)`` (``lower_bound * sigmoid(exp(A_log)(g +
    dt_bias))`` when ``lower_bound`` is set); beta ``[B,T,HV]`` in (0,1), or logits with
    ``use_beta_sigmoid_in_kernel``. ``initial_state [N,HV,K,V]`` must be fp32. ``cu_seqlens``
    packs sequences along T (B == 1). Returns ``(o [B,T,HV,V] in q's dtype, final_state fp32 or
    None)``; differentiable in q, k, v, g, beta, initial_state, A_log and dt_bias.
    ``state_v_first`` (deprecated alias ``transpose_state_layout``) takes and returns states as
    ``[V,K]``. ``cp_context`` (alias ``cp``): a context-parallel plan
    (``fusedops.distributed.context_parallel``): the inputs are this rank's tokens, the plan gives
    the sequences (cu_seqlens None); initial_state / final_state hold every global sequence.
    Accepted and ignored (the results are the same): ``disable_recompute`` (W, U and the chunk
    states are recomputed in the backward), ``use_graph``, ``max_num_seqs``.
    ``return_intermediate_states`` is not supported (run :func:`chunk_kda_fwd_h` on the outputs of
    the sub-operators for the per-chunk states).
    """
    op = "chunk_kda"
    la.reject_kwargs(op, kwargs)
    la.check_slots(op, dict(initial_state=initial_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                            A_log=A_log, dt_bias=dt_bias),
                   dict(output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                        allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, disable_recompute=disable_recompute,
                        return_intermediate_states=return_intermediate_states, state_v_first=state_v_first,
                        use_graph=use_graph), dict(scale=scale, lower_bound=lower_bound, max_num_seqs=max_num_seqs))
    if return_intermediate_states:
        la.fail(op, "return_intermediate_states is not supported; run chunk_kda_fwd_h on the outputs of the "
                    "sub-operators (chunk_kda_fwd_intra, kda_recompute_w_u_fwd) for the per-chunk states",
                NotImplementedError)
    state_v_first = la.state_layout(op, state_v_first, transpose_state_layout)
    la.check_rank4(op, q, k, v)
    if q.shape != k.shape:
        la.fail(op, f"q and k must have the same shape, got {list(q.shape)} and {list(k.shape)}")
    B, T, H, K = q.shape
    HV = v.shape[2]
    if H == 0 or HV % H:
        la.fail(op, f"the {HV} value heads are not a multiple of the {H} q/k heads")
    if K > 256:
        la.fail(op, f"K must be <= 256, got {K}")
    if tuple(g.shape) != (B, T, HV, K):
        la.fail(op, f"g must have shape [B,T,HV,K]={[B, T, HV, K]}, got {list(g.shape)}")
    if tuple(beta.shape) != (B, T, HV):
        la.fail(op, f"beta must have shape [B,T,HV]={[B, T, HV]}, got {list(beta.shape)}")
    if chunk_size not in (32, 64):
        la.fail(op, f"chunk_size must be 32 or 64, got {chunk_size}")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        la.fail(op, "allow_neg_eigval requires use_beta_sigmoid_in_kernel")
    if use_gate_in_kernel and A_log is None and lower_bound is None:
        la.fail(op, "use_gate_in_kernel requires A_log unless lower_bound is set")
    if use_gate_in_kernel and safe_gate and (lower_bound is None or not -5 <= lower_bound < 0):
        la.fail(op, f"safe_gate with use_gate_in_kernel requires lower_bound in [-5, 0), got {lower_bound}")
    la.check_packed(op, q, cu_seqlens)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if cp is not None or cp_context is not None:  # the plan's global sequences
        N = getattr(cp if cp is not None else cp_context, "num_seqs", N)
    if initial_state is not None:
        _check_state_dtype(op, q, initial_state)
        if initial_state.dim() != 4 or initial_state.shape[0] != N:
            la.fail(op, f"initial_state must have shape [N,HV,K,V] with N={N} sequences, got "
                      f"{list(initial_state.shape)}")
    if scale is None:
        scale = K ** -0.5
    if use_gate_in_kernel and dt_bias is not None and not dt_bias.is_contiguous():
        dt_bias = dt_bias.contiguous()
    if cp is not None or cp_context is not None:
        from ..distributed._linear_attention import chunk_kda_cp
        o, ht = chunk_kda_cp(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                             cp, cp_context, chunk_size=chunk_size, use_gate_in_kernel=use_gate_in_kernel,
                             A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                             allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
                             cu_seqlens=cu_seqlens)
        return o, (ht.transpose(-1, -2) if ht is not None and state_v_first else ht)
    has_lb = lower_bound is not None
    out = _chunk_fwd(q, k, v, g, beta, float(scale), la.state_in(initial_state, state_v_first),
                     bool(output_final_state), bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
                     A_log if use_gate_in_kernel else None, dt_bias if use_gate_in_kernel else None,
                     bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), cu_seqlens, cu_seqlens_cpu,
                     int(chunk_size), bool(safe_gate), has_lb, float(lower_bound) if has_lb else 0.0)
    return la.state_out(out[0], out[1], output_final_state, state_v_first)


# ---------------------------------------------------------------------------------------------
# fused_recurrent_kda


_rec_fwd = la.recurrent_op(_OP_REC)


def fused_recurrent_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Optional[Tensor],
    beta: Optional[Tensor],
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: Optional[float] = None,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    *,
    transpose_state_layout: Optional[bool] = None,
    **kwargs,
):
    """KDA token by token (decoding; flash-linear-attention 0.6.0's ``fused_recurrent_kda``, its
    positional order: ``A_log`` and ``dt_bias`` 6th and 7th): same recurrence, layout and options
    as :func:`chunk_kda` (g and beta may be None: no decay / beta = 1, the logits 1 with
    ``use_beta_sigmoid_in_kernel``; ``allow_neg_eigval`` doubles the in-kernel sigmoid of beta).
    Returns ``(o, final_state or None)``; differentiable in every tensor input. The backward
    recomputes the states from checkpoints: every 16 tokens on Hopper (held in a workspace of
    ceil(B T / 16) states per value head), every 64 on the CPU; other GPUs recompute each 32-token
    block's start from the initial state (quadratic in T, T <= 4096)."""
    op = "fused_recurrent_kda"
    la.reject_kwargs(op, kwargs)
    la.check_slots(op, dict(g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
                            cu_seqlens=cu_seqlens),
                   dict(output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                        allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first),
                   dict(scale=scale, lower_bound=lower_bound))
    state_v_first = la.state_layout(op, state_v_first, transpose_state_layout)
    initial_state = la.state_in(initial_state, state_v_first)
    la.check_rank4(op, q, k, v)
    la.check_packed(op, q, cu_seqlens)
    if initial_state is not None:
        _check_state_dtype(op, q, initial_state)
    if use_gate_in_kernel:
        if g is None:
            la.fail(op, "use_gate_in_kernel requires g")
        if A_log is None and lower_bound is None:
            la.fail(op, "use_gate_in_kernel requires A_log unless lower_bound is set")
        g = fused_kda_gate(g, A_log, dt_bias, lower_bound, None)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        la.fail(op, "allow_neg_eigval requires use_beta_sigmoid_in_kernel")
    beta = beta_in_kernel(beta, v, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if use_qk_l2norm_in_kernel:
        from .l2norm import l2norm
        q, k = l2norm(q, 1e-6), l2norm(k, 1e-6)
    o, ht = _rec_fwd(q, k, v, g, beta, float(scale), initial_state, bool(output_final_state), cu_seqlens)
    return la.state_out(o, ht, output_final_state, state_v_first)


# ---------------------------------------------------------------------------------------------
# Per-channel gate (section 11)


def _gate_fwd_impl(g: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor], has_lb: bool,
                   lb: float) -> Tensor:
    y = torch.empty(g.shape, dtype=la.acc_dtype(g), device=g.device)
    _C.kda_gate_fwd(context("kda_gate", g), la.last_unit(g), A_log.contiguous() if A_log is not None else None,
                    dt_bias.contiguous() if dt_bias is not None else None, y, has_lb, lb)
    return y


def _gate_fwd_fake(g, A_log, dt_bias, has_lb, lb):
    return g.new_empty(g.shape, dtype=la.acc_dtype(g))


def _gate_bwd_impl(g: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor], dy: Tensor,
                   has_lb: bool, lb: float) -> _T3:
    dg = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    dA = torch.empty(A_log.shape, dtype=A_log.dtype, device=g.device) if A_log is not None else la.empty(g)
    db = torch.empty(dt_bias.shape, dtype=dt_bias.dtype, device=g.device) if dt_bias is not None else la.empty(g)
    _C.kda_gate_bwd(context("kda_gate", g), la.last_unit(g), A_log.contiguous() if A_log is not None else None,
                    dt_bias.contiguous() if dt_bias is not None else None, la.last_unit(dy), dg,
                    dA if A_log is not None else None, db if dt_bias is not None else None, has_lb, lb)
    return dg, dA, db


def _gate_bwd_fake(g, A_log, dt_bias, dy, has_lb, lb):
    return (g.new_empty(g.shape), A_log.new_empty(A_log.shape) if A_log is not None else g.new_empty(0),
            dt_bias.new_empty(dt_bias.shape) if dt_bias is not None else g.new_empty(0))


_gate_bwd = PlainOp("kda_gate_bwd", _gate_bwd_impl, _gate_bwd_fake)


def _gate_setup(ctx, inputs, output):
    g, A_log, dt_bias, has_lb, lb = inputs
    ctx.lb = (has_lb, lb)
    ctx.save_for_backward(g, A_log, dt_bias)


def _gate_backward(ctx, dy):
    g, A_log, dt_bias = ctx.saved_tensors
    if dy is None:
        return None, None, None, None, None
    dg, dA, db = _gate_bwd(g, A_log, dt_bias, dy, *ctx.lb)
    return dg, (dA if A_log is not None else None), (db if dt_bias is not None else None), None, None


_gate_fwd = DifferentiableOp("kda_gate_fwd", _gate_fwd_impl, _gate_fwd_fake, _gate_setup, _gate_backward)


def fused_kda_gate(g: Tensor, A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                   lower_bound: Optional[float] = None,
                   output_dtype: Optional[torch.dtype] = torch.float32) -> Tensor:
    """The KDA gate over ``g [B,T,HV,K]``: ``-exp(A_log) softplus(g + dt_bias)``, or
    ``lower_bound * sigmoid(exp(A_log) (g + dt_bias))`` when ``lower_bound`` is set (A_log then
    optional). A_log ``[HV]``, dt_bias ``[HV*K]``; computed in fp32 (fp64 for fp64 g), returned in
    ``output_dtype`` (None keeps the compute dtype); differentiable in g, A_log and dt_bias."""
    if g.dim() != 4:
        la.fail("kda_gate", f"g must have rank 4 ([B,T,HV,K]), got shape {list(g.shape)}")
    if A_log is None and lower_bound is None:
        la.fail("kda_gate", "A_log is required unless lower_bound is set")
    has_lb = lower_bound is not None
    return out_dtype(_gate_fwd(g, A_log, dt_bias, has_lb, float(lower_bound) if has_lb else 0.0), output_dtype)


def kda_gate_fwd(g: Tensor, A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                 lower_bound: Optional[float] = None,
                 output_dtype: Optional[torch.dtype] = torch.float32) -> Tensor:
    """Launcher form of the KDA gate forward (as :func:`fused_kda_gate`)."""
    return fused_kda_gate(g, A_log, dt_bias, lower_bound, output_dtype)


def kda_gate_bwd(g: Tensor, A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                 dyg: Optional[Tensor] = None, lower_bound: Optional[float] = None):
    """Launcher form of the KDA gate backward: ``(dg, dA_log or None, ddt_bias or None)``."""
    if dyg is None:
        la.fail("kda_gate_bwd", "dyg (the gradient of the gate output) is required")
    has_lb = lower_bound is not None
    dg, dA, db = _gate_bwd(g, A_log, dt_bias, dyg, has_lb, float(lower_bound) if has_lb else 0.0)
    return dg, (dA if A_log is not None else None), (db if dt_bias is not None else None)


# ---------------------------------------------------------------------------------------------
# Sub-operators: plain functions, not differentiable.


def _per_value_head(op: str, q: Tensor, k: Tensor, HV: int) -> tuple[Tensor, Tensor]:
    """q, k ``[B,T,H,K]`` repeated over each group of value heads, ``[B,T,HV,K]``: the backward
    sub-operators then give dq, dk per value head (flash-linear-attention's layout) instead of
    summing each group."""
    H = q.shape[2]
    if H == HV:
        return q, k
    if H == 0 or HV % H:
        la.fail(op, f"the {HV} value heads are not a multiple of the {H} q/k heads")
    return q.repeat_interleave(HV // H, 2), k.repeat_interleave(HV // H, 2)


def _ci(op, cu_seqlens, chunk_indices, chunk_size, T):
    return la.chunk_tables(op, cu_seqlens, None, chunk_indices, chunk_size, T)[0]


def chunk_kda_intra_A(q: Tensor, k: Tensor, gk: Tensor, beta: Tensor, scale: Optional[float] = None,
                      cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                      chunk_indices: Optional[Tensor] = None, safe_gate: bool = False,
                      output_dtype: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor]:
    """``(Aqk, Akk)`` per chunk: ``Aqk = scale sum_c q k exp(gk_i - gk_j)`` (j <= i) and
    ``Akk = (I + L)^{-1}`` with ``L = beta_i sum_c k k exp(gk_i - gk_j)`` (j < i); gk is the
    chunk-local cumsum ``[B,T,HV,K]``. ``[B,T,HV,BT]`` each, in ``output_dtype`` (k's dtype)."""
    op = "chunk_kda_fwd_intra"
    ci = _ci(op, cu_seqlens, chunk_indices, chunk_size, k.shape[1])
    B, T, HV = gk.shape[:3]
    dt = output_dtype or k.dtype
    Aqk = torch.empty(B, T, HV, chunk_size, dtype=dt, device=k.device)
    Akk = torch.empty(B, T, HV, chunk_size, dtype=dt, device=k.device)
    _C.chunk_kda_fwd_intra(context(op, k), la.last_unit(q), la.last_unit(k), la.last_unit(gk),
                           la.last_unit(beta), Aqk, Akk, cu_seqlens, ci,
                           q.shape[-1] ** -0.5 if scale is None else float(scale), chunk_size, safe_gate)
    return Aqk, Akk


def chunk_kda_fwd_intra(q: Tensor, k: Tensor, v: Tensor, gk: Optional[Tensor] = None,
                        beta: Optional[Tensor] = None, scale: Optional[float] = None,
                        cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                        chunk_indices: Optional[Tensor] = None, safe_gate: bool = False,
                        lower_bound: Optional[float] = None, disable_recompute: bool = False,
                        use_graph: bool = False):
    """flash-linear-attention 0.6.0's fused intra-chunk forward: ``(w, u, qg, kg, Aqk, Akk)``
    (:func:`chunk_kda_intra_A`, then :func:`kda_recompute_w_u_fwd` on Akk), ``Aqk`` and ``Akk`` in
    k's dtype, ``qg`` only with ``disable_recompute`` (None otherwise). ``gk`` is the chunk-local
    cumsum in natural-log units. ``lower_bound`` (it only moves flash-linear-attention's internal
    exponent shift) and ``use_graph`` are accepted and ignored."""
    la.check_slots("chunk_kda_fwd_intra", dict(gk=gk, beta=beta, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices),
                   dict(safe_gate=safe_gate, disable_recompute=disable_recompute),
                   dict(scale=scale, lower_bound=lower_bound))
    if gk is None or beta is None:
        la.fail("chunk_kda_fwd_intra", "gk (the chunk-local gate cumsum) and beta are required")
    if chunk_size not in (32, 64):
        la.fail("chunk_kda_fwd_intra", f"chunk_size must be 32 or 64, got {chunk_size}")
    Aqk, Akk = chunk_kda_intra_A(q, k, gk, beta, scale, cu_seqlens, chunk_size, chunk_indices, safe_gate)
    w, u, qg, kg = kda_recompute_w_u_fwd(k, v, beta, Akk, gk, q if disable_recompute else None, cu_seqlens,
                                         chunk_indices)
    return w, u, qg, kg, Aqk, Akk


def kda_recompute_w_u_fwd(k: Tensor, v: Tensor, beta: Tensor, A: Tensor, gk: Tensor,
                          q: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                          chunk_indices: Optional[Tensor] = None):
    """``(w, u, qg or None, kg)``: ``w = Akk (beta exp(gk) k)``, ``u = Akk (beta v)``,
    ``qg = q exp(gk)``, ``kg = k exp(gk_last - gk)``; per value head."""
    ci = _ci("kda_recompute_w_u_fwd", cu_seqlens, chunk_indices, A.shape[-1], k.shape[1])
    B, T, HV = v.shape[:3]
    K = k.shape[-1]
    w = torch.empty(B, T, HV, K, dtype=k.dtype, device=k.device)
    u = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    kg = torch.empty(B, T, HV, K, dtype=k.dtype, device=k.device)
    qg = torch.empty(B, T, HV, K, dtype=k.dtype, device=k.device) if q is not None else None
    _C.kda_recompute_w_u_fwd(context("kda_recompute_w_u", k), la.last_unit(q), la.last_unit(k), la.last_unit(v),
                             la.last_unit(beta), la.last_unit(A), la.last_unit(gk), w, u, kg, qg, cu_seqlens, ci)
    return w, u, qg, kg


def chunk_kda_fwd_o(qg: Tensor, Aqk: Tensor, v: Tensor, h: Tensor, scale: Optional[float] = None,
                    cu_seqlens: Optional[Tensor] = None, chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``o = scale qg h[n] + (M>= . Aqk) v`` per chunk (v = v_new)."""
    ci = _ci("chunk_kda_fwd_o", cu_seqlens, chunk_indices, Aqk.shape[-1], v.shape[1])
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _C.chunk_kda_fwd_o(context("chunk_kda_fwd_o", v), la.last_unit(qg), la.last_unit(Aqk), la.last_unit(v),
                       la.dense_state(h), o, cu_seqlens, ci, qg.shape[-1] ** -0.5 if scale is None else float(scale))
    return o


def chunk_kda_bwd_dAv(q: Tensor, k: Tensor, v: Tensor, do: Tensor, A: Optional[Tensor] = None,
                      scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                      chunk_size: int = 64, chunk_indices: Optional[Tensor] = None, use_graph: bool = False):
    """``(dAqk fp32, dv)``: ``dAqk = scale M>= . (dO v^T)``, ``dv = (M>= . A)^T dO`` with ``A`` the
    forward's Aqk (required; q and k give K for the default ``scale = K**-0.5``)."""
    op = "chunk_kda_bwd_dAv"
    la.check_slots(op, dict(A=A, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices), numbers=dict(scale=scale))
    if A is None:
        la.fail(op, "A (the forward's Aqk [B,T,HV,BT]) is required")
    if A.shape[-1] != chunk_size:
        la.fail(op, f"A's last dimension (the chunk size) must be chunk_size={chunk_size}, got {A.shape[-1]}")
    ci = _ci(op, cu_seqlens, chunk_indices, chunk_size, v.shape[1])
    dA = torch.empty(A.shape, dtype=la.acc_dtype(v), device=v.device)
    dv = torch.empty(do.shape, dtype=do.dtype, device=do.device)
    _C.chunk_kda_bwd_dAv(context(op, v), la.last_unit(A), la.last_unit(v), la.last_unit(do), dA,
                         dv, cu_seqlens, ci, k.shape[-1] ** -0.5 if scale is None else float(scale))
    return dA, dv


def chunk_kda_bwd_wy_dqkg_fused(q: Tensor, k: Tensor, v: Tensor, v_new: Tensor, g: Tensor, beta: Tensor,
                                A: Tensor, h: Tensor, do: Tensor, dh: Tensor, dv: Tensor,
                                scale: Optional[float] = None, state_v_first: bool = False,
                                cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                                chunk_indices: Optional[Tensor] = None, chunk_offsets: Optional[Tensor] = None,
                                use_graph: bool = False):
    """``(dq, dk, dv, dbeta, dg, dA)`` of block K3 (g = the chunk-local cumsum, A = Akk, dv =
    the total gradient of v_new; h, dh ``[..., V, K]`` with ``state_v_first``); dq, dk per value
    head ``[B,T,HV,K]`` as flash-linear-attention returns them (with GVA the caller sums each
    group of value heads); all fp32 except dv."""
    op = "chunk_kda_bwd_wy_dqkg_fused"
    la.check_slots(op, dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets),
                   dict(state_v_first=state_v_first), dict(scale=scale))
    ci, co = la.chunk_tables(op, cu_seqlens, None, chunk_indices, chunk_size, q.shape[1])
    la.check_offsets(op, chunk_offsets, co)
    acc = la.acc_dtype(q)
    B, T, HV = v.shape[:3]
    q, k = _per_value_head(op, q, k, HV)
    dq = torch.empty(q.shape, dtype=acc, device=q.device)
    dk = torch.empty(k.shape, dtype=acc, device=q.device)
    dvo = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    db = torch.empty(B, T, HV, dtype=acc, device=q.device)
    dg = torch.empty(g.shape, dtype=acc, device=q.device)
    dA = torch.empty(B, T, HV, chunk_size, dtype=acc, device=q.device)
    h, dh = la.dense_state(h, state_v_first), la.dense_state(dh, state_v_first)
    tensors = [la.last_unit(x) for x in (q, k, v, v_new, g, beta, A, h, dh, do, dv)]
    tensors += [dq, dk, dvo, db, dg, dA, cu_seqlens, ci]
    _C.chunk_kda_bwd_wy_dqkg_fused(context(op, q), tensors,
                                   q.shape[-1] ** -0.5 if scale is None else float(scale), chunk_size)
    return dq, dk, dvo, db, dg, dA


def chunk_kda_bwd_intra(q: Tensor, k: Tensor, g: Tensor, beta: Tensor, dAqk: Tensor, dAkk: Tensor,
                        dq: Tensor, dk: Tensor, db: Tensor, dg: Tensor, cu_seqlens: Optional[Tensor] = None,
                        chunk_indices: Optional[Tensor] = None, chunk_size: int = 64, safe_gate: bool = False,
                        lower_bound: Optional[float] = None, use_graph: bool = False):
    """Adds the gradients through Aqk and L (block K4) to the partial ``dq, dk, db, dg``; returns
    new ``(dq, dk, db, dg)`` (inputs untouched). dq, dk are per value head ``[B,T,HV,K]``, in and
    out, as flash-linear-attention keeps them (:func:`chunk_kda_bwd_wy_dqkg_fused`'s). ``lower_bound``
    (flash-linear-attention's exponent shift) and ``use_graph`` are accepted and ignored."""
    op = "chunk_kda_bwd_intra"
    la.check_slots(op, dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices), dict(safe_gate=safe_gate),
                   dict(lower_bound=lower_bound))
    HV = g.shape[2]
    q, k = _per_value_head(op, q, k, HV)
    for name, t in (("dq", dq), ("dk", dk)):
        if tuple(t.shape) != tuple(q.shape):
            la.fail(op, f"{name} must be per value head, [B,T,HV,K]={list(q.shape)} (as chunk_kda_bwd_wy_dqkg_fused "
                        f"returns it), got {list(t.shape)}")
    ci = _ci(op, cu_seqlens, chunk_indices, chunk_size, q.shape[1])
    outs = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (dq, dk, db, dg)]
    tensors = [la.last_unit(x) for x in (q, k, g, beta, dAqk, dAkk, dq, dk, db, dg)] + outs + [cu_seqlens, ci]
    _C.chunk_kda_bwd_intra(context(op, q), tensors, chunk_size, safe_gate)
    return tuple(outs)
