"""The plumbing both linear-attention families (gated_delta_rule.py, kda.py) share: the varlen
chunk tables built from cu_seqlens (checked and kept per cu_seqlens tensor), the workspace, the
custom-op bodies of the chunked top levels (buffers, the tensor list the C++ core takes, the
autograd glue) and of the per-token forms, and the sub-operators both pipelines run
(chunk_local_cumsum, chunk_gated_delta_rule_fwd_h / _bwd_dhu). Each family keeps its public
functions, its own saved tensors and gate, and the custom-op signatures built on these helpers.
"""

from __future__ import annotations

import inspect
import threading
from typing import Callable, Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from .._op import DifferentiableOp, PlainOp

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


def _check_chunk_size(op: str, chunk_size: int) -> None:
    if chunk_size < 1:
        raise ValueError(f"fusedops: {op}: chunk_size must be >= 1, got {chunk_size}")


def prepare_chunk_indices(cu_seqlens: Tensor, chunk_size: int,
                          cu_seqlens_cpu: Optional[Tensor] = None) -> Tensor:
    """``[NT, 2]`` rows ``(sequence, chunk within the sequence)`` in sequence order, in the dtype
    and on the device of ``cu_seqlens``."""
    _check_chunk_size("prepare_chunk_indices", chunk_size)
    return _chunk_indices(_host_seqlens(cu_seqlens, cu_seqlens_cpu), chunk_size, cu_seqlens)


def prepare_chunk_offsets(cu_seqlens: Tensor, chunk_size: int,
                          cu_seqlens_cpu: Optional[Tensor] = None) -> Tensor:
    """``[N+1]``: exclusive prefix sum of the per-sequence chunk counts."""
    _check_chunk_size("prepare_chunk_offsets", chunk_size)
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


def seq_values(cu_seqlens: Tensor, cu_seqlens_cpu: Optional[Tensor], T: int) -> list[int]:
    """cu_seqlens' host values (kept), checked to cover the T packed tokens: on a GPU the kernels
    cannot check it, and a longer cu_seqlens would read past the inputs."""
    vals = _seq_entry(cu_seqlens, cu_seqlens_cpu)[3]
    if vals[-1] != T:
        raise ValueError(f"fusedops: cu_seqlens must end at T={T} (the packed length), got "
                         f"cu_seqlens[{len(vals) - 1}]={vals[-1]}")
    return vals


def indices(cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], chunk_size: int, T: int):
    """(chunk indices, chunk offsets) of cu_seqlens at this chunk size, kept with its values."""
    if cu_seqlens is None:
        return None, None
    entry = _seq_entry(cu_seqlens, cu_seqlens_cpu)
    vals = seq_values(cu_seqlens, cu_seqlens_cpu, T)
    tables = entry[4].get(chunk_size)
    if tables is None:
        _no_capture(cu_seqlens)
        tables = (_chunk_indices(vals, chunk_size, cu_seqlens), _chunk_offsets(vals, chunk_size, cu_seqlens))
        with _seq_lock:
            entry[4][chunk_size] = tables
    return tables


