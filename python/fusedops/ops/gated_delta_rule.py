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
"""

from __future__ import annotations

import threading
from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from .._op import DifferentiableOp, PlainOp

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
# Varlen indices


def _host_seqlens(cu_seqlens: Tensor, cu_seqlens_cpu: Optional[Tensor] = None) -> list[int]:
    cu = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens
    if cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"fusedops: cu_seqlens must be a rank-1 int32/int64 tensor, got "
                         f"{list(cu.shape)} {cu.dtype}")
    vals = cu.tolist()
    if not vals or vals[0] != 0:
        raise ValueError(f"fusedops: cu_seqlens must start at 0, got {vals[:1]}")
    for i in range(len(vals) - 1):
        if vals[i] > vals[i + 1]:
            raise ValueError(f"fusedops: cu_seqlens must be non-decreasing, got cu_seqlens[{i}]="
                             f"{vals[i]} > cu_seqlens[{i + 1}]={vals[i + 1]}")
    return vals


def _to_device(rows: list, like: Tensor) -> Tensor:
    """A table built on the host, on like's device in like's dtype. The copy waits for it to land
    (a pageable copy): only a first call with a cu_seqlens tensor makes it, and a table in place
    before the call returns cannot be read early by another stream."""
    return torch.tensor(rows, dtype=like.dtype).to(like.device)


def _chunk_indices(vals: list[int], chunk_size: int, like: Tensor) -> Tensor:
    rows = [(n, i) for n in range(len(vals) - 1) for i in range(-(-(vals[n + 1] - vals[n]) // chunk_size))]
    return _to_device(rows, like).reshape(-1, 2)


def _chunk_offsets(vals: list[int], chunk_size: int, like: Tensor) -> Tensor:
    offs = [0]
    for n in range(len(vals) - 1):
        offs.append(offs[-1] + -(-(vals[n + 1] - vals[n]) // chunk_size))
    return _to_device(offs, like)


def prepare_chunk_indices(cu_seqlens: Tensor, chunk_size: int,
                          cu_seqlens_cpu: Optional[Tensor] = None) -> Tensor:
    """``[NT, 2]`` rows ``(sequence, chunk within the sequence)`` in sequence order, in the dtype
    and on the device of ``cu_seqlens``."""
    return _chunk_indices(_host_seqlens(cu_seqlens, cu_seqlens_cpu), chunk_size, cu_seqlens)


def prepare_chunk_offsets(cu_seqlens: Tensor, chunk_size: int,
                          cu_seqlens_cpu: Optional[Tensor] = None) -> Tensor:
    """``[N+1]``: exclusive prefix sum of the per-sequence chunk counts."""
    return _chunk_offsets(_host_seqlens(cu_seqlens, cu_seqlens_cpu), chunk_size, cu_seqlens)


# The host values of cu_seqlens and the chunk tables built from them, kept per cu_seqlens tensor.
# Reading a CUDA tensor's values and copying a table to the GPU each synchronize the host with the
# GPU (four per chunk_gated_delta_rule call and four more in its backward, measured at 1.35 ms of
# host time per varlen forward on the H200 against 0.42 ms at a fixed length): the launches after
# them can no longer run ahead of the GPU. A model's layers share one cu_seqlens per step, so with
# the tables kept there is one synchronization per step, and a CUDA-graph capture after a warm-up
# call finds its tables without one. An entry holds its tensors (so that neither can be freed and
# its memory reused by another) and their version counters: an in-place change makes a new entry.
_SEQ_CACHE_SIZE = 16
_seq_cache: list = []  # [cu_seqlens, cu_seqlens_cpu, versions, values, {chunk_size: (indices, offsets)}]
_seq_lock = threading.Lock()


def _no_capture(cu_seqlens: Tensor) -> None:
    if cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("fusedops: cu_seqlens: its chunk tables are built on the host, which a CUDA-graph "
                           "capture cannot do; call the operator once with this cu_seqlens tensor (e.g. in "
                           "the warm-up before the capture) and do not change it in place afterwards")


def _seq_entry(cu_seqlens: Tensor, cu_seqlens_cpu: Optional[Tensor]) -> list:
    """The cache entry of this cu_seqlens (and cu_seqlens_cpu): its host values, read and checked
    once while the tensors are unchanged, and its chunk tables by chunk size. A tensor made under
    torch.inference_mode has no version counter to tell an in-place change: a fresh entry, not kept."""
    if cu_seqlens.is_inference() or (cu_seqlens_cpu is not None and cu_seqlens_cpu.is_inference()):
        return [cu_seqlens, cu_seqlens_cpu, None, _host_seqlens(cu_seqlens, cu_seqlens_cpu), {}]
    versions = (cu_seqlens._version, None if cu_seqlens_cpu is None else cu_seqlens_cpu._version)
    with _seq_lock:
        for i, entry in enumerate(_seq_cache):
            if entry[0] is cu_seqlens and entry[1] is cu_seqlens_cpu and entry[2] == versions:
                if i:
                    _seq_cache.insert(0, _seq_cache.pop(i))
                return entry
    _no_capture(cu_seqlens)
    entry = [cu_seqlens, cu_seqlens_cpu, versions, _host_seqlens(cu_seqlens, cu_seqlens_cpu), {}]
    with _seq_lock:
        _seq_cache.insert(0, entry)
        del _seq_cache[_SEQ_CACHE_SIZE:]
    return entry


def _seq_values(cu_seqlens: Tensor, cu_seqlens_cpu: Optional[Tensor], T: int) -> list[int]:
    """cu_seqlens' host values (kept), checked to cover the T packed tokens: on a GPU the kernels
    cannot check it, and a longer cu_seqlens would read past the inputs."""
    vals = _seq_entry(cu_seqlens, cu_seqlens_cpu)[3]
    if vals[-1] != T:
        raise ValueError(f"fusedops: cu_seqlens must end at T={T} (the packed length), got "
                         f"cu_seqlens[{len(vals) - 1}]={vals[-1]}")
    return vals


def _indices(cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], chunk_size: int, T: int):
    """(chunk indices, chunk offsets) of cu_seqlens at this chunk size, kept with its values."""
    if cu_seqlens is None:
        return None, None
    entry = _seq_entry(cu_seqlens, cu_seqlens_cpu)
    vals = _seq_values(cu_seqlens, cu_seqlens_cpu, T)
    tables = entry[4].get(chunk_size)
    if tables is None:
        _no_capture(cu_seqlens)
        tables = (_chunk_indices(vals, chunk_size, cu_seqlens), _chunk_offsets(vals, chunk_size, cu_seqlens))
        with _seq_lock:
            entry[4][chunk_size] = tables
    return tables


def _num_chunks(T: int, B: int, cu_seqlens: Optional[Tensor], chunk_size: int) -> tuple[int, int]:
    """(leading dim, NT) of the per-chunk state snapshots."""
    if cu_seqlens is None:
        return B, -(-T // chunk_size)
    vals = _seq_values(cu_seqlens, None, T)
    return 1, sum(-(-(vals[n + 1] - vals[n]) // chunk_size) for n in range(len(vals) - 1))


def _last_unit(t: Optional[Tensor]) -> Optional[Tensor]:
    """t when its last dimension has stride 1 (or size <= 1), else a contiguous copy."""
    if t is None:
        return None
    if t.dim() and t.size(-1) > 1 and t.stride(-1) != 1:
        return t.contiguous()
    return t


_tls = threading.local()


def _workspace(nbytes: int, device: torch.device) -> Tensor:
    """A uint8 scratch buffer of at least nbytes. On the CPU one buffer per thread is kept and
    reused (a fresh allocation would be zeroed and faulted in by the OS on every call: tens of
    milliseconds per call at the report's shapes); it holds nothing between calls. CUDA uses the
    caching allocator."""
    if device.type != "cpu":
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    buf = getattr(_tls, "workspace", None)
    if buf is None or buf.numel() < nbytes:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        _tls.workspace = buf
    return buf[:nbytes]


def _acc_dtype(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _empty(ref: Tensor) -> Tensor:
    return ref.new_empty(0)


# ---------------------------------------------------------------------------------------------
# chunk_gated_delta_rule


def _fwd_shapes(q, k, v, g, cu_seqlens, chunk_size):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return B, T, H, K, HV, V, N


_T13 = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
             Tensor]
_T8 = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
_T6 = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
_T3 = tuple[Tensor, Tensor, Tensor]


def _chunk_fwd_impl(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float,
               initial_state: Optional[Tensor], output_final_state: bool, use_qk_l2norm: bool,
               use_gate: bool, A_log: Optional[Tensor], dt_bias: Optional[Tensor],
               use_sigmoid: bool, allow_neg: bool, cu_seqlens: Optional[Tensor],
               cu_seqlens_cpu: Optional[Tensor], chunk_size: int, keep: bool) -> _T13:
    B, T, H, K, HV, V, N = _fwd_shapes(q, k, v, g, cu_seqlens, chunk_size)
    dev, acc = q.device, _acc_dtype(q)
    ci, co = _indices(cu_seqlens, cu_seqlens_cpu, chunk_size, q.shape[1])
    kept = _kept(q, v, B, T, HV, K, V, ci, chunk_size, cu_seqlens is not None) if keep else [_empty(q) for _ in range(4)]
    o = torch.empty(B, T, HV, V, dtype=q.dtype, device=dev)
    ht = torch.empty(N, HV, K, V, dtype=acc, device=dev) if output_final_state else _empty(q)
    if use_qk_l2norm:
        q, k = rows_view(q), rows_view(k)
        qn, kn = torch.empty(B, T, H, K, dtype=q.dtype, device=dev), torch.empty(B, T, H, K, dtype=q.dtype, device=dev)
        rq, rk = torch.empty(B, T, H, dtype=acc, device=dev), torch.empty(B, T, H, dtype=acc, device=dev)
    else:
        qn, kn, rq, rk = _empty(q), _empty(q), _empty(q), _empty(q)
    gc = torch.empty(B, T, HV, dtype=acc, device=dev)
    A = torch.empty(B, T, HV, chunk_size, dtype=k.dtype, device=dev)
    bs = torch.empty(B, T, HV, dtype=acc, device=dev) if use_sigmoid else _empty(q)
    ws = _workspace(_C.chunk_gated_delta_rule_fwd_workspace_size(q, v, cu_seqlens, ci, chunk_size, use_gate,
                                                                  kept[0] if keep else None), dev)
    g = rows_view(g) if use_gate else _last_unit(g)
    beta = rows_view(beta) if use_sigmoid else _last_unit(beta)
    opt = lambda t: t if t.numel() or t.dim() > 1 else None  # noqa: E731
    tensors = [_last_unit(q), _last_unit(k), _last_unit(v), g, beta, _last_unit(initial_state),
               A_log if use_gate else None, dt_bias if use_gate else None, cu_seqlens, ci, co,
               o, ht if output_final_state else None, opt(qn), opt(kn), opt(rq), opt(rk), gc, A,
               bs if use_sigmoid else None, ws, *(kept if keep else [None] * 4)]
    _C.chunk_gated_delta_rule_fwd(context(_OP, q), tensors, scale, chunk_size, use_qk_l2norm,
                                  use_gate, use_sigmoid, allow_neg)
    return (o, ht, qn, kn, rq, rk, gc, A, bs, *kept)


def _chunk_fwd_fake(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm,
                    use_gate, A_log, dt_bias, use_sigmoid, allow_neg, cu_seqlens, cu_seqlens_cpu,
                    chunk_size, keep):
    B, T, H, K, HV, V, N = _fwd_shapes(q, k, v, g, cu_seqlens, chunk_size)
    acc = _acc_dtype(q)
    o = q.new_empty(B, T, HV, V)
    ht = q.new_empty(N, HV, K, V, dtype=acc) if output_final_state else q.new_empty(0)
    if use_qk_l2norm:
        qn, kn = q.new_empty(B, T, H, K), q.new_empty(B, T, H, K)
        rq, rk = q.new_empty(B, T, H, dtype=acc), q.new_empty(B, T, H, dtype=acc)
    else:
        qn, kn, rq, rk = q.new_empty(0), q.new_empty(0), q.new_empty(0), q.new_empty(0)
    gc = q.new_empty(B, T, HV, dtype=acc)
    A = k.new_empty(B, T, HV, chunk_size)
    bs = q.new_empty(B, T, HV, dtype=acc) if use_sigmoid else q.new_empty(0)
    if keep:
        # h's chunk count is data-dependent with cu_seqlens (the fake cannot see the values).
        NT = (T + chunk_size - 1) // chunk_size if cu_seqlens is None else torch.library.get_ctx().new_dynamic_size()
        kept = [(q if i in (0, 2) else v).new_empty(s)
                for i, s in enumerate(_kept_shapes(B, T, HV, K, V, NT, cu_seqlens is not None))]
    else:
        kept = [q.new_empty(0) for _ in range(4)]
    return (o, ht, qn, kn, rq, rk, gc, A, bs, *kept)


def _kept_shapes(B, T, HV, K, V, NT, varlen) -> list:
    """The shapes of W (q's dtype), U (v's), the h snapshots (q's) and Vnew (v's)."""
    return [(B, T, HV, K), (B, T, HV, V), (1 if varlen else B, NT, HV, K, V), (B, T, HV, V)]


def _kept(q, v, B, T, HV, K, V, ci, chunk_size, varlen) -> list:
    """W, U, the h snapshots and Vnew, allocated for the forward to keep for the backward."""
    NT = ci.shape[0] if varlen else (T + chunk_size - 1) // chunk_size
    return [torch.empty(s, dtype=(q if i in (0, 2) else v).dtype, device=q.device)
            for i, s in enumerate(_kept_shapes(B, T, HV, K, V, NT, varlen))]


def _chunk_bwd_impl(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
               initial_state: Optional[Tensor], A_log: Optional[Tensor], dt_bias: Optional[Tensor],
               q_normed: Tensor, k_normed: Tensor, q_rstd: Tensor, k_rstd: Tensor, g_cumsum: Tensor,
               A: Tensor, beta_sigmoid: Tensor, cu_seqlens: Optional[Tensor],
               cu_seqlens_cpu: Optional[Tensor], dout: Tensor, dht: Optional[Tensor], scale: float,
               chunk_size: int, use_qk_l2norm: bool, use_gate: bool, use_sigmoid: bool,
               allow_neg: bool, w: Optional[Tensor], u: Optional[Tensor], h: Optional[Tensor],
               v_new: Optional[Tensor]) -> _T8:
    dev = q.device
    ci, co = _indices(cu_seqlens, cu_seqlens_cpu, chunk_size, q.shape[1])
    dout = _last_unit(dout)
    dq, dk, dv = torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)
    dg = torch.empty(g.shape, dtype=g.dtype, device=dev)
    dbeta = torch.empty(beta.shape, dtype=beta.dtype, device=dev)
    dh0 = torch.empty(initial_state.shape, dtype=initial_state.dtype, device=dev) \
        if initial_state is not None else _empty(q)
    dA = torch.empty(A_log.shape, dtype=A_log.dtype, device=dev) if use_gate else _empty(q)
    ddb = torch.empty(dt_bias.shape, dtype=dt_bias.dtype, device=dev) \
        if use_gate and dt_bias is not None else _empty(q)
    ws = _workspace(_C.chunk_gated_delta_rule_bwd_workspace_size(
        q, v, dout, cu_seqlens, ci, chunk_size, use_qk_l2norm, use_gate, use_sigmoid, w), dev)
    if use_qk_l2norm:
        q, k = rows_view(q), rows_view(k)
    g = rows_view(g) if use_gate else _last_unit(g)
    beta = rows_view(beta) if use_sigmoid else _last_unit(beta)
    opt = lambda t: t if t is not None and (t.numel() or t.dim() > 1) else None  # noqa: E731
    tensors = [_last_unit(q), _last_unit(k), _last_unit(v), g, beta, _last_unit(initial_state),
               A_log if use_gate else None, dt_bias if use_gate else None, opt(q_normed),
               opt(k_normed), opt(q_rstd), opt(k_rstd), g_cumsum, A,
               beta_sigmoid if use_sigmoid else None, cu_seqlens, ci, co, dout, _last_unit(dht),
               dq, dk, dv, dg, dbeta, dh0 if initial_state is not None else None,
               dA if use_gate else None, opt(ddb) if use_gate else None, ws, w, u, h, v_new]
    _C.chunk_gated_delta_rule_bwd(context(_OP, q), tensors, scale, chunk_size, use_qk_l2norm,
                                  use_gate, use_sigmoid, allow_neg)
    return dq, dk, dv, dg, dbeta, dh0, dA, ddb


def _chunk_bwd_fake(q, k, v, g, beta, initial_state, A_log, dt_bias, q_normed, k_normed, q_rstd,
                    k_rstd, g_cumsum, A, beta_sigmoid, cu_seqlens, cu_seqlens_cpu, dout, dht, scale,
                    chunk_size, use_qk_l2norm, use_gate, use_sigmoid, allow_neg, w, u, h, v_new):
    e = q.new_empty(0)
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format),
            g.new_empty(g.shape), beta.new_empty(beta.shape),
            initial_state.new_empty(initial_state.shape) if initial_state is not None else e,
            A_log.new_empty(A_log.shape) if use_gate else q.new_empty(0),
            dt_bias.new_empty(dt_bias.shape) if use_gate and dt_bias is not None else q.new_empty(0))


_chunk_bwd = PlainOp("chunk_gated_delta_rule_bwd", _chunk_bwd_impl, _chunk_bwd_fake)


def _chunk_setup(ctx, inputs, output):
    (q, k, v, g, beta, scale, h0, ofs, l2, gate, A_log, dt_bias, sig, neg, cu, cu_cpu, bt, keep) = inputs
    o, ht, qn, kn, rq, rk, gc, A, bs, w, u, h, vn = output
    ctx.flags = (scale, bt, l2, gate, sig, neg, keep)
    ctx.save_for_backward(q, k, v, g, beta, h0, A_log, dt_bias, qn, kn, rq, rk, gc, A, bs, cu, cu_cpu, w, u, h,
                          vn)
    ctx.mark_non_differentiable(qn, kn, rq, rk, gc, A, bs, w, u, h, vn)


def _chunk_backward(ctx, do, dht, *_unused):
    q, k, v, g, beta, h0, A_log, dt_bias, qn, kn, rq, rk, gc, A, bs, cu, cu_cpu, w, u, h, vn = ctx.saved_tensors
    scale, bt, l2, gate, sig, neg, keep = ctx.flags
    kept = (w, u, h, vn) if keep else (None,) * 4
    if do is None:
        do = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    if dht is not None and dht.numel() == 0:
        dht = None
    dq, dk, dv, dg, dbeta, dh0, dA, ddb = _chunk_bwd(
        q, k, v, g, beta, h0, A_log, dt_bias, qn, kn, rq, rk, gc, A, bs, cu, cu_cpu, do, dht,
        scale, bt, l2, gate, sig, neg, *kept)
    return (dq, dk, dv, dg, dbeta, None, dh0 if h0 is not None else None, None, None, None,
            dA if gate else None, ddb if gate and dt_bias is not None else None, None, None,
            None, None, None, None)


_chunk_fwd = DifferentiableOp("chunk_gated_delta_rule_fwd", _chunk_fwd_impl, _chunk_fwd_fake,
                              _chunk_setup, _chunk_backward)


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
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    *,
    chunk_size: int = 64,
    use_gate_in_kernel: bool = False,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    transpose_state_layout: Optional[bool] = None,
    keep_intermediates: Optional[bool] = None,
    cp=None,
    cp_context=None,
    **kwargs,
):
    """Chunked gated delta rule (flash-linear-attention's ``chunk_gated_delta_rule``).

    Per sequence and value head, with state ``S`` ([K,V], fp32, ``initial_state`` or 0)::

        S = exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S += k_t delta^T;  o_t = scale S^T q_t

    computed chunk by chunk (``chunk_size`` 16/32/64). q, k ``[B,T,H,K]``; v ``[B,T,HV,V]``
    (``HV % H == 0``); g, beta ``[B,T,HV]`` (g a per-step log decay, or the raw gate input with
    ``use_gate_in_kernel``: ``g = -exp(A_log) * softplus(g + dt_bias)``; beta in (0,1), or logits
    with ``use_beta_sigmoid_in_kernel``, times 2 with ``allow_neg_eigval``). ``cu_seqlens`` packs
    sequences along T (B == 1). ``use_qk_l2norm_in_kernel`` normalises q and k (eps 1e-6).
    Returns ``(o [B,T,HV,V] in q's dtype, final_state [N,HV,K,V] fp32 or None)``; differentiable
    in q, k, v, g, beta, initial_state, A_log and dt_bias. ``state_v_first`` stores states as
    ``[V,K]``. ``keep_intermediates``: when a gradient will be taken, keep W, U, the chunk states
    and Vnew from the forward instead of recomputing them in the backward (faster backward; saved
    memory grows by ~(3 + K*V/(chunk_size*K)) x the size of v, e.g. 5x at K=V=128, chunk 64).
    Default (None): on the CPU, not on CUDA (as flash-linear-attention, which recomputes).
    ``cp`` (alias ``cp_context``): a context-parallel plan (``fusedops.distributed``): the inputs
    are this rank's tokens; initial_state / final_state hold every global sequence.
    """
    if "head_first" in kwargs:
        raise DeprecationWarning(
            "fusedops: chunk_gated_delta_rule: head_first is removed; pass tensors in the "
            "[B,T,H,D] layout (seq-first)")
    if kwargs:
        raise TypeError(f"fusedops: chunk_gated_delta_rule: unexpected keyword arguments {sorted(kwargs)}")
    if transpose_state_layout is not None:
        if state_v_first:
            raise ValueError("fusedops: chunk_gated_delta_rule: pass state_v_first or its deprecated "
                             "alias transpose_state_layout, not both")
        state_v_first = bool(transpose_state_layout)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"fusedops: chunk_gated_delta_rule: {name} must have rank 4 ([B,T,H,D]), "
                             f"got shape {list(t.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError("fusedops: chunk_gated_delta_rule: q and k must have the same number of heads "
                         f"(q.shape[2] == k.shape[2]), got {q.shape[2]} and {k.shape[2]}")
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"fusedops: chunk_gated_delta_rule: chunk_size must be 16, 32 or 64, got {chunk_size}")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("fusedops: chunk_gated_delta_rule: allow_neg_eigval requires use_beta_sigmoid_in_kernel")
    if use_gate_in_kernel and A_log is None:
        raise ValueError("fusedops: chunk_gated_delta_rule: use_gate_in_kernel requires A_log")
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError("fusedops: chunk_gated_delta_rule: with cu_seqlens the batch size must be 1 "
                         f"(sequences are packed along T), got B={q.shape[0]}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if keep_intermediates is None:
        keep_intermediates = q.device.type == "cpu"
    grads = (q, k, v, g, beta, initial_state, A_log, dt_bias)
    keep = bool(keep_intermediates) and torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in grads)
    h0 = initial_state
    if h0 is not None and state_v_first:
        h0 = h0.transpose(-1, -2).contiguous()
    if cp is not None or cp_context is not None:
        from ..distributed._linear_attention import chunk_gated_delta_rule_cp
        o, ht = chunk_gated_delta_rule_cp(
            q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel, cp, cp_context,
            chunk_size=chunk_size, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
            keep_intermediates=keep_intermediates, cu_seqlens=cu_seqlens)
        return o, (ht.transpose(-1, -2) if ht is not None and state_v_first else ht)
    out = _chunk_fwd(q, k, v, g, beta, float(scale), h0, bool(output_final_state),
                     bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
                     A_log if use_gate_in_kernel else None, dt_bias if use_gate_in_kernel else None,
                     bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), cu_seqlens,
                     cu_seqlens_cpu, int(chunk_size), keep)
    o, ht = out[0], out[1]
    if not output_final_state:
        return o, None
    return o, (ht.transpose(-1, -2) if state_v_first else ht)


# ---------------------------------------------------------------------------------------------
# fused_recurrent_gated_delta_rule


def _rec_fwd_impl(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], beta: Optional[Tensor],
             scale: float, initial_state: Optional[Tensor], output_final_state: bool,
             cu_seqlens: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if cu_seqlens is not None:
        _seq_values(cu_seqlens, None, T)
    o = torch.empty(B, T, HV, V, dtype=q.dtype, device=q.device)
    ht = torch.empty(N, HV, K, V, dtype=_acc_dtype(q), device=q.device) if output_final_state else _empty(q)
    _C.fused_recurrent_gated_delta_rule_fwd(
        context(_OP_REC, q), _last_unit(q), _last_unit(k), _last_unit(v), _last_unit(g),
        _last_unit(beta), _last_unit(initial_state), cu_seqlens, scale, o,
        ht if output_final_state else None)
    return o, ht


def _rec_fwd_fake(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    ht = q.new_empty(N, HV, K, V, dtype=_acc_dtype(q)) if output_final_state else q.new_empty(0)
    return q.new_empty(B, T, HV, V), ht


def _rec_bwd_impl(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], beta: Optional[Tensor],
                  scale: float, initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
                  dout: Tensor, dht: Optional[Tensor]) -> _T6:
    dev = q.device
    dq = torch.empty(q.shape, dtype=q.dtype, device=dev)
    dk = torch.empty(k.shape, dtype=k.dtype, device=dev)
    dv = torch.empty(v.shape, dtype=v.dtype, device=dev)
    dg = torch.empty(g.shape, dtype=g.dtype, device=dev) if g is not None else _empty(q)
    db = torch.empty(beta.shape, dtype=beta.dtype, device=dev) if beta is not None else _empty(q)
    dh0 = torch.empty(initial_state.shape, dtype=initial_state.dtype, device=dev) \
        if initial_state is not None else _empty(q)
    _C.fused_recurrent_gated_delta_rule_bwd(
        context(_OP_REC, q), _last_unit(q), _last_unit(k), _last_unit(v), _last_unit(g),
        _last_unit(beta), _last_unit(initial_state), cu_seqlens, scale, _last_unit(dout),
        _last_unit(dht), dq, dk, dv, dg if g is not None else None,
        db if beta is not None else None, dh0 if initial_state is not None else None)
    return dq, dk, dv, dg, db, dh0


def _rec_bwd_fake(q, k, v, g, beta, scale, initial_state, cu_seqlens, dout, dht):
    e = q.new_empty(0)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            g.new_empty(g.shape) if g is not None else e,
            beta.new_empty(beta.shape) if beta is not None else q.new_empty(0),
            initial_state.new_empty(initial_state.shape) if initial_state is not None else q.new_empty(0))


_rec_bwd = PlainOp("fused_recurrent_gated_delta_rule_bwd", _rec_bwd_impl, _rec_bwd_fake)


def _rec_setup(ctx, inputs, output):
    q, k, v, g, beta, scale, h0, ofs, cu = inputs
    ctx.scale = scale
    ctx.save_for_backward(q, k, v, g, beta, h0, cu)


def _rec_backward(ctx, do, dht):
    q, k, v, g, beta, h0, cu = ctx.saved_tensors
    if do is None:
        do = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    if dht is not None and dht.numel() == 0:
        dht = None
    dq, dk, dv, dg, db, dh0 = _rec_bwd(q, k, v, g, beta, ctx.scale, h0, cu, do, dht)
    return (dq, dk, dv, dg if g is not None else None, db if beta is not None else None, None,
            dh0 if h0 is not None else None, None, None)


_rec_fwd = DifferentiableOp("fused_recurrent_gated_delta_rule_fwd", _rec_fwd_impl, _rec_fwd_fake,
                            _rec_setup, _rec_backward)


def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Optional[Tensor] = None,
    beta: Optional[Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    **kwargs,
):
    """The gated delta rule token by token (decoding; flash-linear-attention's
    ``fused_recurrent_gated_delta_rule``): same recurrence and layout as
    :func:`chunk_gated_delta_rule`, g and beta optional (no decay / beta = 1). Returns
    ``(o, final_state or None)``; differentiable in every tensor input. The backward recomputes
    the states from checkpoints every 64 tokens."""
    if "head_first" in kwargs:
        raise DeprecationWarning("fusedops: fused_recurrent_gated_delta_rule: head_first is removed; "
                                 "pass tensors in the [B,T,H,D] layout")
    if kwargs:
        raise TypeError(f"fusedops: fused_recurrent_gated_delta_rule: unexpected keyword arguments {sorted(kwargs)}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("fusedops: fused_recurrent_gated_delta_rule: q, k, v must have rank 4 ([B,T,H,D])")
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError("fusedops: fused_recurrent_gated_delta_rule: with cu_seqlens the batch size "
                         f"must be 1 (sequences are packed along T), got B={q.shape[0]}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if use_qk_l2norm_in_kernel:
        from .l2norm import l2norm
        q, k = l2norm(q, 1e-6), l2norm(k, 1e-6)
    o, ht = _rec_fwd(q, k, v, g, beta, float(scale), initial_state, bool(output_final_state), cu_seqlens)
    return o, (ht if output_final_state else None)


# ---------------------------------------------------------------------------------------------
# fused_gdn_gate (section 11)


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
    db = torch.empty(dt_bias.shape, dtype=dt_bias.dtype, device=g.device) if dt_bias is not None else _empty(g)
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


def fused_gdn_gate(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor] = None) -> Tensor:
    """``-exp(A_log) * softplus(g + dt_bias)`` over the last dimension HV (fp32 out);
    differentiable in g, A_log and dt_bias."""
    return _gate_fwd(g, A_log, dt_bias)


def gdn_gate_fwd(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor] = None) -> Tensor:
    """Launcher form of the GDN gate forward (fp32 out)."""
    return _gate_fwd(g, A_log, dt_bias)


def gdn_gate_bwd(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor], dy: Tensor):
    """Launcher form of the GDN gate backward: ``(dg, dA_log, ddt_bias or None)``."""
    dg, dA, db = _gate_bwd(g, A_log, dt_bias, dy)
    return dg, dA, (db if dt_bias is not None else None)


# ---------------------------------------------------------------------------------------------
# Sub-operators: plain functions (flash-linear-attention's signatures), not differentiable.


def _ctx(op: str, t: Tensor):
    return context(op, t)


def chunk_local_cumsum(g: Tensor, chunk_size: int, reverse: bool = False, scale: Optional[float] = None,
                       cu_seqlens: Optional[Tensor] = None, head_first: bool = False,
                       output_dtype: Optional[torch.dtype] = torch.float,
                       chunk_indices: Optional[Tensor] = None) -> Tensor:
    """Chunk-local cumsum of a scalar ``[B,T,H]`` or vector ``[B,T,H,S]`` gate; ``reverse`` is a
    true suffix sum; ``scale`` multiplies after the sum; ``output_dtype=None`` keeps g's dtype."""
    if head_first:
        raise DeprecationWarning("fusedops: chunk_local_cumsum: head_first is removed")
    if g.dim() not in (3, 4):
        raise ValueError(f"fusedops: chunk_local_cumsum: g must have rank 3 ([B,T,H], scalar gate) or 4 "
                         f"([B,T,H,S], vector gate), got rank {g.dim()}")
    if chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"fusedops: chunk_local_cumsum: chunk_size must be a power of 2, got {chunk_size}")
    if cu_seqlens is not None and chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, chunk_size)
    out = torch.empty(g.shape, dtype=output_dtype or g.dtype, device=g.device)
    _C.chunk_local_cumsum(_ctx("chunk_local_cumsum", g), _last_unit(g), out, cu_seqlens, chunk_indices,
                          chunk_size, reverse, 1.0 if scale is None else float(scale))
    return out


def chunk_scaled_dot_kkt_fwd(k: Tensor, g: Optional[Tensor] = None, beta: Optional[Tensor] = None,
                             cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                             output_dtype: torch.dtype = torch.float32,
                             chunk_indices: Optional[Tensor] = None) -> Tensor:
    """Strictly lower ``beta_i (k_i . k_j) exp(g_i - g_j)`` per chunk: ``[B,T,HV,BT]``."""
    if beta is None:
        raise ValueError("fusedops: chunk_scaled_dot_kkt_fwd: beta is required")
    if cu_seqlens is not None and chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, chunk_size)
    B, T = k.shape[:2]
    A = torch.empty(B, T, beta.shape[2], chunk_size, dtype=output_dtype, device=k.device)
    _C.chunk_scaled_dot_kkt_fwd(_ctx("chunk_scaled_dot_kkt", k), _last_unit(k), _last_unit(beta),
                                _last_unit(g), A, cu_seqlens, chunk_indices, chunk_size)
    return A


