"""The context-parallel plan: which tokens of a packed batch each rank holds, and everything the
CP operators need to know about it, computed once per batch on the host."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["ContextParallel", "context_parallel"]


@dataclass(frozen=True)
class HaloPiece:
    """Tokens [start, end) (global positions) moving between two ranks for the convolution halo:
    sent by `src`, received by `dst`, who stores them at `slot` in its halo buffer."""

    src: int
    dst: int
    start: int
    end: int
    slot: int


def _host_ints(x, what: str) -> list[int]:
    if isinstance(x, Tensor):
        if x.dim() != 1 or x.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"fusedops: context_parallel: {what} must be a rank-1 int32/int64 tensor, got "
                             f"{list(x.shape)} {x.dtype}")
        return [int(v) for v in x.tolist()]
    return [int(v) for v in x]


def _owner(bounds: list[int], pos: int) -> int:
    """The rank holding global token `pos` (bounds[r] <= pos < bounds[r+1]; empty ranks hold none)."""
    return bisect.bisect_right(bounds, pos) - 1


class ContextParallel:
    """A context-parallel plan for one packed batch (build it with :func:`context_parallel`).

    Rank ``r`` holds the global tokens ``[bounds[r], bounds[r+1])`` of the packed batch (B = 1,
    sequences given by the global ``cu_seqlens``). Attributes of this rank:

    * ``start``, ``end``, ``num_tokens``: its token range;
    * ``cu_seqlens`` / ``cu_seqlens_cpu``: int32 bounds of its local sequences (every global
      sequence with at least one token here, clipped to the range), on ``device`` / on the host;
      ``seq_ids``: their global indices;
    * ``incoming``: the global index of the first local sequence when it started on an earlier
      rank (else None), ``incoming_end`` its local end, ``fold_lo`` the rank where it started;
    * ``outgoing``: the global index of the last local sequence when it continues on a later rank
      (else None), ``outgoing_start`` its local start, ``fold_hi`` one past the last rank it
      reaches;
    * the halo of the convolution (``conv_width``): ``halo_len`` tokens of the incoming sequence
      before ``start``, received in ``halo_recv`` pieces; ``halo_send`` the pieces this rank sends.

    Sequences with no tokens (empty entries of ``cu_seqlens``) belong to rank 0: their final
    state is their initial state. Every operator call with ``cp=plan`` runs without reading
    device values on the host; the plan's device tensors are made here.
    """

    def __init__(self, cu_seqlens: Sequence[int], bounds: Sequence[int], rank: int, world_size: int,
                 group: Optional[dist.ProcessGroup], device: torch.device, conv_width: Optional[int]):
        cu, b = list(cu_seqlens), list(bounds)
        self.group = group
        self.rank, self.world_size = rank, world_size
        self.global_cu_seqlens = tuple(cu)
        self.bounds = tuple(b)
        self.num_seqs = len(cu) - 1
        self.total_tokens = cu[-1]
        self.device = device
        self.start, self.end = b[rank], b[rank + 1]
        self.num_tokens = self.end - self.start
        self.conv_width = conv_width

        infos = [self._rank_info(cu, b, r) for r in range(world_size)]
        info = infos[rank]
        self.seq_ids = tuple(info["seqs"])
        local = [0]
        for n in self.seq_ids:
            local.append(min(cu[n + 1], self.end) - self.start)
        self.cu_seqlens_cpu = torch.tensor(local, dtype=torch.int32)
        self.cu_seqlens = self.cu_seqlens_cpu.to(device)
        self.num_local_seqs = len(self.seq_ids)
        self.incoming = info["incoming"]
        self.incoming_end = local[1] if self.incoming is not None else 0
        self.fold_lo = _owner(b, cu[self.incoming]) if self.incoming is not None else rank
        self.outgoing = info["outgoing"]
        self.outgoing_start = local[-2] if self.outgoing is not None else self.num_tokens
        self.fold_hi = _owner(b, cu[self.outgoing + 1] - 1) + 1 if self.outgoing is not None else rank + 1
        rows = range(self.num_local_seqs)
        self._start_rows = [i for i in rows if cu[self.seq_ids[i]] >= self.start]
        self._end_rows = [i for i in rows if cu[self.seq_ids[i] + 1] <= self.end]
        self.empty_seqs = tuple(n for n in range(self.num_seqs) if cu[n] == cu[n + 1]) if rank == 0 else ()

        def idx(v):
            return torch.tensor(list(v), dtype=torch.int64, device=device)

        # The chunk tables of the local sequences, made now (on the host, then copied once) so that
        # the operators find them and read nothing back from the device.
        if self.num_tokens:
            from ..ops._linear_attention import indices
            for chunk_size in (16, 32, 64):
                indices(self.cu_seqlens, self.cu_seqlens_cpu, chunk_size, self.num_tokens)
        self.start_rows, self.start_ids = idx(self._start_rows), idx(self.seq_ids[i] for i in self._start_rows)
        self.end_rows, self.end_ids = idx(self._end_rows), idx(self.seq_ids[i] for i in self._end_rows)
        self.empty_ids = idx(self.empty_seqs)

        self.halo_len = 0
        self.halo_recv: tuple[HaloPiece, ...] = ()
        self.halo_send: tuple[HaloPiece, ...] = ()
        if conv_width is not None:
            pieces = [p for r in range(world_size) for p in self._halo_pieces(cu, b, r, infos[r], conv_width)]
            self.halo_recv = tuple(p for p in pieces if p.dst == rank)
            self.halo_send = tuple(p for p in pieces if p.src == rank)
            if self.incoming is not None:
                self.halo_len = min(conv_width - 1, self.start - cu[self.incoming])

    @staticmethod
    def _rank_info(cu: list[int], b: list[int], r: int) -> dict:
        lo, hi = b[r], b[r + 1]
        seqs = []
        if hi > lo:
            n = bisect.bisect_right(cu, lo) - 1  # the sequence holding token lo
            while n < len(cu) - 1 and cu[n] < hi:
                if min(cu[n + 1], hi) > max(cu[n], lo):
                    seqs.append(n)
                n += 1
        incoming = seqs[0] if seqs and cu[seqs[0]] < lo else None
        outgoing = seqs[-1] if seqs and cu[seqs[-1] + 1] > hi else None
        return {"seqs": seqs, "incoming": incoming, "outgoing": outgoing}

    @staticmethod
    def _halo_pieces(cu, b, r, info, width) -> list[HaloPiece]:
        n = info["incoming"]
        if n is None or width <= 1:
            return []
        first = max(cu[n], b[r] - (width - 1))
        pieces = []
        for j in range(_owner(b, first), r):
            s, e = max(first, b[j]), min(b[r], b[j + 1])
            if e > s:
                pieces.append(HaloPiece(j, r, s, e, s - (b[r] - (width - 1))))
        return pieces

    # -----------------------------------------------------------------------------------------
    def _rows(self, which: str) -> tuple[Tensor, Tensor]:
        return (self.start_rows, self.start_ids) if which == "start" else (self.end_rows, self.end_ids)

    def local_states(self, t: Optional[Tensor], which: str, shape, dtype, device) -> Tensor:
        """``[num_local_seqs, *shape]`` zeros holding, in the rows of the local sequences that
        start (``which="start"``) or end (``"end"``) on this rank, their rows of the global ``t``
        (``[num_seqs, *shape]``; None: all zeros)."""
        out = torch.zeros((self.num_local_seqs, *shape), dtype=dtype, device=device)
        rows, ids = self._rows(which)
        if t is not None and rows.numel():
            out.index_copy_(0, rows, t.index_select(0, ids).to(dtype))
        return out

    def global_states(self, t_loc: Optional[Tensor], which: str, shape, dtype, device,
                      empty_from: Optional[Tensor] = None) -> Tensor:
        """``[num_seqs, *shape]`` zeros holding the rows of ``t_loc`` (local) of the sequences
        that start / end on this rank; with ``empty_from``, the empty sequences' rows (rank 0's)
        copied from it (an empty sequence's final state is its initial state, and back)."""
        out = torch.zeros((self.num_seqs, *shape), dtype=dtype, device=device)
        rows, ids = self._rows(which)
        if t_loc is not None and rows.numel():
            out.index_copy_(0, ids, t_loc.index_select(0, rows).to(dtype))
        if empty_from is not None and self.empty_seqs:
            out.index_copy_(0, self.empty_ids, empty_from.index_select(0, self.empty_ids).to(dtype))
        return out

    def shard(self, t: Tensor, dim: int = 1) -> Tensor:
        """This rank's tokens of a global packed tensor (``dim`` is the token dimension)."""
        return t.narrow(dim, self.start, self.num_tokens)

    def gather(self, t: Tensor, dim: int = 1) -> Tensor:
        """Every rank's tokens of a sharded tensor, concatenated along ``dim`` (an all-gather)."""
        longest = max(self.bounds[r + 1] - self.bounds[r] for r in range(self.world_size))
        t = t.movedim(dim, 0).contiguous()
        buf = t.new_zeros((longest,) + tuple(t.shape[1:]))
        buf[: t.shape[0]] = t
        parts = [torch.empty_like(buf) for _ in range(self.world_size)]
        dist.all_gather(parts, buf, group=self.group)
        full = torch.cat([p[: self.bounds[r + 1] - self.bounds[r]] for r, p in enumerate(parts)], 0)
        return full.movedim(0, dim)

    def __repr__(self) -> str:
        return (f"ContextParallel(rank={self.rank}/{self.world_size}, tokens=[{self.start}, {self.end}) of "
                f"{self.total_tokens}, local sequences={list(self.seq_ids)}, incoming={self.incoming}, "
                f"outgoing={self.outgoing})")


def context_parallel(cu_seqlens: Union[Tensor, Sequence[int]], group: Optional[dist.ProcessGroup] = None,
                     split: Optional[Sequence[int]] = None, conv_width: Optional[int] = None, *,
                     device: Optional[Union[str, torch.device]] = None) -> ContextParallel:
    """Build the context-parallel plan of one packed batch for this rank of ``group``.

    * ``cu_seqlens``: the global sequence bounds ``[N+1]`` of the packed batch (the same on every
      rank; a tensor or a list; read on the host here, once).
    * ``group``: the CP process group (default: the whole world).
    * ``split``: the number of tokens of each rank (``world_size`` entries summing to the total;
      any may be 0), or None for a balanced contiguous split (rank ``r`` holds tokens
      ``[r*T//W, (r+1)*T//W)``). Sequences may span any number of ranks.
    * ``conv_width``: the width ``W`` of the short convolutions run with ``cp=plan``: the plan
      then also holds their ``W-1``-token halo exchange.
    * ``device``: where the plan's index tensors live (default: ``cu_seqlens``'s device for a
      tensor, else the current CUDA device under NCCL, else the CPU).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("fusedops: context_parallel: torch.distributed is not initialized "
                           "(call torch.distributed.init_process_group first)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    cu = _host_ints(cu_seqlens, "cu_seqlens")
    if not cu or cu[0] != 0 or any(cu[i] > cu[i + 1] for i in range(len(cu) - 1)):
        raise ValueError(f"fusedops: context_parallel: cu_seqlens must start at 0 and be non-decreasing, "
                         f"got {cu[:8]}{'...' if len(cu) > 8 else ''}")
    total = cu[-1]
    if split is None:
        bounds = [r * total // world for r in range(world + 1)]
    else:
        counts = _host_ints(split, "split")
        if len(counts) != world or any(c < 0 for c in counts) or sum(counts) != total:
            raise ValueError(f"fusedops: context_parallel: split must give the non-negative token count of "
                             f"each of the {world} ranks, summing to the {total} tokens of cu_seqlens, "
                             f"got {counts}")
        bounds = [0]
        for c in counts:
            bounds.append(bounds[-1] + c)
    if conv_width is not None and conv_width < 1:
        raise ValueError(f"fusedops: context_parallel: conv_width must be >= 1, got {conv_width}")
    if device is None:
        if isinstance(cu_seqlens, Tensor):
            device = cu_seqlens.device
        elif dist.get_backend(group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
    return ContextParallel(cu, bounds, rank, world, group, torch.device(device), conv_width)
