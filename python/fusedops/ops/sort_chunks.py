"""sort_chunks_by_idx (docs/specs/ops.md section 6): the MoE chunk permutation, as torch.library custom ops
with autograd, and its MindSpeed / TransformerEngine / Megatron entry points.

The rows of ``inp [N, Hd]`` are cut into chunks of ``split_sizes`` rows and the chunks are
concatenated in ``sorted_index`` order; ``probs [N]`` moves with its rows. The backward is the
inverse permutation (a gather through the saved ``row_id_map``). Only bytes move: every dtype
works (fp8 included) and results are bit-identical to ``torch.split`` + ``torch.cat``.

``split_sizes`` and ``sorted_index`` are read on the device: no call synchronizes. On the CPU
their contents are checked before any work (negative sizes, sum > N, not a permutation:
``ValueError``); on CUDA the kernels check them, keep every access in bounds, give a defined
result (the identity permutation) and report the violation, raised by
``fusedops.check_errors()`` or a later call; inside ``fusedops.debug_checks()`` CUDA calls check
on the host first and raise at once (a synchronization).
"""

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from .._op import DifferentiableOp, PlainOp

_OP = "sort_chunks_by_idx"
_OP_MAP = "make_chunk_sort_map"
_OP_BY_MAP = "sort_chunks_by_map"

# dtypes the binding takes as they are; other dtypes travel as the same-size type below (the
# op copies bytes, so a reinterpreting view is exact).
_NATIVE = {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
           torch.bool, torch.uint8}
_SAME_SIZE = {1: torch.uint8, 2: torch.float16, 4: torch.int32, 8: torch.int64}


def _raw(t: Optional[Tensor]) -> Optional[Tensor]:
    """A view of `t` with a dtype the binding accepts and the same bytes per row."""
    if t is None or t.dtype in _NATIVE:
        return t
    size = t.element_size()
    if size in _SAME_SIZE:
        if t.dim() > 0 and t.size(-1) <= 1 and t.stride(-1) != 1:
            t = t.contiguous()
        return t.view(_SAME_SIZE[size])
    if t.dim() == 2:  # e.g. complex128: each element as several int64
        return rows_view(t).view(torch.int64)
    raise TypeError(f"fusedops: {_OP}: a 1-D tensor of dtype {t.dtype} ({size} bytes per element) "
                    "is not supported")


def _rows(t: Tensor) -> Tensor:
    return _raw(rows_view(t))


def _workspace(num_splits: int, like: Tensor) -> Optional[Tensor]:
    if not like.is_cuda:
        return None
    return torch.empty(max(1, _C.sort_chunks_by_idx_workspace_size(num_splits)), dtype=torch.uint8,
                       device=like.device)


def _index(t: Union[Tensor, Sequence[int]], device: torch.device) -> Tensor:
    if not isinstance(t, Tensor):
        t = torch.tensor(list(t), dtype=torch.int64, device=device)
    return t.contiguous()


def _shape_str(t: Tensor) -> str:
    return "[" + ",".join(str(s) for s in t.shape) + "]"


def _check_inp(op: str, inp: Tensor) -> None:
    # Also raised by the C++ core; repeated here so that tracing (fake tensors) raises too.
    if inp.dim() != 2:
        raise ValueError(f"fusedops: {op}: inp must have rank 2, got rank {inp.dim()} with shape "
                         f"{_shape_str(inp)}")
    if inp.shape[0] > 2**31 - 1:  # before the int32 row_id_map [N] is allocated
        raise ValueError(f"fusedops: {op}: inp has {inp.shape[0]} rows; row_id_map is int32, so at "
                         "most 2^31-1 are supported")


def _check_indices(op: str, split_sizes: Tensor, sorted_index: Tensor) -> None:
    if split_sizes.numel() != sorted_index.numel():
        raise ValueError(f"fusedops: {op}: split_sizes and sorted_index must have the same number "
                         f"of elements, got {split_sizes.numel()} and {sorted_index.numel()}")


def _check_probs(op: str, probs: Optional[Tensor], n: int) -> None:
    if probs is not None and tuple(probs.shape) != (n,):
        raise ValueError(f"fusedops: {op}: probs must have shape [{n}] ([N], N = rows of inp), got "
                         f"{_shape_str(probs)}")