def num_chunks(T: int, B: int, cu_seqlens: Optional[Tensor], chunk_size: int) -> tuple[int, int]:
    """(leading dim, NT) of the per-chunk state snapshots."""
    if cu_seqlens is None:
        return B, -(-T // chunk_size)
    vals = seq_values(cu_seqlens, None, T)
    return 1, sum(-(-(vals[n + 1] - vals[n]) // chunk_size) for n in range(len(vals) - 1))


def last_unit(t: Optional[Tensor]) -> Optional[Tensor]:
    """t when its last dimension has stride 1 (or size <= 1), else a contiguous copy."""
    if t is None:
        return None
    if t.dim() and t.size(-1) > 1 and t.stride(-1) != 1:
        return t.contiguous()
    return t


_tls = threading.local()


def workspace(nbytes: int, device: torch.device) -> Tensor:
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


def acc_dtype(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def empty(ref: Tensor) -> Tensor:
    return ref.new_empty(0)


def opt(t: Optional[Tensor]) -> Optional[Tensor]:
    """None for the 0-element placeholders that stand for absent tensors."""
    return t if t is not None and (t.numel() or t.dim() > 1) else None


def chunk_count(T: int, chunk_size: int) -> int:
    return (T + chunk_size - 1) // chunk_size


# ---------------------------------------------------------------------------------------------
# Shared argument handling of the public functions.


def fail(op: str, msg: str, exc=ValueError):
    raise exc(f"fusedops: {op}: {msg}")


def reject_kwargs(op: str, kwargs: dict) -> None:
    """flash-linear-attention's removed head_first, then any other unknown keyword."""
    if "head_first" in kwargs:
        raise DeprecationWarning(f"fusedops: {op}: head_first is removed; pass tensors in the [B,T,H,D] "
                                 "layout (seq-first)")
    if kwargs:
        fail(op, f"unexpected keyword arguments {sorted(kwargs)}", TypeError)


def state_layout(op: str, state_v_first: bool, transpose_state_layout: Optional[bool]) -> bool:
    """Whether states are [V,K] (state_v_first, or its deprecated alias transpose_state_layout)."""
    if transpose_state_layout is not None:
        if state_v_first:
            fail(op, "pass state_v_first or its deprecated alias transpose_state_layout, not both")
        return bool(transpose_state_layout)
    return bool(state_v_first)


_ORDER = ("flash-linear-attention 0.6.0's positional order, fusedops' since 0.1.0; pass the arguments after "
          "beta by keyword")


def check_slots(op: str, tensors: Optional[dict] = None, flags: Optional[dict] = None,
                numbers: Optional[dict] = None, output_dtype=None) -> None:
    """The type of each argument in a slot that moved with the switch to flash-linear-attention's
    positional order, so that a call in fusedops' former order fails with a TypeError naming the
    order instead of running with its arguments in other roles: ``tensors`` a tensor or None,
    ``flags`` a truth value (not a tensor, dtype, string, float or int other than 0/1),
    ``numbers`` a number (not a bool) or None, ``output_dtype`` a torch.dtype or None."""
    for name, t in (tensors or {}).items():
        if t is not None and not isinstance(t, Tensor):
            fail(op, f"{name} must be a tensor or None, got {type(t).__name__} ({_ORDER})", TypeError)
    for name, f in (flags or {}).items():  # truth values (None, numpy bools, 0/1 pass), not data
        if isinstance(f, (Tensor, torch.dtype, str, float)) or (type(f) is int and f not in (0, 1)):
            fail(op, f"{name} must be a bool, got {type(f).__name__} ({_ORDER})", TypeError)
    for name, x in (numbers or {}).items():
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))
                              and not (isinstance(x, Tensor) and x.numel() == 1)):
            fail(op, f"{name} must be a number or None, got {type(x).__name__} ({_ORDER})", TypeError)
    if output_dtype is not None and not isinstance(output_dtype, torch.dtype):
        fail(op, f"output_dtype must be a torch.dtype or None, got {type(output_dtype).__name__} ({_ORDER})",
             TypeError)


def check_rank4(op: str, q: Tensor, k: Tensor, v: Tensor) -> None:
    check_rank4_of(op, q=q, k=k, v=v)


def check_rank4_of(op: str, **tensors: Optional[Tensor]) -> None:
    """Each given [B,T,H,D] tensor has rank 4 (before a shape is read from it)."""
    for name, t in tensors.items():
        if t is not None and t.dim() != 4:
            fail(op, f"{name} must have rank 4 ([B,T,H,D]), got shape {list(t.shape)}")


def check_packed(op: str, q: Tensor, cu_seqlens: Optional[Tensor]) -> None:
    if cu_seqlens is not None and q.shape[0] != 1:
        fail(op, f"with cu_seqlens the batch size must be 1 (sequences are packed along T), got B={q.shape[0]}")


def state_in(initial_state: Optional[Tensor], state_v_first: bool) -> Optional[Tensor]:
    """The initial state in the core's [K,V] layout."""
    if initial_state is not None and state_v_first:
        return initial_state.transpose(-1, -2).contiguous()
    return initial_state


def state_out(o: Tensor, ht: Tensor, output_final_state: bool, state_v_first: bool):
    """The public (o, final_state or None) in the caller's state layout."""
    if not output_final_state:
        return o, None
    return o, (ht.transpose(-1, -2) if state_v_first else ht)


# ---------------------------------------------------------------------------------------------
# The chunked top levels' custom ops. A family's forward op takes the shared inputs (FWD_INPUTS)
# then its own (ChunkFamily.extra), and returns the shared outputs (o, final_state, q_normed,
# k_normed, q_rstd, k_rstd, g_cumsum, beta_sigmoid; 0-element placeholders for the absent ones)
# then its saved tensors (ChunkFamily.saved). Its backward op takes BWD_INPUTS, then the saved
# tensors and the flags of ChunkFamily.bwd_extra, and returns (dq, dk, dv, dg, dbeta, dh0, dA_log,
# ddt_bias). The C++ core takes the same tensors as one list (python/src/bind_linear_attention.h).

FWD_INPUTS = (("q", Tensor), ("k", Tensor), ("v", Tensor), ("g", Tensor), ("beta", Tensor), ("scale", float),
              ("initial_state", Optional[Tensor]), ("output_final_state", bool), ("use_qk_l2norm", bool),
              ("use_gate", bool), ("A_log", Optional[Tensor]), ("dt_bias", Optional[Tensor]),
              ("use_sigmoid", bool), ("allow_neg", bool), ("cu_seqlens", Optional[Tensor]),
              ("cu_seqlens_cpu", Optional[Tensor]), ("chunk_size", int))
SAVED = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias", "q_normed", "k_normed", "q_rstd",
         "k_rstd", "g_cumsum", "beta_sigmoid", "cu_seqlens", "cu_seqlens_cpu")