def solve_tril(A: Tensor, cu_seqlens: Optional[Tensor] = None, output_dtype: torch.dtype = torch.float,
               chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``(I + A)^{-1}`` per chunk of a strictly lower ``[B,T,H,BT]`` A (BT in 16/32/64)."""
    if A.dim() == 4 and cu_seqlens is not None and chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, A.shape[-1])
    Ai = torch.empty(A.shape, dtype=output_dtype, device=A.device)
    _C.solve_tril(_ctx("solve_tril", A), _last_unit(A), Ai, cu_seqlens, chunk_indices)
    return Ai


def recompute_w_u_fwd(k: Tensor, v: Tensor, beta: Tensor, A: Tensor, g: Optional[Tensor] = None,
                      cu_seqlens: Optional[Tensor] = None,
                      chunk_indices: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """``(w, u) = (A (beta exp(g) k), A (beta v))`` per chunk; w in k's dtype, u in v's."""
    if cu_seqlens is not None and chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, A.shape[-1])
    B, T, HV = v.shape[:3]
    w = torch.empty(B, T, HV, k.shape[-1], dtype=k.dtype, device=k.device)
    u = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _C.recompute_w_u_fwd(_ctx("recompute_w_u", k), _last_unit(k), _last_unit(v), _last_unit(beta),
                         _last_unit(A), _last_unit(g), w, u, cu_seqlens, chunk_indices)
    return w, u


def prepare_wy_repr_bwd(k: Tensor, v: Tensor, beta: Tensor, A: Tensor, dw: Tensor, du: Tensor,
                        g: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                        chunk_indices: Optional[Tensor] = None):
    """Backward of :func:`recompute_w_u_fwd` and of the solve: ``(dk, dv, dbeta, dg or None)``
    (dk summed over each group of value heads)."""
    if cu_seqlens is not None and chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, A.shape[-1])
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    dbeta = torch.empty(beta.shape, dtype=beta.dtype, device=beta.device)
    dg = torch.empty(beta.shape, dtype=torch.float32, device=k.device) if g is not None else None
    _C.prepare_wy_repr_bwd(_ctx("recompute_w_u", k), _last_unit(k), _last_unit(v), _last_unit(beta),
                           _last_unit(A), _last_unit(g), _last_unit(dw), _last_unit(du), dk, dv, dbeta,
                           dg, cu_seqlens, chunk_indices, False)
    return dk, dv, dbeta, dg


def chunk_gated_delta_rule_fwd_h(k: Tensor, w: Tensor, u: Tensor, g: Optional[Tensor] = None,
                                 gk: Optional[Tensor] = None, initial_state: Optional[Tensor] = None,
                                 output_final_state: bool = False, chunk_size: int = 64,
                                 save_new_value: bool = True, cu_seqlens: Optional[Tensor] = None,
                                 chunk_offsets: Optional[Tensor] = None):
    """The inter-chunk state recurrence: ``(h [B,NT,HV,K,V], v_new or None, final_state or None)``."""
    B, T = k.shape[:2]
    HV, K, V = u.shape[2], k.shape[3], u.shape[3]
    lead, NT = _num_chunks(T, B, cu_seqlens, chunk_size)
    if cu_seqlens is not None and chunk_offsets is None:
        chunk_offsets = prepare_chunk_offsets(cu_seqlens, chunk_size)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    h = torch.empty(lead, NT, HV, K, V, dtype=k.dtype, device=k.device)
    vn = torch.empty(u.shape, dtype=u.dtype, device=u.device) if save_new_value else None
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=k.device) if output_final_state else None
    _C.chunk_gated_delta_rule_fwd_h(_ctx("chunk_gated_delta_rule_fwd_h", k), _last_unit(k), _last_unit(w),
                                    _last_unit(u), _last_unit(g), _last_unit(gk),
                                    _last_unit(initial_state), h, vn, ht, cu_seqlens, chunk_offsets,
                                    chunk_size)
    return h, vn, ht


def chunk_gated_delta_rule_bwd_dhu(q: Tensor, k: Tensor, w: Tensor, do: Tensor, dv: Tensor,
                                   g: Optional[Tensor] = None, gk: Optional[Tensor] = None,
                                   h0: Optional[Tensor] = None, dht: Optional[Tensor] = None,
                                   scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                                   chunk_size: int = 64, chunk_offsets: Optional[Tensor] = None):
    """Reverse state-gradient recurrence: ``(dh [B,NT,HV,K,V], dh0 or None, dv2)``; dh0 is
    produced when ``h0`` is given."""
    B, T = q.shape[:2]
    HV, K, V = do.shape[2], q.shape[3], do.shape[3]
    lead, NT = _num_chunks(T, B, cu_seqlens, chunk_size)
    if cu_seqlens is not None and chunk_offsets is None:
        chunk_offsets = prepare_chunk_offsets(cu_seqlens, chunk_size)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    dh = torch.empty(lead, NT, HV, K, V, dtype=q.dtype, device=q.device)
    dh0 = torch.empty(N, HV, K, V, dtype=torch.float32, device=q.device) if h0 is not None else None
    dv2 = torch.empty(dv.shape, dtype=dv.dtype, device=dv.device)
    _C.chunk_gated_delta_rule_bwd_dhu(_ctx("chunk_gated_delta_rule_bwd_dhu", q), _last_unit(q), _last_unit(k),
                                      _last_unit(w), _last_unit(do), _last_unit(dv), _last_unit(g),
                                      _last_unit(gk), _last_unit(dht), dh, dh0, dv2, cu_seqlens,
                                      chunk_offsets, K ** -0.5 if scale is None else float(scale),
                                      chunk_size)
    return dh, dh0, dv2


def chunk_fwd_o(q: Tensor, k: Tensor, v: Tensor, h: Tensor, g: Optional[Tensor] = None,
                scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                chunk_size: int = 64, chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``o = scale (diag(exp(g)) Q h[n] + (M>= . Gamma . Q K^T) v)`` per chunk (v = v_new)."""
    if cu_seqlens is not None and chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, chunk_size)
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _C.chunk_fwd_o(_ctx("chunk_fwd_o", q), _last_unit(q), _last_unit(k), _last_unit(v), _last_unit(h),
                   _last_unit(g), o, cu_seqlens, chunk_indices,
                   q.shape[-1] ** -0.5 if scale is None else float(scale), chunk_size)
    return o


