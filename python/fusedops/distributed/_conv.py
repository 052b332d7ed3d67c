"""Context-parallel causal_conv1d (docs/distributed.md).

A rank's first sequence, when it started on an earlier rank, needs the W-1 tokens before the
rank's first token (fewer when the sequence starts inside that window: the rest comes from the
sequence's initial state, or zeros). The plan lists which rank sends which tokens (a window may
cover several small ranks); they travel point to point (one batch of send/recv), become the
local initial state of that sequence, and the local operator runs unchanged. The backward sends
the gradient of those initial-state slots back to the ranks that own the tokens, which add it to
their dx.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops import causal_conv1d as _conv
from ._comm import exchange
from ._plan import ContextParallel


def _flat(x: Tensor, D: int) -> Tensor:
    """[1, T, D...] -> [T, D]."""
    return x.reshape(x.shape[1], D)


def _user_slots(plan: ContextParallel, W: int) -> tuple[int, int]:
    """(count, offset): local initial-state slots [0, count) of the incoming sequence come from
    its own initial state's slots [offset, offset + count) (positions before the sequence starts)."""
    back = plan.start - plan.global_cu_seqlens[plan.incoming]  # tokens of it before this rank, >= 1
    return max(0, W - back), back


class _CausalConv1dCP(torch.autograd.Function):

    @staticmethod
    def forward(ctx, plan: ContextParallel, activation: str, output_final_state: bool, x, weight, bias, residual,
                h0):
        W, T, D = weight.shape[0], x.shape[1], weight.shape[1]
        xf = _flat(x, D)
        # The halo: tokens before this rank's first one, from the ranks that hold them.
        recv = [(p, xf.new_empty(p.end - p.start, D)) for p in plan.halo_recv]
        exchange([(p.dst, xf[p.start - plan.start: p.end - plan.start]) for p in plan.halo_send],
                 [(p.src, buf) for p, buf in recv], plan.group)
        sdt = h0.dtype if h0 is not None else x.dtype
        h0_loc = None
        if T and (plan.incoming is not None or (h0 is not None and plan.start_rows.numel())):
            h0_loc = plan.local_states(h0, "start", (D, W), sdt, x.device)
            if plan.incoming is not None:
                for p, buf in recv:  # local slot j holds the token W - j before the first
                    h0_loc[0, :, p.slot + 1: p.slot + 1 + buf.shape[0]] = buf.t().to(sdt)
                n, off = _user_slots(plan, W)
                if n and h0 is not None:
                    h0_loc[0, :, :n] = h0[plan.incoming, :, off: off + n]
        want_final = output_final_state and bool(plan.end_rows.numel())
        if T:
            y, final_loc = _conv._fwd_impl(x, weight, bias, residual, h0_loc, plan.cu_seqlens, activation, want_final)
        else:
            y, final_loc = torch.empty(x.shape, dtype=x.dtype, device=x.device), None
        final = x.new_empty(0)
        if output_final_state:
            final = plan.global_states(final_loc, "end", (D, W), x.dtype, x.device, empty_from=h0)
        ctx.plan, ctx.activation, ctx.output_final_state = plan, activation, output_final_state
        ctx.has = (bias is not None, residual is not None, h0 is not None)
        ctx.h0_dtype = sdt
        ctx.save_for_backward(x, weight, bias, h0_loc)
        ctx.set_materialize_grads(False)
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        plan = ctx.plan
        x, weight, bias, h0_loc = ctx.saved_tensors
        has_bias, has_res, has_h0 = ctx.has
        needs = ctx.needs_input_grad
        W, T, D = weight.shape[0], x.shape[1], weight.shape[1]
        if dfinal is not None and dfinal.numel() == 0:
            dfinal = None
        if dy is None:
            dy = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        dht_loc = None
        if T and dfinal is not None and plan.end_rows.numel():
            dht_loc = plan.local_states(dfinal, "end", (D, W), dfinal.dtype, x.device)
        if T:
            dx, dw, db, dh0_loc = _conv._bwd_impl(x, weight, bias, h0_loc, plan.cu_seqlens, dy, dht_loc,
                                                  ctx.activation, True, has_bias, h0_loc is not None)
        else:
            dx = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
            dw = torch.zeros(weight.shape, dtype=weight.dtype, device=x.device)
            db = torch.zeros(bias.shape, dtype=bias.dtype, device=x.device) if has_bias else None
            dh0_loc = None
        # The halo's gradient goes back to the ranks that own its tokens.
        grad_in = [(p, x.new_empty(p.end - p.start, D)) for p in plan.halo_send]
        sends = [(p.src, dh0_loc[0, :, p.slot + 1: p.slot + 1 + p.end - p.start].t().to(x.dtype))
                 for p in plan.halo_recv]
        exchange(sends, [(p.dst, buf) for p, buf in grad_in], plan.group)
        dxf = _flat(dx, D)
        for p, buf in grad_in:
            dxf[p.start - plan.start: p.end - plan.start] += buf
        dh0 = None
        if has_h0 and needs[7]:
            dh0 = plan.global_states(dh0_loc, "start", (D, W), ctx.h0_dtype, x.device, empty_from=dfinal)
            if plan.incoming is not None:
                n, off = _user_slots(plan, W)
                if n:
                    dh0[plan.incoming, :, off: off + n] += dh0_loc[0, :, :n].to(dh0.dtype)
        return (None, None, None, dx, dw if needs[4] else None, db if has_bias and needs[5] else None,
                dy if has_res and needs[6] else None, dh0)


def causal_conv1d_cp(x: Tensor, weight: Tensor, bias, residual, initial_state, activation: str,
                     output_final_state: bool, cp: ContextParallel, cu_seqlens=None):
    """causal_conv1d's cp path (weight already in the [W, D] layout, activation normalised)."""
    op = "causal_conv1d"
    if not isinstance(cp, ContextParallel):
        raise TypeError(f"fusedops: {op}: cp must be a plan made by fusedops.distributed.context_parallel, "
                        f"got {type(cp).__name__}")
    if cu_seqlens is not None:
        raise ValueError(f"fusedops: {op}: with cp the sequences come from the plan; pass cu_seqlens=None")
    if cp.conv_width != weight.shape[0]:
        raise ValueError(f"fusedops: {op}: the plan was built for conv_width={cp.conv_width}, the weight has "
                         f"W={weight.shape[0]} taps (build it with context_parallel(..., conv_width=W))")
    if x.shape[0] != 1 or x.shape[1] != cp.num_tokens:
        raise ValueError(f"fusedops: {op}: with cp x is this rank's tokens of the packed batch, "
                         f"[1, {cp.num_tokens}, D], got {list(x.shape)}")
    if initial_state is not None and initial_state.shape[0] != cp.num_seqs:
        raise ValueError(f"fusedops: {op}: with cp initial_state holds every global sequence: "
                         f"[{cp.num_seqs}, D, W], got {list(initial_state.shape)}")
    y, final = _CausalConv1dCP.apply(cp, activation, bool(output_final_state), x, weight, bias, residual,
                                     initial_state)
    return y, (final if output_final_state else None)