BWD_INPUTS = tuple((n, Optional[Tensor] if n in ("initial_state", "A_log", "dt_bias", "cu_seqlens", "cu_seqlens_cpu")
                    else Tensor) for n in SAVED) + (
    ("dout", Tensor), ("dht", Optional[Tensor]), ("scale", float), ("chunk_size", int), ("use_qk_l2norm", bool),
    ("use_gate", bool), ("use_sigmoid", bool), ("allow_neg", bool))
BWD_NAMES = tuple(n for n, _ in BWD_INPUTS)


class Call:
    """A forward call's shared inputs by name (FWD_INPUTS), and its sizes."""

    __slots__ = tuple(n for n, _ in FWD_INPUTS) + ("B", "T", "H", "K", "HV", "V", "N", "flags")

    def __init__(self, args):
        (self.q, self.k, self.v, self.g, self.beta, self.scale, self.initial_state, self.output_final_state,
         self.use_qk_l2norm, self.use_gate, self.A_log, self.dt_bias, self.use_sigmoid, self.allow_neg,
         self.cu_seqlens, self.cu_seqlens_cpu, self.chunk_size) = args
        self.B, self.T, self.H, self.K = self.q.shape
        self.HV, self.V = self.v.shape[2], self.v.shape[3]
        self.N = self.B if self.cu_seqlens is None else self.cu_seqlens.shape[0] - 1
        self.flags = (self.scale, self.chunk_size, self.use_qk_l2norm, self.use_gate, self.use_sigmoid,
                      self.allow_neg)


class ChunkFamily:
    """What a family adds to the shared chunked top level (see the section's comment)."""

    name: str  # the op: chunk_gated_delta_rule, chunk_kda
    extra: tuple = ()  # the forward op's own inputs, (name, type) pairs
    saved: tuple = ()  # the names of its saved tensors (outputs of the forward op)
    bwd_extra: tuple = ()  # the backward op's own flags, (name, type) pairs
    gate_rows = False  # g must have addressable rows with the gate in the kernel (rows_view)

    def allocate(self, c: Call, extra: tuple, nt: Callable[[], int]) -> list:
        """The saved tensors (nt(): the snapshot tensors' second dimension NT)."""
        raise NotImplementedError

    def kept(self, saved: list) -> Optional[Tensor]:
        """W when the forward keeps W, U, h and Vnew (the workspace-size functions' w)."""
        return None

    def forward_flags(self, extra: tuple) -> tuple:
        return ()

    def backward_inputs(self, saved: tuple, extra: tuple) -> tuple:
        """The backward op's own arguments (its saved tensors then bwd_extra) from the forward's."""
        return (*saved, *self.forward_flags(extra))


def _signature(fn, params, returns):
    P = inspect.Parameter
    fn.__signature__ = inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD, annotation=t) for n, t in params],
                                         return_annotation=returns)
    return fn


