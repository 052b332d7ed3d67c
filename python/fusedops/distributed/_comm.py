"""The collectives of the distributed operators, in one place (each is one torch.distributed call)."""

from __future__ import annotations

from typing import Optional

import torch.distributed as dist
from torch import Tensor


def all_gather_rows(t: Tensor, group: Optional[dist.ProcessGroup]) -> Tensor:
    """``[world_size, t.numel()]``: every rank's flat ``t`` in rank order (one
    ``all_gather_into_tensor``; the output is allocated flat, as gloo requires)."""
    world = dist.get_world_size(group)
    flat = t.reshape(-1).contiguous()
    out = flat.new_empty(world * flat.numel())
    dist.all_gather_into_tensor(out, flat, group=group)
    return out.view(world, flat.numel())


def all_reduce(t: Tensor, op: dist.ReduceOp, group: Optional[dist.ProcessGroup]) -> Tensor:
    """``t`` reduced over the group, in place."""
    dist.all_reduce(t, op=op, group=group)
    return t


def exchange(sends: list[tuple[int, Tensor]], recvs: list[tuple[int, Tensor]],
             group: Optional[dist.ProcessGroup]) -> None:
    """Point-to-point: each ``(peer, tensor)`` of ``sends`` goes to that group rank, each of
    ``recvs`` is filled from it; all in one batch (``batch_isend_irecv``), waited for here."""
    ops = []
    for peer, t in sends:
        ops.append(dist.P2POp(dist.isend, t.contiguous(), _global_rank(group, peer), group))
    for peer, t in recvs:
        ops.append(dist.P2POp(dist.irecv, t, _global_rank(group, peer), group))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def _global_rank(group: Optional[dist.ProcessGroup], rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)