# ---------------------------------------------------------------------------------------------
# sort_chunks_by_idx: forward (map + permutation) and backward (gather).


def _fwd_impl(inp: Tensor, split_sizes: Tensor, sorted_index: Tensor,
              probs: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    n = inp.shape[0]
    out = torch.empty(inp.shape, dtype=inp.dtype, device=inp.device)
    probs_out = (torch.empty(n, dtype=probs.dtype, device=inp.device) if probs is not None
                 else inp.new_empty(0))
    row_id_map = torch.empty(n, dtype=torch.int32, device=inp.device)
    _C.sort_chunks_by_idx_fwd(context(_OP, inp), _rows(inp), split_sizes, sorted_index, _raw(probs),
                              _raw(out), _raw(probs_out) if probs is not None else None, row_id_map,
                              _workspace(split_sizes.numel(), inp))
    return out, probs_out, row_id_map


def _fwd_fake(inp, split_sizes, sorted_index, probs):
    n = inp.shape[0]
    probs_out = inp.new_empty(n, dtype=probs.dtype) if probs is not None else inp.new_empty(0)
    return inp.new_empty(inp.shape), probs_out, inp.new_empty(n, dtype=torch.int32)


def _bwd_impl(d_out: Tensor, d_probs_out: Optional[Tensor], row_id_map: Tensor) -> tuple[Tensor, Tensor]:
    n = d_out.shape[0]
    d_inp = torch.empty(d_out.shape, dtype=d_out.dtype, device=d_out.device)
    d_probs = (torch.empty(n, dtype=d_probs_out.dtype, device=d_out.device)
               if d_probs_out is not None else d_out.new_empty(0))
    _C.sort_chunks_by_idx_bwd(context(_OP, d_out), _rows(d_out), _raw(d_probs_out), row_id_map,
                              _raw(d_inp), _raw(d_probs) if d_probs_out is not None else None)
    return d_inp, d_probs


def _bwd_fake(d_out, d_probs_out, row_id_map):
    n = d_out.shape[0]
    d_probs = d_out.new_empty(n, dtype=d_probs_out.dtype) if d_probs_out is not None else d_out.new_empty(0)
    return d_out.new_empty(d_out.shape), d_probs


_bwd = PlainOp("sort_chunks_by_idx_bwd", _bwd_impl, _bwd_fake)


def _setup(ctx, inputs, output):
    ctx.has_probs = inputs[3] is not None
    ctx.inp_meta = (inputs[0].shape, inputs[0].dtype, inputs[0].device)
    ctx.save_for_backward(output[2])
    ctx.mark_non_differentiable(output[2])
    if not ctx.has_probs:
        ctx.mark_non_differentiable(output[1])


def _backward(ctx, d_out, d_probs_out, _d_map):
    (row_id_map,) = ctx.saved_tensors
    d_probs_out = d_probs_out if ctx.has_probs else None
    if d_out is None and d_probs_out is None:
        return None, None, None, None
    if d_out is None:  # only probs_out was used: gather its gradient alone
        return None, None, None, d_probs_out[row_id_map.long()]
    d_inp, d_probs = _bwd(d_out, d_probs_out, row_id_map)
    return d_inp, None, None, (d_probs if d_probs_out is not None else None)


_fwd = DifferentiableOp("sort_chunks_by_idx_fwd", _fwd_impl, _fwd_fake, _setup, _backward)


def sort_chunks_by_idx(inp: Tensor, split_sizes: Tensor, sorted_index: Tensor,
                       probs: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """Concatenate the chunks of ``inp`` in ``sorted_index`` order.

    Args:
        inp: ``[N, Hd]``, any dtype (fp32/bf16/fp16, fp8, integers); any row stride.
        split_sizes: ``[S]`` int32/int64 on inp's device, chunk lengths (>= 0, sum <= N; rows
            past the sum stay in place).
        sorted_index: ``[S]`` int32/int64 on inp's device, a permutation of ``0..S-1``: output
            chunk j is input chunk ``sorted_index[j]``.
        (Bad contents: ``ValueError`` on the CPU; on CUDA the identity permutation and a report,
        see the module docstring.)
        probs: ``[N]`` or None; permuted with the rows.

    Returns ``(out, probs_out)`` (``probs_out`` None without probs). Differentiable in inp and
    probs; the backward is the exact inverse permutation (bit-identical).
    """
    _check_inp(_OP, inp)
    split_sizes, sorted_index = _index(split_sizes, inp.device), _index(sorted_index, inp.device)
    _check_indices(_OP, split_sizes, sorted_index)
    _check_probs(_OP, probs, inp.shape[0])
    out, probs_out, _ = _fwd(inp, split_sizes, sorted_index, probs)
    return out, (probs_out if probs is not None else None)


def sort_chunks_by_idx_with_map(inp: Tensor, split_sizes: Tensor, sorted_index: Tensor,
                                probs: Optional[Tensor] = None):
    """:func:`sort_chunks_by_idx` that also returns the int32 ``row_id_map [N]`` it saves for the
    backward: ``(out, probs_out, row_id_map)`` with ``out[row_id_map[r]] = inp[r]``."""
    _check_inp(_OP, inp)
    split_sizes, sorted_index = _index(split_sizes, inp.device), _index(sorted_index, inp.device)
    _check_indices(_OP, split_sizes, sorted_index)
    _check_probs(_OP, probs, inp.shape[0])
    out, probs_out, row_id_map = _fwd(inp, split_sizes, sorted_index, probs)
    return out, (probs_out if probs is not None else None), row_id_map


def moe_sort_chunks_by_index(inp: Tensor, split_sizes: Tensor, sorted_index: Tensor) -> Tensor:
    """TransformerEngine / MindSpeed ``moe_sort_chunks_by_index``: the permuted rows."""
    return sort_chunks_by_idx(inp, split_sizes, sorted_index)[0]


def moe_sort_chunks_by_index_with_probs(inp: Tensor, probs: Tensor, split_sizes: Tensor,
                                        sorted_index: Tensor) -> tuple[Tensor, Tensor]:
    """TransformerEngine / MindSpeed ``moe_sort_chunks_by_index_with_probs``: ``(out, probs_out)``."""
    return sort_chunks_by_idx(inp, split_sizes, sorted_index, probs)


def sort_chunks_by_idxs(input: Tensor, split_sizes: Union[Tensor, Sequence[int]],
                        sorted_idxs: Union[Tensor, Sequence[int]], probs: Optional[Tensor] = None,
                        fused: bool = True) -> tuple[Tensor, Optional[Tensor]]:
    """Megatron-LM's ``sort_chunks_by_idxs``: ``(output, permuted_probs)``.

    ``fused=True`` (default) runs :func:`sort_chunks_by_idx`; ``fused=False`` is Megatron's
    unfused composite (``torch.split`` + ``torch.cat``, which reads the sizes on the host and
    needs ``sum(split_sizes) == N``).
    """
    if fused:
        return sort_chunks_by_idx(input, split_sizes, sorted_idxs, probs)
    sizes = split_sizes.tolist() if isinstance(split_sizes, Tensor) else list(split_sizes)
    order = sorted_idxs.tolist() if isinstance(sorted_idxs, Tensor) else list(sorted_idxs)
    chunks = torch.split(input, sizes, dim=0)
    output = torch.cat([chunks[i] for i in order], dim=0)
    permuted_probs = None
    if probs is not None:
        pchunks = torch.split(probs, sizes, dim=0)
        permuted_probs = torch.cat([pchunks[i] for i in order], dim=0)
    return output, permuted_probs


# ---------------------------------------------------------------------------------------------
# The helpers of MindSpeed / TransformerEngine: the map alone, and a move through a given map.


def _make_map_impl(split_sizes: Tensor, sorted_index: Tensor, num_tokens: int) -> Tensor:
    row_id_map = torch.empty(num_tokens, dtype=torch.int32, device=split_sizes.device)
    _C.make_chunk_sort_map(context(_OP_MAP, split_sizes), split_sizes, sorted_index, row_id_map,
                           _workspace(split_sizes.numel(), split_sizes))
    return row_id_map


def _make_map_fake(split_sizes, sorted_index, num_tokens):
    return split_sizes.new_empty(num_tokens, dtype=torch.int32)


_make_map = PlainOp("make_chunk_sort_map", _make_map_impl, _make_map_fake)


def make_chunk_sort_map(split_sizes: Tensor, sorted_indices: Tensor, num_tokens: int,
                        num_splits: int) -> Tensor:
    """The int32 ``row_id_map [num_tokens]`` of the chunk sort (MindSpeed's helper signature):
    input row r goes to output row ``row_id_map[r]``."""
    split_sizes = _index(split_sizes, torch.device("cpu"))
    sorted_indices = _index(sorted_indices, split_sizes.device)
    _check_indices(_OP_MAP, split_sizes, sorted_indices)
    if num_splits != split_sizes.numel():
        raise ValueError(f"fusedops: {_OP_MAP}: num_splits ({num_splits}) must equal the number of "
                         f"split_sizes ({split_sizes.numel()})")
    if num_tokens < 0:
        raise ValueError(f"fusedops: {_OP_MAP}: num_tokens must be >= 0, got {num_tokens}")
    return _make_map(split_sizes, sorted_indices, int(num_tokens))


def _by_map_impl(inp: Tensor, row_id_map: Tensor, probs: Optional[Tensor],
                 is_forward: bool) -> tuple[Tensor, Tensor]:
    n = inp.shape[0]
    out = torch.empty(inp.shape, dtype=inp.dtype, device=inp.device)
    probs_out = (torch.empty(n, dtype=probs.dtype, device=inp.device) if probs is not None
                 else inp.new_empty(0))
    ws = None
    if inp.is_cuda:
        nbytes = _C.sort_chunks_by_map_workspace_size(n, is_forward)
        ws = torch.empty(nbytes, dtype=torch.uint8, device=inp.device) if nbytes else None
    _C.sort_chunks_by_map(context(_OP_BY_MAP, inp), _rows(inp), row_id_map, _raw(probs), _raw(out),
                          _raw(probs_out) if probs is not None else None, is_forward, ws)
    return out, probs_out


def _by_map_fake(inp, row_id_map, probs, is_forward):
    n = inp.shape[0]
    probs_out = inp.new_empty(n, dtype=probs.dtype) if probs is not None else inp.new_empty(0)
    return inp.new_empty(inp.shape), probs_out


def _by_map_setup(ctx, inputs, output):
    ctx.has_probs = inputs[2] is not None
    ctx.is_forward = inputs[3]
    ctx.inp_meta = (inputs[0].shape, inputs[0].dtype, inputs[0].device)
    ctx.save_for_backward(inputs[1])
    if not ctx.has_probs:
        ctx.mark_non_differentiable(output[1])


def _by_map_backward(ctx, d_out, d_probs_out):
    # A scatter through the map is undone by the gather through the same map, and vice versa.
    (row_id_map,) = ctx.saved_tensors
    d_probs_out = d_probs_out if ctx.has_probs else None
    if d_out is None and d_probs_out is None:
        return None, None, None, None
    shape, dtype, device = ctx.inp_meta
    if d_out is None:
        d_out = torch.zeros(shape, dtype=dtype, device=device)
    d_inp, d_probs = _by_map(d_out, row_id_map, d_probs_out, not ctx.is_forward)
    return d_inp, None, (d_probs if d_probs_out is not None else None), None


_by_map = DifferentiableOp("sort_chunks_by_map", _by_map_impl, _by_map_fake, _by_map_setup,
                           _by_map_backward)


def sort_chunks_by_map(inp: Tensor, row_id_map: Tensor, probs: Optional[Tensor], num_tokens: int,
                       hidden_size: int, is_forward: bool) -> tuple[Tensor, Optional[Tensor]]:
    """Move rows through a map (MindSpeed's helper signature): ``is_forward`` scatters
    (``out[row_id_map[r]] = inp[r]``), otherwise gathers (``out[r] = inp[row_id_map[r]]``).
    Returns ``(output, permuted_probs)``; differentiable (the backward is the opposite move)."""
    _check_inp(_OP_BY_MAP, inp)
    if tuple(inp.shape) != (num_tokens, hidden_size):
        raise ValueError(f"fusedops: {_OP_BY_MAP}: inp must have shape [num_tokens, hidden_size]="
                         f"[{num_tokens},{hidden_size}], got {_shape_str(inp)}")
    _check_probs(_OP_BY_MAP, probs, num_tokens)
    out, probs_out = _by_map(inp, row_id_map.contiguous(), probs, bool(is_forward))
    return out, (probs_out if probs is not None else None)