def _forward_outputs(c: Call) -> list:
    q, acc = c.q, acc_dtype(c.q)
    o = q.new_empty(c.B, c.T, c.HV, c.V)
    ht = q.new_empty(c.N, c.HV, c.K, c.V, dtype=acc) if c.output_final_state else q.new_empty(0)
    if c.use_qk_l2norm:
        qn, kn = q.new_empty(c.B, c.T, c.H, c.K), q.new_empty(c.B, c.T, c.H, c.K)
        rq, rk = q.new_empty(c.B, c.T, c.H, dtype=acc), q.new_empty(c.B, c.T, c.H, dtype=acc)
    else:
        qn, kn, rq, rk = q.new_empty(0), q.new_empty(0), q.new_empty(0), q.new_empty(0)
    # The gate cumsum is float64 on the CPU: its backends take in-chunk differences of it in double,
    # exact for any gate (an fp32 cumsum carries half an ulp of its magnitude into each difference).
    gc = q.new_empty(c.g.shape, dtype=torch.float64 if q.is_cpu else acc)
    bs = q.new_empty(c.B, c.T, c.HV, dtype=acc) if c.use_sigmoid else q.new_empty(0)
    return [o, ht, qn, kn, rq, rk, gc, bs]


def _grads(q, k, v, g, beta, initial_state, A_log, dt_bias, use_gate) -> list:
    """dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias (placeholders for the absent ones)."""
    return [q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), g.new_empty(g.shape),
            beta.new_empty(beta.shape),
            initial_state.new_empty(initial_state.shape) if initial_state is not None else q.new_empty(0),
            A_log.new_empty(A_log.shape) if use_gate and A_log is not None else q.new_empty(0),
            dt_bias.new_empty(dt_bias.shape) if use_gate and dt_bias is not None else q.new_empty(0)]


