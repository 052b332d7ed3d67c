"""sort_chunks_by_idx (docs/specs/ops.md section 6) in the operator report.

The MoE chunk permutation of Megatron's token dispatcher: N tokens arrive grouped by
(source rank, local expert) in S = ep * experts chunks and are regrouped expert-major
(sorted_idxs = arange(S).view(ep, experts).t().flatten()). Chunk sizes are random, sum N.
No probs (the row traffic is the target; probs add 8 bytes a row).

Minimum bytes (s = element size, N rows of H):
  fwd      read x + write y                                   = 2*N*H*s
  fwd+bwd  fwd + read dy + write dx                           = 4*N*H*s
(the fused path also writes the int32 row_id_map, 4*N, and reads it back in the backward.)

Baseline: Megatron's unfused ``sort_chunks_by_idxs`` (torch.split on the host copy of the sizes +
torch.cat), the PyTorch eager composite. The check compares each output row with the row the
definition puts there (float64), on the report's sample of rows.
"""

from __future__ import annotations

import fusedops
import torch

from .. import common
from ..common import Case, Impl, grad_of, shapes_and_dtypes

OP = "sort_chunks_by_idx"

EP, EXPERTS = 8, 32                  # S = 256 chunks (issue 6's target)
GPU_SHAPES = [(262144, 4096)]        # issue 6's target shape
GPU_QUICK_SHAPES = [(32768, 4096)]
CPU_SHAPES = [(16384, 1024)]
CPU_QUICK_SHAPES = [(4096, 256)]
GPU_DTYPES = [torch.bfloat16]
CPU_DTYPES = [torch.float32, torch.bfloat16]


def bytes_moved(shape, dtype) -> dict[str, int]:
    n, h = shape
    e = torch.empty(0, dtype=dtype).element_size()
    return {"fwd": 2 * n * h * e, "fwd+bwd": 4 * n * h * e}


BYTES_NOTE = {"fwd": "read x + write y", "fwd+bwd": "fwd + read dy + write dx"}


def chunks(n: int, seed: int):
    """Random chunk sizes summing to n (some chunks small, a few empty) and the expert-major
    order of a (rank, expert) grouping."""
    s = EP * EXPERTS
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randint(0, n + 1, (s - 1,), generator=g)).values
    sizes = torch.diff(torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([n])]))
    order = torch.arange(s).view(EP, EXPERTS).t().flatten()
    return sizes, order


def destination(sizes: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """row_id_map of the definition: input row r lands on output row dest[r]."""
    n = int(sizes.sum())
    src = torch.cat([torch.arange(n).split(sizes.tolist())[c] for c in order.tolist()])
    dest = torch.empty(n, dtype=torch.int64)
    dest[src] = torch.arange(n)
    return dest


def _impls(eager_note: str) -> list[Impl]:
    def fused_fwd(inp):
        return {"y": fusedops.sort_chunks_by_idx(inp["x"], inp["split_sizes"], inp["sorted_idxs"])[0]}

    def fused_fwd_bwd(inp):
        y = fusedops.sort_chunks_by_idx(inp["x_req"], inp["split_sizes"], inp["sorted_idxs"])[0]
        return {"dx": grad_of(y, inp["x_req"], inp["dy"])}

    def eager_fwd(inp):
        return {"y": fusedops.sort_chunks_by_idxs(inp["x"], inp["split_sizes"], inp["sorted_idxs"],
                                                  fused=False)[0]}

    def eager_fwd_bwd(inp):
        y = fusedops.sort_chunks_by_idxs(inp["x_req"], inp["split_sizes"], inp["sorted_idxs"],
                                         fused=False)[0]
        return {"dx": grad_of(y, inp["x_req"], inp["dy"])}

    return [Impl("fusedops", fused_fwd, fused_fwd_bwd),
            Impl("eager", eager_fwd, eager_fwd_bwd, note=eager_note)]


def _case(shape, dtype) -> Case:
    n, h = shape
    # The reference needs whole tensors (an output row comes from anywhere in the input), which
    # the report does not pass: make_inputs keeps them here until the base has been computed.
    held: dict = {}

    def make(dev, seed):
        inp = common.randn_inputs(shape, dtype, dev, seed)
        sizes, order = chunks(n, seed)
        inp["split_sizes"] = sizes.to(dev)
        inp["sorted_idxs"] = order.to(dev)
        held.update(inputs=inp, dest=destination(sizes, order))
        return inp

    def reference(_sliced):
        inp, dest = held["inputs"], held["dest"]
        rows = common.row_sample(case.rows, h, case.ref_row_budget_elems)
        inv = torch.empty_like(dest)
        inv[dest] = torch.arange(n)
        y = inp["x"][inv[rows].to(inp["x"].device)].detach()
        dx = inp["dy"][dest[rows].to(inp["dy"].device)].detach()
        held["base"] = {"fwd": {"y": y}, "fwd+bwd": {"dx": dx}}
        return {"fwd": {"y": y.cpu().double()}, "fwd+bwd": {"dx": dx.cpu().double()}}

    def base(_sliced):
        out = held.pop("base")
        held.clear()  # the report frees the inputs after the case; so do we
        return out

    case = Case(op=OP, shape=shape, dtype=dtype, params={"chunks": EP * EXPERTS, "ep": EP},
                make_inputs=make,
                impls=_impls("Megatron sort_chunks_by_idxs(fused=False): torch.split + torch.cat "
                             "(the sizes go to the host)"),
                reference=reference, base=base,
                bytes_moved=bytes_moved(shape, dtype), bytes_note=BYTES_NOTE)
    return case


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    shapes, dtypes = shapes_and_dtypes(globals(), device, quick, dtypes)
    return [_case(shape, dtype) for shape in shapes for dtype in dtypes]