def chunk_bwd_dv_local(q: Tensor, k: Tensor, do: Tensor, g: Optional[Tensor] = None,
                       scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                       chunk_size: int = 64, chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``dv = scale (M>= . Gamma . Q K^T)^T dO`` per chunk."""
    if cu_seqlens is not None and chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, chunk_size)
    dv = torch.empty(do.shape, dtype=do.dtype, device=do.device)
    _C.chunk_bwd_dv_local(_ctx("chunk_bwd_dv_local", q), _last_unit(q), _last_unit(k), _last_unit(do),
                          _last_unit(g), dv, cu_seqlens, chunk_indices,
                          q.shape[-1] ** -0.5 if scale is None else float(scale), chunk_size)
    return dv


def chunk_bwd_dqkwg(q: Tensor, k: Tensor, v: Tensor, do: Tensor, h: Tensor, dh: Tensor,
                    w: Optional[Tensor] = None, g: Optional[Tensor] = None, dv: Optional[Tensor] = None,
                    scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                    chunk_size: int = 64, chunk_indices: Optional[Tensor] = None):
    """``(dq, dk, dw or None, dg or None)`` of block B4 (dq, dk summed over value-head groups; dg
    the partial gradient w.r.t. the chunk-local cumsum)."""
    if dv is None:
        raise ValueError("fusedops: chunk_bwd_dqkwg: dv (the total gradient of v_new) is required")
    if cu_seqlens is not None and chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, chunk_size)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dw = torch.empty(*v.shape[:3], k.shape[-1], dtype=w.dtype, device=w.device) if w is not None else None
    dg = torch.empty(v.shape[:3], dtype=torch.float32, device=q.device) if g is not None else None
    _C.chunk_bwd_dqkwg(_ctx("chunk_bwd_dqkwg", q), _last_unit(q), _last_unit(k), _last_unit(v),
                       _last_unit(do), _last_unit(h), _last_unit(dh), _last_unit(w), _last_unit(dv),
                       _last_unit(g), dq, dk, dw, dg, cu_seqlens, chunk_indices,
                       q.shape[-1] ** -0.5 if scale is None else float(scale), chunk_size)
    return dq, dk, dw, dg