def chunk_op(family: ChunkFamily) -> DifferentiableOp:
    """The family's differentiable forward op (called with FWD_INPUTS then family.extra), with its
    backward op as the attribute bwd (called with BWD_INPUTS, the saved tensors, then
    family.bwd_extra: ChunkFamily.backward_inputs)."""
    op, n_in = family.name, len(FWD_INPUTS)
    c_fwd, c_bwd = getattr(_C, op + "_fwd"), getattr(_C, op + "_bwd")
    fwd_size, bwd_size = getattr(_C, op + "_fwd_workspace_size"), getattr(_C, op + "_bwd_workspace_size")
    n_out = 8 + len(family.saved)

    def fwd_impl(*args):
        c, extra = Call(args[:n_in]), args[n_in:]
        ci, co = indices(c.cu_seqlens, c.cu_seqlens_cpu, c.chunk_size, c.T)
        outs = _forward_outputs(c)
        saved = family.allocate(c, extra, lambda: ci.shape[0] if ci is not None else chunk_count(c.T, c.chunk_size))
        ws = workspace(fwd_size(c.q, c.v, c.cu_seqlens, ci, c.chunk_size, c.use_gate, family.kept(saved)), c.q.device)
        q, k, beta, g = c.q, c.k, c.beta, c.g
        if c.use_qk_l2norm:
            q, k = rows_view(q), rows_view(k)
        if c.use_sigmoid:
            beta = rows_view(beta)
        if c.use_gate and family.gate_rows:
            g = rows_view(g)
        o, ht, qn, kn, rq, rk, gc, bs = outs
        tensors = [last_unit(q), last_unit(k), last_unit(c.v), last_unit(g), last_unit(beta),
                   dense_state(c.initial_state), c.A_log if c.use_gate else None, c.dt_bias if c.use_gate else None,
                   c.cu_seqlens, ci, co, o, ht if c.output_final_state else None, opt(qn), opt(kn), opt(rq),
                   opt(rk), gc, bs if c.use_sigmoid else None, ws, *[opt(t) for t in saved]]
        c_fwd(context(op, c.q), tensors, c.flags, *family.forward_flags(extra))
        return (*outs, *saved)

    def fwd_fake(*args):
        c, extra = Call(args[:n_in]), args[n_in:]
        # The snapshot count is data-dependent with cu_seqlens (the fake cannot see the values).
        nt = (lambda: chunk_count(c.T, c.chunk_size)) if c.cu_seqlens is None else \
            (lambda: torch.library.get_ctx().new_dynamic_size())
        return (*_forward_outputs(c), *family.allocate(c, extra, nt))

    def bwd_impl(q, k, v, g, beta, initial_state, A_log, dt_bias, q_normed, k_normed, q_rstd, k_rstd, g_cumsum,
                 beta_sigmoid, cu_seqlens, cu_seqlens_cpu, dout, dht, scale, chunk_size, use_qk_l2norm, use_gate,
                 use_sigmoid, allow_neg, *own):
        saved, flags = own[:len(family.saved)], own[len(family.saved):]
        ci, co = indices(cu_seqlens, cu_seqlens_cpu, chunk_size, q.shape[1])
        dout = last_unit(dout)
        grads = _grads(q, k, v, g, beta, initial_state, A_log, dt_bias, use_gate)
        ws = workspace(bwd_size(q, v, dout, cu_seqlens, ci, chunk_size, use_qk_l2norm, use_gate, use_sigmoid,
                                family.kept(list(saved))), q.device)
        if use_qk_l2norm:
            q, k = rows_view(q), rows_view(k)
        if use_sigmoid:
            beta = rows_view(beta)
        if use_gate and family.gate_rows:
            g = rows_view(g)
        dq, dk, dv, dg, dbeta, dh0, dA, ddb = grads
        tensors = [last_unit(q), last_unit(k), last_unit(v), last_unit(g), last_unit(beta), dense_state(initial_state),
                   A_log if use_gate else None, dt_bias if use_gate else None, opt(q_normed), opt(k_normed),
                   opt(q_rstd), opt(k_rstd), g_cumsum, beta_sigmoid if use_sigmoid else None, cu_seqlens, ci, co,
                   dout, dense_state(dht), dq, dk, dv, dg, dbeta, dh0 if initial_state is not None else None,
                   dA if use_gate and A_log is not None else None, ddb if use_gate and dt_bias is not None else None,
                   ws, *saved]
        c_bwd(context(op, q), tensors, (scale, chunk_size, use_qk_l2norm, use_gate, use_sigmoid, allow_neg), *flags)
        return tuple(grads)

    def bwd_fake(*args):
        a = dict(zip(BWD_NAMES, args))
        return tuple(_grads(*(a[n] for n in ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias",
                                             "use_gate"))))

    bwd_params = BWD_INPUTS + tuple((n, Optional[Tensor]) for n in family.saved) + tuple(family.bwd_extra)
    bwd = PlainOp(op + "_bwd", _signature(bwd_impl, bwd_params, tuple[(Tensor,) * 8]), bwd_fake)

    def setup(ctx, inputs, output):
        c, extra = Call(inputs[:n_in]), inputs[n_in:]
        o, ht, qn, kn, rq, rk, gc, bs, *saved = output
        ctx.flags = c.flags
        ctx.extra = extra
        ctx.save_for_backward(c.q, c.k, c.v, c.g, c.beta, c.initial_state, c.A_log, c.dt_bias, qn, kn, rq, rk, gc,
                              bs, c.cu_seqlens, c.cu_seqlens_cpu, *saved)
        ctx.mark_non_differentiable(qn, kn, rq, rk, gc, bs, *saved)

    def backward(ctx, do, dht, *_unused):
        tensors = ctx.saved_tensors  # read once: under activation checkpointing each read unpacks again
        shared, saved = tensors[:len(SAVED)], tensors[len(SAVED):]
        q, k, v, g, beta, h0, A_log, dt_bias = shared[:8]
        scale, bt, l2, gate, sig, neg = ctx.flags
        if do is None:
            do = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        if dht is not None and dht.numel() == 0:
            dht = None
        dq, dk, dv, dg, dbeta, dh0, dA, ddb = bwd(*shared, do, dht, scale, bt, l2, gate, sig, neg,
                                                  *family.backward_inputs(saved, ctx.extra))
        return (dq, dk, dv, dg, dbeta, None, dh0 if h0 is not None else None, None, None, None,
                dA if gate and A_log is not None else None, ddb if gate and dt_bias is not None else None,
                *(None,) * (n_in - 12 + len(family.extra)))

    fwd_params = FWD_INPUTS + tuple(family.extra)
    returns = tuple[(Tensor,) * n_out]
    fwd = DifferentiableOp(op + "_fwd", _signature(fwd_impl, fwd_params, returns),
                           _signature(fwd_fake, fwd_params, returns), setup, backward)
    fwd.bwd = bwd  # the backward op, for callers that compose the two themselves (context parallelism)
    return fwd


