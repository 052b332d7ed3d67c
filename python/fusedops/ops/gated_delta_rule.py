"""Gated delta rule (GDN, docs/specs/linear_attention.md sections 0-8, 10-11).

Top level (differentiable, torch.library custom ops):
    chunk_gated_delta_rule(q, k, v, g, beta, ...)            -> (o, final_state)
    fused_recurrent_gated_delta_rule(q, k, v, g, beta, ...)  -> (o, final_state)
    fused_gdn_gate(g, A_log, dt_bias)                        -> -exp(A_log) * softplus(g + dt_bias)
Sub-operators (plain functions, flash-linear-attention's names and argument order):
    chunk_local_cumsum, chunk_scaled_dot_kkt_fwd, solve_tril, recompute_w_u_fwd,
    prepare_wy_repr_bwd, chunk_gated_delta_rule_fwd_h, chunk_gated_delta_rule_bwd_dhu,
    chunk_fwd_o, chunk_bwd_dv_local, chunk_bwd_dqkwg, gdn_gate_fwd, gdn_gate_bwd,
    prepare_chunk_indices, prepare_chunk_offsets.
Layout [B,T,H,D] ("seq-first"); varlen through cu_seqlens with B == 1; states [N,HV,K,V] fp32.
The plumbing shared with KDA (varlen tables, custom-op bodies, the shared sub-operators
re-exported here) is in _linear_attention.py.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from .._op import DifferentiableOp, PlainOp
from . import _linear_attention as la
from ._linear_attention import (
    chunk_gated_delta_rule_bwd_dhu,
    chunk_gated_delta_rule_fwd_h,
    chunk_local_cumsum,
    prepare_chunk_indices,
    prepare_chunk_offsets,
)

_OP = "chunk_gated_delta_rule"
_OP_REC = "fused_recurrent_gated_delta_rule"

__all__ = [
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_gdn_gate",
    "chunk_local_cumsum",
    "chunk_scaled_dot_kkt_fwd",
    "solve_tril",
    "recompute_w_u_fwd",
    "prepare_wy_repr_bwd",
    "chunk_gated_delta_rule_fwd_h",
    "chunk_gated_delta_rule_bwd_dhu",
    "chunk_fwd_o",
    "chunk_bwd_dv_local",
    "chunk_bwd_dqkwg",
    "gdn_gate_fwd",
    "gdn_gate_bwd",
    "prepare_chunk_indices",
    "prepare_chunk_offsets",
]


# ---------------------------------------------------------------------------------------------
# chunk_gated_delta_rule: the shared custom ops (_linear_attention.chunk_op) with GDN's saved solve
# A and, with keep, W, U, the h snapshots and Vnew kept for the backward.


class _Gdn(la.ChunkFamily):
    name = _OP
    extra = (("keep", bool),)
    saved = ("A", "w", "u", "h", "v_new")
    gate_rows = True  # gdn_gate reads g by rows

    def allocate(self, c, extra, nt):
        (keep,) = extra
        A = c.k.new_empty(c.B, c.T, c.HV, c.chunk_size)
        if not keep:
            return [A, *(c.q.new_empty(0) for _ in range(4))]
        h = c.q.new_empty(1 if c.cu_seqlens is not None else c.B, nt(), c.HV, c.K, c.V)
        return [A, c.q.new_empty(c.B, c.T, c.HV, c.K), c.v.new_empty(c.B, c.T, c.HV, c.V), h,
                c.v.new_empty(c.B, c.T, c.HV, c.V)]

    def kept(self, saved):
        return la.opt(saved[1])

    def backward_inputs(self, saved, extra):
        (keep,) = extra
        return (saved[0], *(saved[1:] if keep else (None,) * 4))


_chunk_fwd = la.chunk_op(_Gdn())


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    chunk_indices: Optional[Tensor] = None,
    cp_context=None,
    *,
    chunk_size: int = 64,
    use_gate_in_kernel: bool = False,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    keep_intermediates: Optional[bool] = None,
    cp=None,
    transpose_state_layout: Optional[bool] = None,
    **kwargs,
):
    """Chunked gated delta rule (flash-linear-attention 0.6.0's ``chunk_gated_delta_rule``: the
    same positional order, keyword names and defaults; fusedops' own options are keyword-only).

    Per sequence and value head, with state ``S`` ([K,V], fp32, ``initial_state`` or 0)::

        S = exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S += k_t delta^T;  o_t = scale S^T q_t

    computed chunk by chunk (``chunk_size`` 16/32/64). q, k ``[B,T,H,K]``; v ``[B,T,HV,V]``
    (``HV % H == 0``); g, beta ``[B,T,HV]`` (g a per-step log decay, or the raw gate input with
    ``use_gate_in_kernel``: ``g = -exp(A_log) * softplus(g + dt_bias)``; beta in (0,1), or logits
    with ``use_beta_sigmoid_in_kernel``, times 2 with ``allow_neg_eigval``). ``cu_seqlens`` packs
    sequences along T (B == 1); ``cu_seqlens_cpu`` (its host copy) spares a device read;
    ``chunk_indices`` (``prepare_chunk_indices(cu_seqlens, chunk_size)``) is checked against
    cu_seqlens and otherwise not needed. ``use_qk_l2norm_in_kernel`` normalises q and k (eps 1e-6).
    Returns ``(o [B,T,HV,V] in q's dtype, final_state [N,HV,K,V] fp32 or None)``; differentiable
    in q, k, v, g, beta, initial_state, A_log and dt_bias. ``state_v_first`` (deprecated alias
    ``transpose_state_layout``) takes and returns states as ``[V,K]``. ``keep_intermediates``:
    when a gradient will be taken, keep W, U, the chunk states and Vnew from the forward instead
    of recomputing them in the backward (faster backward; saved memory grows by ~(3 +
    K*V/(chunk_size*K)) x the size of v, e.g. 5x at K=V=128, chunk 64). Default (None): on the
    CPU, not on CUDA (as flash-linear-attention, which recomputes). ``cp_context`` (alias ``cp``):
    a context-parallel plan (``fusedops.distributed.context_parallel``): the inputs are this rank's
    tokens, the plan gives the sequences (cu_seqlens None); initial_state / final_state hold every
    global sequence.
    """
    la.reject_kwargs(_OP, kwargs)
    la.check_slots(_OP, dict(initial_state=initial_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                             chunk_indices=chunk_indices, A_log=A_log, dt_bias=dt_bias),
                   dict(output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                        state_v_first=state_v_first), dict(scale=scale))
    state_v_first = la.state_layout(_OP, state_v_first, transpose_state_layout)
    la.check_rank4(_OP, q, k, v)
    if q.shape[2] != k.shape[2]:
        raise ValueError("fusedops: chunk_gated_delta_rule: q and k must have the same number of heads "
                         f"(q.shape[2] == k.shape[2]), got {q.shape[2]} and {k.shape[2]}")
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"fusedops: chunk_gated_delta_rule: chunk_size must be 16, 32 or 64, got {chunk_size}")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("fusedops: chunk_gated_delta_rule: allow_neg_eigval requires use_beta_sigmoid_in_kernel")
    if use_gate_in_kernel and A_log is None:
        raise ValueError("fusedops: chunk_gated_delta_rule: use_gate_in_kernel requires A_log")
    la.check_packed(_OP, q, cu_seqlens)
    if chunk_indices is not None:  # FLA's precomputed table: checked, the op reads the kept one
        la.chunk_tables(_OP, cu_seqlens, cu_seqlens_cpu, chunk_indices, chunk_size, q.shape[1])
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if keep_intermediates is None:
        keep_intermediates = q.is_cpu
    grads = (q, k, v, g, beta, initial_state, A_log, dt_bias)
    keep = bool(keep_intermediates) and torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in grads)
    h0 = la.state_in(initial_state, state_v_first)
    if cp is not None or cp_context is not None:
        from ..distributed._linear_attention import chunk_gated_delta_rule_cp
        o, ht = chunk_gated_delta_rule_cp(
            q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel, cp, cp_context,
            chunk_size=chunk_size, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
            keep_intermediates=keep_intermediates, cu_seqlens=cu_seqlens)
        return o, (ht.transpose(-1, -2) if ht is not None and state_v_first else ht)
    out = _chunk_fwd(q, k, v, g, beta, float(scale), h0,
                     bool(output_final_state), bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
                     A_log if use_gate_in_kernel else None, dt_bias if use_gate_in_kernel else None,
                     bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), cu_seqlens,
                     cu_seqlens_cpu, int(chunk_size), keep)
    return la.state_out(out[0], out[1], output_final_state, state_v_first)


# ---------------------------------------------------------------------------------------------
# fused_recurrent_gated_delta_rule

_rec_fwd = la.recurrent_op(_OP_REC)


def beta_in_kernel(beta: Optional[Tensor], like: Tensor, use_beta_sigmoid_in_kernel: bool,
                   allow_neg_eigval: bool) -> Optional[Tensor]:
    """flash-linear-attention's in-kernel beta of the recurrent forms: ``sigmoid(beta)`` (times 2
    with ``allow_neg_eigval``) of the logits, in fp32 (fp64 kept), differentiable; a missing beta
    is the logits 1 there (``beta = ones``, then the sigmoid)."""
    if not use_beta_sigmoid_in_kernel:
        return beta
    if beta is None:
        beta = torch.ones(like.shape[:3], dtype=torch.float32, device=like.device)
    b = torch.sigmoid(beta if beta.dtype == torch.float64 else beta.float())
    return b * 2 if allow_neg_eigval else b


def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Optional[Tensor] = None,
    gk: Optional[Tensor] = None,
    gv: Optional[Tensor] = None,
    beta: Optional[Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    *,
    transpose_state_layout: Optional[bool] = None,
    **kwargs,
):
    """The gated delta rule token by token (decoding; flash-linear-attention 0.6.0's
    ``fused_recurrent_gated_delta_rule``, its positional order: ``gk`` and ``gv`` come before
    ``beta``): the recurrence and layout of :func:`chunk_gated_delta_rule`. ``g [B,T,HV]`` a
    per-head log decay (the raw gate with ``use_gate_in_kernel``: ``-exp(A_log) softplus(g +
    dt_bias)``) or ``gk [B,T,HV,K]`` a per-key log decay (the recurrence of
    :func:`fusedops.fused_recurrent_kda`), or neither (no decay); ``gv`` (a per-value decay) and
    g together with gk are rejected. ``beta [B,T,HV]`` (None: 1), logits with
    ``use_beta_sigmoid_in_kernel`` (``2 sigmoid`` with ``allow_neg_eigval``). Returns ``(o,
    final_state or None)``; differentiable in every tensor input (flash-linear-attention's is
    forward only). The backward recomputes the states from checkpoints: every 16 tokens on Hopper
    (held in a workspace of ceil(B T / 16) states per value head), every 64 on the CPU; other GPUs
    recompute their checkpoints from the initial state (quadratic in T)."""
    la.reject_kwargs(_OP_REC, kwargs)
    la.check_slots(_OP_REC, dict(g=g, gk=gk, gv=gv, beta=beta, initial_state=initial_state, A_log=A_log,
                                 dt_bias=dt_bias, cu_seqlens=cu_seqlens),
                   dict(output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                        allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first), dict(scale=scale))
    state_v_first = la.state_layout(_OP_REC, state_v_first, transpose_state_layout)
    la.check_rank4(_OP_REC, q, k, v)
    la.check_packed(_OP_REC, q, cu_seqlens)
    if gv is not None:
        la.fail(_OP_REC, "gv (a per-value decay) is not supported; pass the per-head decay g [B,T,HV] or the "
                         "per-key decay gk [B,T,HV,K]", NotImplementedError)
    if gk is not None and gk.dim() != 4:
        la.fail(_OP_REC, f"gk (the per-key decay) must have shape [B,T,HV,K], got {list(gk.shape)}; beta is the 7th "
                         "positional (flash-linear-attention 0.6.0's order q, k, v, g, gk, gv, beta): pass beta=")
    if gk is not None and g is not None:
        la.fail(_OP_REC, "g together with gk is not supported; pass one decay, g [B,T,HV] or gk [B,T,HV,K] "
                         "(e.g. gk + g[..., None])", NotImplementedError)
    if beta is not None and beta.dim() == 4:
        la.fail(_OP_REC, "a per-value beta [B,T,HV,V] is not supported; pass a per-head beta [B,T,HV]",
                NotImplementedError)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        la.fail(_OP_REC, "allow_neg_eigval requires use_beta_sigmoid_in_kernel")
    if use_gate_in_kernel:
        if A_log is None:
            la.fail(_OP_REC, "use_gate_in_kernel requires A_log")
        if g is None:
            la.fail(_OP_REC, "use_gate_in_kernel requires g (the raw gate input)")
    beta = beta_in_kernel(beta, v, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if gk is not None:
        from .kda import fused_recurrent_kda
        return fused_recurrent_kda(q, k, v, gk, beta, scale=scale, initial_state=initial_state,
                                   output_final_state=output_final_state,
                                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_v_first=state_v_first,
                                   cu_seqlens=cu_seqlens)
    if use_gate_in_kernel:
        g = fused_gdn_gate(g, A_log, dt_bias, None)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if use_qk_l2norm_in_kernel:
        from .l2norm import l2norm
        q, k = l2norm(q, 1e-6), l2norm(k, 1e-6)
    o, ht = _rec_fwd(q, k, v, g, beta, float(scale), la.state_in(initial_state, state_v_first),
                     bool(output_final_state), cu_seqlens)
    return la.state_out(o, ht, output_final_state, state_v_first)


# ---------------------------------------------------------------------------------------------
# fused_gdn_gate (section 11)


_T3 = tuple[Tensor, Tensor, Tensor]


def _gate_fwd_impl(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor]) -> Tensor:
    y = torch.empty(g.shape, dtype=torch.float32 if g.dtype != torch.float64 else g.dtype, device=g.device)
    _C.gdn_gate_fwd(context("gdn_gate", g), rows_view(g), A_log.contiguous(),
                    dt_bias.contiguous() if dt_bias is not None else None, y)
    return y


def _gate_fwd_fake(g, A_log, dt_bias):
    return g.new_empty(g.shape, dtype=torch.float32 if g.dtype != torch.float64 else g.dtype)


def _gate_bwd_impl(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor], dy: Tensor) -> _T3:
    dg = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    dA = torch.empty(A_log.shape, dtype=A_log.dtype, device=g.device)
    db = torch.empty(dt_bias.shape, dtype=dt_bias.dtype, device=g.device) if dt_bias is not None else la.empty(g)
    _C.gdn_gate_bwd(context("gdn_gate", g), rows_view(g), A_log.contiguous(),
                    dt_bias.contiguous() if dt_bias is not None else None, rows_view(dy), dg, dA,
                    db if dt_bias is not None else None)
    return dg, dA, db


def _gate_bwd_fake(g, A_log, dt_bias, dy):
    return (g.new_empty(g.shape), A_log.new_empty(A_log.shape),
            dt_bias.new_empty(dt_bias.shape) if dt_bias is not None else g.new_empty(0))


_gate_bwd = PlainOp("gdn_gate_bwd", _gate_bwd_impl, _gate_bwd_fake)


def _gate_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _gate_backward(ctx, dy):
    g, A_log, dt_bias = ctx.saved_tensors
    if dy is None:
        return None, None, None
    dg, dA, db = _gate_bwd(g, A_log, dt_bias, dy)
    return dg, dA, (db if dt_bias is not None else None)


_gate_fwd = DifferentiableOp("gdn_gate_fwd", _gate_fwd_impl, _gate_fwd_fake, _gate_setup, _gate_backward)


def fused_gdn_gate(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor] = None,
                   output_dtype: Optional[torch.dtype] = torch.float32) -> Tensor:
    """``-exp(A_log) * softplus(g + dt_bias)`` over the last dimension HV, computed in fp32 (fp64
    for fp64 g) and returned in ``output_dtype`` (flash-linear-attention's default fp32; None keeps
    the compute dtype); differentiable in g, A_log and dt_bias."""
    return out_dtype(_gate_fwd(g, A_log, dt_bias), output_dtype)


def gdn_gate_fwd(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor] = None,
                 output_dtype: Optional[torch.dtype] = torch.float32) -> Tensor:
    """Launcher form of the GDN gate forward (as :func:`fused_gdn_gate`)."""
    return out_dtype(_gate_fwd(g, A_log, dt_bias), output_dtype)


def gdn_gate_bwd(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor], dyg: Tensor):
    """Launcher form of the GDN gate backward: ``(dg, dA_log, ddt_bias or None)`` in the dtypes of
    g, A_log and dt_bias."""
    dg, dA, db = _gate_bwd(g, A_log, dt_bias, dyg)
    return dg, dA, (db if dt_bias is not None else None)


def out_dtype(y: Tensor, output_dtype: Optional[torch.dtype]) -> Tensor:
    """A gate computed in fp32 (fp64 for fp64 inputs) in the caller's ``output_dtype`` (None keeps
    the compute dtype, as the recurrences that take the gate do)."""
    la.check_slots("gate", output_dtype=output_dtype)
    return y if output_dtype is None or y.dtype == output_dtype else y.to(output_dtype)


# ---------------------------------------------------------------------------------------------
# Sub-operators: plain functions (flash-linear-attention's signatures), not differentiable.


def chunk_scaled_dot_kkt_fwd(k: Tensor, g: Optional[Tensor] = None, beta: Optional[Tensor] = None,
                             cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                             output_dtype: torch.dtype = torch.float32,
                             chunk_indices: Optional[Tensor] = None) -> Tensor:
    """Strictly lower ``beta_i (k_i . k_j) exp(g_i - g_j)`` per chunk: ``[B,T,HV,BT]``."""
    if beta is None:
        raise ValueError("fusedops: chunk_scaled_dot_kkt_fwd: beta is required")
    B, T = k.shape[:2]
    chunk_indices, _ = la.chunk_tables("chunk_scaled_dot_kkt_fwd", cu_seqlens, None, chunk_indices, chunk_size, T)
    A = torch.empty(B, T, beta.shape[2], chunk_size, dtype=output_dtype, device=k.device)
    _C.chunk_scaled_dot_kkt_fwd(context("chunk_scaled_dot_kkt", k), la.last_unit(k), la.last_unit(beta),
                                la.last_unit(g), A, cu_seqlens, chunk_indices, chunk_size)
    return A


def solve_tril(A: Tensor, cu_seqlens: Optional[Tensor] = None, chunk_indices: Optional[Tensor] = None,
               output_dtype: Optional[torch.dtype] = torch.float) -> Tensor:
    """``(I + A)^{-1}`` per chunk of a strictly lower ``[B,T,H,BT]`` A (BT in 16/32/64), in
    ``output_dtype`` (None: A's dtype)."""
    la.check_slots("solve_tril", dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices), output_dtype=output_dtype)
    if A.dim() != 4:
        raise ValueError(f"fusedops: solve_tril: A must have shape [B,T,H,BT], got {list(A.shape)}")
    if A.shape[-1] not in (16, 32, 64):
        raise ValueError(f"fusedops: solve_tril: A's last dimension (the chunk size BT) must be 16, 32 or 64, "
                         f"got {A.shape[-1]}")
    ci, _ = la.chunk_tables("solve_tril", cu_seqlens, None, chunk_indices, A.shape[-1], A.shape[1])
    Ai = torch.empty(A.shape, dtype=output_dtype or A.dtype, device=A.device)
    _C.solve_tril(context("solve_tril", A), la.last_unit(A), Ai, cu_seqlens, ci)
    return Ai