# ---------------------------------------------------------------------------------------------
# The per-token forms (fused_recurrent_gated_delta_rule, fused_recurrent_kda): the same custom
# ops for both families, g in the family's form. (q, k, v, g, beta, scale, initial_state,
# output_final_state, cu_seqlens) -> (o, final_state); nothing saved but the inputs (the backward's
# checkpoint states live in its workspace, for the call only).


def recurrent_op(op: str) -> DifferentiableOp:
    c_fwd, c_bwd = getattr(_C, op + "_fwd"), getattr(_C, op + "_bwd")
    ws_size = getattr(_C, op + "_bwd_workspace_size")

    def fwd_impl(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], beta: Optional[Tensor], scale: float,
                 initial_state: Optional[Tensor], output_final_state: bool,
                 cu_seqlens: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        if cu_seqlens is not None:
            seq_values(cu_seqlens, None, T)
        o = torch.empty(B, T, HV, V, dtype=q.dtype, device=q.device)
        ht = torch.empty(N, HV, K, V, dtype=acc_dtype(q), device=q.device) if output_final_state else empty(q)
        c_fwd(context(op, q), last_unit(q), last_unit(k), last_unit(v), last_unit(g), last_unit(beta),
              dense_state(initial_state), cu_seqlens, scale, o, ht if output_final_state else None)
        return o, ht

    def fwd_fake(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens):
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        ht = q.new_empty(N, HV, K, V, dtype=acc_dtype(q)) if output_final_state else q.new_empty(0)
        return q.new_empty(B, T, HV, V), ht

    def grads(q, k, v, g, beta, initial_state):
        return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
                g.new_empty(g.shape) if g is not None else q.new_empty(0),
                beta.new_empty(beta.shape) if beta is not None else q.new_empty(0),
                initial_state.new_empty(initial_state.shape) if initial_state is not None else q.new_empty(0))

    def bwd_impl(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], beta: Optional[Tensor], scale: float,
                 initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], dout: Tensor,
                 dht: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        dq, dk, dv, dg, db, dh0 = out = grads(q, k, v, g, beta, initial_state)
        # The states at the 16-token checkpoints of cuda_sm90's kernel (sm_90 devices, sequences past
        # 16 tokens; 0 bytes otherwise).
        nbytes = ws_size(q, v, cu_seqlens)
        c_bwd(context(op, q), last_unit(q), last_unit(k), last_unit(v), last_unit(g), last_unit(beta),
              dense_state(initial_state), cu_seqlens, scale, last_unit(dout), dense_state(dht), dq, dk, dv,
              dg if g is not None else None, db if beta is not None else None,
              dh0 if initial_state is not None else None, workspace(nbytes, q.device) if nbytes else None)
        return out

    def bwd_fake(q, k, v, g, beta, scale, initial_state, cu_seqlens, dout, dht):
        return grads(q, k, v, g, beta, initial_state)

    bwd = PlainOp(op + "_bwd", bwd_impl, bwd_fake)

    def setup(ctx, inputs, output):
        q, k, v, g, beta, scale, h0, ofs, cu = inputs
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, g, beta, h0, cu)

    def backward(ctx, do, dht):
        q, k, v, g, beta, h0, cu = ctx.saved_tensors
        if do is None:
            do = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        if dht is not None and dht.numel() == 0:
            dht = None
        dq, dk, dv, dg, db, dh0 = bwd(q, k, v, g, beta, ctx.scale, h0, cu, do, dht)
        return (dq, dk, dv, dg if g is not None else None, db if beta is not None else None, None,
                dh0 if h0 is not None else None, None, None)

    return DifferentiableOp(op + "_fwd", fwd_impl, fwd_fake, setup, backward)


# ---------------------------------------------------------------------------------------------
# The sub-operators both pipelines run (plain functions, flash-linear-attention's signatures,
# not differentiable).


def chunk_tables(op: str, cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
                 chunk_indices: Optional[Tensor], chunk_size: int, T: int):
    """(chunk indices, chunk offsets) of cu_seqlens for a sub-operator, from the kept tables.
    A caller's ``chunk_indices`` (flash-linear-attention's precomputed table) is accepted when it
    matches cu_seqlens at this chunk size ([NT, 2], NT the chunk count) and is otherwise an error;
    the kernels read the kept table, built from the checked host values of cu_seqlens."""
    check_slots(op, dict(chunk_indices=chunk_indices))
    if cu_seqlens is None:
        if chunk_indices is not None:
            fail(op, "chunk_indices describes the chunks of packed sequences; pass it with cu_seqlens")
        return None, None
    ci, co = indices(cu_seqlens, cu_seqlens_cpu, chunk_size, T)
    if chunk_indices is not None and tuple(chunk_indices.shape) != tuple(ci.shape):
        fail(op, f"chunk_indices must be the [NT, 2] = {list(ci.shape)} table of cu_seqlens at chunk_size="
                 f"{chunk_size} (prepare_chunk_indices(cu_seqlens, {chunk_size})), got shape "
                 f"{list(chunk_indices.shape)}")
    return ci, co


def dense_state(h: Optional[Tensor], state_v_first: bool = False) -> Optional[Tensor]:
    """A state input (h / dh snapshots, initial_state / h0, dht) as the kernels take it: in the
    core's [..., K, V] layout (see state_kv) and contiguous, since the state kernels read states as
    dense blocks (an expanded or sliced state is copied here; the C++ checks reject one)."""
    h = state_kv(h, state_v_first)
    return None if h is None else h.contiguous()


def state_kv(h: Optional[Tensor], state_v_first: bool) -> Optional[Tensor]:
    """A state (or stack of states) in the core's [..., K, V] layout from the caller's ([..., V, K]
    with state_v_first), or back: the same transpose both ways, contiguous as the kernels and
    flash-linear-attention's sub-operators lay their states out."""
    if h is None or not state_v_first:
        return h
    return h.transpose(-1, -2).contiguous()


def chunk_local_cumsum(g: Tensor, chunk_size: int, reverse: bool = False, scale: Optional[float] = None,
                       cu_seqlens: Optional[Tensor] = None, output_dtype: Optional[torch.dtype] = torch.float,
                       chunk_indices: Optional[Tensor] = None, use_graph: bool = False, **kwargs) -> Tensor:
    """Chunk-local cumsum of a scalar ``[B,T,H]`` or vector ``[B,T,H,S]`` gate; ``reverse`` is a
    true suffix sum; ``scale`` multiplies after the sum; ``output_dtype=None`` keeps g's dtype.
    flash-linear-attention 0.6.0's signature: ``chunk_indices`` is checked against cu_seqlens,
    ``use_graph`` is accepted and ignored, ``head_first`` raises."""
    op = "chunk_local_cumsum"
    reject_kwargs(op, kwargs)
    check_slots(op, dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices), dict(reverse=reverse),
                dict(scale=scale), output_dtype)
    if g.dim() not in (3, 4):
        raise ValueError(f"fusedops: chunk_local_cumsum: g must have rank 3 ([B,T,H], scalar gate) or 4 "
                         f"([B,T,H,S], vector gate), got rank {g.dim()}")
    if chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"fusedops: chunk_local_cumsum: chunk_size must be a power of 2, got {chunk_size}")
    ci, _ = chunk_tables(op, cu_seqlens, None, chunk_indices, chunk_size, g.shape[1])
    out = torch.empty(g.shape, dtype=output_dtype or g.dtype, device=g.device)
    _C.chunk_local_cumsum(context(op, g), last_unit(g), out, cu_seqlens, ci,
                          chunk_size, reverse, 1.0 if scale is None else float(scale))
    return out