def recompute_w_u_fwd(k: Tensor, v: Tensor, beta: Tensor, A: Tensor, g: Optional[Tensor] = None,
                      cu_seqlens: Optional[Tensor] = None,
                      chunk_indices: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """``(w, u) = (A (beta exp(g) k), A (beta v))`` per chunk; w in k's dtype, u in v's."""
    B, T, HV = v.shape[:3]
    chunk_indices, _ = la.chunk_tables("recompute_w_u_fwd", cu_seqlens, None, chunk_indices, A.shape[-1], T)
    w = torch.empty(B, T, HV, k.shape[-1], dtype=k.dtype, device=k.device)
    u = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _C.recompute_w_u_fwd(context("recompute_w_u", k), la.last_unit(k), la.last_unit(v), la.last_unit(beta),
                         la.last_unit(A), la.last_unit(g), w, u, cu_seqlens, chunk_indices)
    return w, u


def prepare_wy_repr_bwd(k: Tensor, v: Tensor, beta: Tensor, A: Tensor, dw: Tensor, du: Tensor,
                        g: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                        chunk_indices: Optional[Tensor] = None):
    """Backward of :func:`recompute_w_u_fwd` and of the solve: ``(dk, dv, dbeta, dg or None)``
    (dk summed over each group of value heads)."""
    chunk_indices, _ = la.chunk_tables("prepare_wy_repr_bwd", cu_seqlens, None, chunk_indices, A.shape[-1],
                                       k.shape[1])
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    dbeta = torch.empty(beta.shape, dtype=beta.dtype, device=beta.device)
    dg = torch.empty(beta.shape, dtype=torch.float32, device=k.device) if g is not None else None
    _C.prepare_wy_repr_bwd(context("recompute_w_u", k), la.last_unit(k), la.last_unit(v), la.last_unit(beta),
                           la.last_unit(A), la.last_unit(g), la.last_unit(dw), la.last_unit(du), dk, dv, dbeta,
                           dg, cu_seqlens, chunk_indices, False)
    return dk, dv, dbeta, dg


def _gate(op: str, g: Optional[Tensor], g_gamma: Optional[Tensor], like: Tensor, chunk_size: int,
          cu_seqlens: Optional[Tensor]) -> Optional[Tensor]:
    """The chunk-local gate cumsum the kernels read: ``g`` itself, or from a fixed per-head log
    decay ``g_gamma [HV]`` (``g_gamma * (i+1)`` at position i of each chunk: the chunk-local
    cumsum of g_gamma repeated at every token)."""
    if g_gamma is None:
        return g
    if g is not None:
        la.fail(op, "g together with g_gamma is not supported; pass one gate, g (the chunk-local cumsum [B,T,HV]) "
                    "or g_gamma (a fixed decay [HV])", NotImplementedError)
    B, T, HV = like.shape[:3]
    if tuple(g_gamma.shape) != (HV,):
        la.fail(op, f"g_gamma must have shape [HV]=[{HV}], got {list(g_gamma.shape)}")
    per_token = g_gamma.to(la.acc_dtype(like)).expand(B, T, HV).contiguous()
    return chunk_local_cumsum(per_token, chunk_size, cu_seqlens=cu_seqlens, output_dtype=None)


def _scale(q: Tensor, scale: Optional[float]) -> float:
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def chunk_fwd_o(q: Tensor, k: Tensor, v: Tensor, h: Tensor, g: Optional[Tensor] = None,
                g_gamma: Optional[Tensor] = None, scale: Optional[float] = None, state_v_first: bool = False,
                cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``o = scale (diag(exp(g)) Q h[n] + (M>= . Gamma . Q K^T) v)`` per chunk (v = v_new; g the
    chunk-local cumsum in natural-log units, or the fixed decay ``g_gamma``; h ``[..., V, K]`` with
    ``state_v_first``)."""
    op = "chunk_fwd_o"
    la.check_slots(op, dict(g=g, g_gamma=g_gamma, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices),
                   dict(state_v_first=state_v_first), dict(scale=scale))
    ci, _ = la.chunk_tables(op, cu_seqlens, None, chunk_indices, chunk_size, q.shape[1])
    g = _gate(op, g, g_gamma, v, chunk_size, cu_seqlens)
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _C.chunk_fwd_o(context(op, q), la.last_unit(q), la.last_unit(k), la.last_unit(v),
                   la.dense_state(h, state_v_first), la.last_unit(g), o, cu_seqlens, ci,
                   _scale(q, scale), chunk_size)
    return o


def chunk_bwd_dv_local(q: Tensor, k: Tensor, do: Tensor, g: Optional[Tensor] = None,
                       g_gamma: Optional[Tensor] = None, A: Optional[Tensor] = None,
                       scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                       chunk_size: int = 64, chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``dv = scale (M>= . Gamma . Q K^T)^T dO`` per chunk. A precomputed attention matrix ``A``
    is not supported (pass q, k and the gate)."""
    op = "chunk_bwd_dv_local"
    la.check_slots(op, dict(g=g, g_gamma=g_gamma, A=A, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices),
                   numbers=dict(scale=scale))
    if A is not None:
        la.fail(op, "a precomputed attention matrix A is not supported; pass q, k and the gate (g or g_gamma) "
                    "with A=None", NotImplementedError)
    ci, _ = la.chunk_tables(op, cu_seqlens, None, chunk_indices, chunk_size, q.shape[1])
    g = _gate(op, g, g_gamma, do, chunk_size, cu_seqlens)
    dv = torch.empty(do.shape, dtype=do.dtype, device=do.device)
    _C.chunk_bwd_dv_local(context(op, q), la.last_unit(q), la.last_unit(k), la.last_unit(do),
                          la.last_unit(g), dv, cu_seqlens, ci, _scale(q, scale), chunk_size)
    return dv


def chunk_bwd_dqkwg(q: Tensor, k: Tensor, v: Tensor, do: Tensor, h: Tensor, dh: Tensor,
                    w: Optional[Tensor] = None, g: Optional[Tensor] = None, g_gamma: Optional[Tensor] = None,
                    dv: Optional[Tensor] = None, scale: Optional[float] = None, state_v_first: bool = False,
                    cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                    chunk_indices: Optional[Tensor] = None):
    """``(dq, dk, dw or None, dg or None)`` of block B4 (dq, dk summed over value-head groups; dg
    the partial gradient w.r.t. the chunk-local cumsum, None with ``g_gamma`` as in
    flash-linear-attention). ``dv`` (the total gradient of v_new) is required with ``w``."""
    op = "chunk_bwd_dqkwg"
    la.check_slots(op, dict(w=w, g=g, g_gamma=g_gamma, dv=dv, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices),
                   dict(state_v_first=state_v_first), dict(scale=scale))
    if w is not None and dv is None:
        la.fail(op, "dv (the total gradient of v_new) is required with w")
    ci, _ = la.chunk_tables(op, cu_seqlens, None, chunk_indices, chunk_size, q.shape[1])
    gate = _gate(op, g, g_gamma, v, chunk_size, cu_seqlens)
    if dv is None:
        dv = torch.zeros_like(v)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dw = torch.empty(*v.shape[:3], k.shape[-1], dtype=w.dtype, device=w.device) if w is not None else None
    dg = torch.empty(v.shape[:3], dtype=torch.float32, device=q.device) if gate is not None else None
    _C.chunk_bwd_dqkwg(context(op, q), la.last_unit(q), la.last_unit(k), la.last_unit(v),
                       la.last_unit(do), la.dense_state(h, state_v_first),
                       la.dense_state(dh, state_v_first), la.last_unit(w), la.last_unit(dv),
                       la.last_unit(gate), dq, dk, dw, dg, cu_seqlens, ci, _scale(q, scale), chunk_size)
    return dq, dk, dw, (dg if g is not None else None)