def chunk_gated_delta_rule_fwd_h(k: Tensor, w: Tensor, u: Tensor, g: Optional[Tensor] = None,
                                 gk: Optional[Tensor] = None, initial_state: Optional[Tensor] = None,
                                 output_final_state: bool = False, chunk_size: int = 64,
                                 save_new_value: bool = True, state_v_first: bool = False,
                                 cu_seqlens: Optional[Tensor] = None, cu_seqlens_cpu: Optional[Tensor] = None,
                                 chunk_indices: Optional[Tensor] = None,
                                 chunk_offsets: Optional[Tensor] = None):
    """The inter-chunk state recurrence: ``(h [B,NT,HV,K,V], v_new or None, final_state or None)``
    (g / gk chunk-local cumsums in natural-log units; every state ``[..., V, K]`` with
    ``state_v_first``). ``chunk_indices`` and ``chunk_offsets`` are checked against cu_seqlens."""
    op = "chunk_gated_delta_rule_fwd_h"
    check_slots(op, dict(g=g, gk=gk, initial_state=initial_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                         chunk_indices=chunk_indices, chunk_offsets=chunk_offsets),
                dict(output_final_state=output_final_state, save_new_value=save_new_value, state_v_first=state_v_first))
    check_rank4_of(op, k=k, w=w, u=u)
    B, T = k.shape[:2]
    HV, K, V = u.shape[2], k.shape[3], u.shape[3]
    _, co = chunk_tables(op, cu_seqlens, cu_seqlens_cpu, chunk_indices, chunk_size, T)
    check_offsets(op, chunk_offsets, co)
    lead, NT = num_chunks(T, B, cu_seqlens, chunk_size)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    h = torch.empty(lead, NT, HV, K, V, dtype=k.dtype, device=k.device)
    vn = torch.empty(u.shape, dtype=u.dtype, device=u.device) if save_new_value else None
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=k.device) if output_final_state else None
    _C.chunk_gated_delta_rule_fwd_h(context(op, k), last_unit(k), last_unit(w),
                                    last_unit(u), last_unit(g), last_unit(gk),
                                    dense_state(initial_state, state_v_first), h, vn, ht, cu_seqlens, co,
                                    chunk_size)
    return state_kv(h, state_v_first), vn, state_kv(ht, state_v_first)


def chunk_gated_delta_rule_bwd_dhu(q: Tensor, k: Tensor, w: Tensor, do: Tensor, dv: Tensor,
                                   g: Optional[Tensor] = None, gk: Optional[Tensor] = None,
                                   h0: Optional[Tensor] = None, dht: Optional[Tensor] = None,
                                   scale: Optional[float] = None, state_v_first: bool = False,
                                   cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                                   chunk_indices: Optional[Tensor] = None,
                                   chunk_offsets: Optional[Tensor] = None, use_graph: bool = False):
    """Reverse state-gradient recurrence: ``(dh [B,NT,HV,K,V], dh0 or None, dv2)``; dh0 is
    produced when ``h0`` is given (states ``[..., V, K]`` with ``state_v_first``)."""
    op = "chunk_gated_delta_rule_bwd_dhu"
    check_slots(op, dict(g=g, gk=gk, h0=h0, dht=dht, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
                         chunk_offsets=chunk_offsets), dict(state_v_first=state_v_first), dict(scale=scale))
    check_rank4_of(op, q=q, k=k, w=w, dout=do, dv=dv)
    B, T = q.shape[:2]
    HV, K, V = do.shape[2], q.shape[3], do.shape[3]
    _, co = chunk_tables(op, cu_seqlens, None, chunk_indices, chunk_size, T)
    check_offsets(op, chunk_offsets, co)
    lead, NT = num_chunks(T, B, cu_seqlens, chunk_size)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    dh = torch.empty(lead, NT, HV, K, V, dtype=q.dtype, device=q.device)
    dh0 = torch.empty(N, HV, K, V, dtype=torch.float32, device=q.device) if h0 is not None else None
    dv2 = torch.empty(dv.shape, dtype=dv.dtype, device=dv.device)
    _C.chunk_gated_delta_rule_bwd_dhu(context(op, q), last_unit(q), last_unit(k),
                                      last_unit(w), last_unit(do), last_unit(dv), last_unit(g),
                                      last_unit(gk), dense_state(dht, state_v_first), dh, dh0, dv2,
                                      cu_seqlens, co, K ** -0.5 if scale is None else float(scale),
                                      chunk_size)
    return state_kv(dh, state_v_first), state_kv(dh0, state_v_first), dv2


def check_offsets(op: str, chunk_offsets: Optional[Tensor], co: Optional[Tensor]) -> None:
    if chunk_offsets is None:
        return
    if co is None:
        fail(op, "chunk_offsets describes the chunks of packed sequences; pass it with cu_seqlens")
    if tuple(chunk_offsets.shape) != tuple(co.shape):
        fail(op, f"chunk_offsets must be the [N+1] = {list(co.shape)} table of cu_seqlens "
                 f"(prepare_chunk_offsets), got shape {list(chunk_offsets.shape)}")
