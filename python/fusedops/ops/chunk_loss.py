"""chunk_loss (docs/specs/ops.md section 10): the LM head and cross-entropy without materialized logits, as
the ops of fusedops._op (an autograd.Function eagerly, torch.library custom ops under torch.compile).

The forward runs the whole computation chunk by chunk over the tokens (logits GEMM, fused
cross-entropy, two gradient GEMMs) and keeps d_hidden and d_weight; the backward only rescales
them by the upstream gradient (in place in eager mode, skipped on the device when it is 1;
functional under torch.compile). A second backward through the same call raises.
"""

from typing import Optional, Union

import torch
from torch import Tensor

from .. import _C
from .._backend import context, debug_checks_enabled, rows_view
from .._op import DifferentiableOp, PlainOp
from .cross_entropy import _acc, _grad_loss, _is_eager, _unit_upstream, softcap_alias

_OP = "chunk_loss"
_EMPTY = (0,)


def _prepare(hidden: Tensor, labels: Tensor, alpha):
    """(hidden, labels, scalar alpha, per-sample alpha tensor) in the form the C++ op takes. A
    tensor alpha divides per sample: [B] for hidden [B, S, H]; a 0-d tensor is read on the device
    (no host synchronization) by treating the rows as one sample."""
    alpha_t = None
    alpha_s = 1.0
    if isinstance(alpha, Tensor):
        alpha_t = alpha.to(torch.float32)
        if alpha.dim() == 0:
            hidden = hidden.reshape(1, -1, hidden.shape[-1])
            labels = labels.reshape(1, -1)
            alpha_t = alpha_t.reshape(1)
        alpha_t = alpha_t.contiguous()
    elif alpha is not None:
        alpha_s = float(alpha)
    return hidden, labels, alpha_s, alpha_t


def _run_fwd(hidden, weight, bias, labels, loss_weight, alpha_s, alpha_t, grad_weight, accumulate,
             ignore_index, reduction, label_smoothing, logit_scale, softcap, lse_square_scale,
             chunk_size, memory_budget, want_z_loss, want_grad_hidden, want_weight_grad):
    dev = hidden.device
    h = rows_view(hidden)
    w = weight.contiguous()
    acc = _acc(hidden)
    loss = torch.empty((), dtype=acc, device=dev)
    z_loss = torch.empty((), dtype=acc, device=dev) if want_z_loss else None
    dh = torch.empty(hidden.shape, dtype=hidden.dtype, device=dev) if want_grad_hidden else None
    glw = torch.empty(labels.shape, dtype=acc, device=dev) if want_weight_grad else None
    ctx = context(_OP, hidden)
    n = 0 if hidden.is_cpu else _C.chunk_loss_workspace_size(ctx, h, w, dh, grad_weight, accumulate,
                                                                 chunk_size, memory_budget)
    ws = torch.empty(n, dtype=torch.uint8, device=dev) if n else None
    _C.chunk_loss_fwd(ctx, h, w, bias, labels.contiguous(),
                      loss_weight.contiguous() if loss_weight is not None else None, alpha_s, alpha_t,
                      loss, z_loss, dh, grad_weight, accumulate, glw, chunk_size, memory_budget, ws,
                      ignore_index, reduction, label_smoothing, logit_scale, softcap, lse_square_scale)
    return loss, z_loss, dh, glw


def _fwd_impl(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], labels: Tensor,
         loss_weight: Optional[Tensor], alpha: float, alpha_per_sample: Optional[Tensor],
         ignore_index: int, reduction: str, label_smoothing: float, logit_scale: float,
         softcap: Optional[float], lse_square_scale: float, chunk_size: int, memory_budget: int,
         want_z_loss: bool, want_grad_hidden: bool, want_grad_weight: bool,
         want_weight_grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device) if want_grad_weight else None
    loss, z_loss, dh, glw = _run_fwd(hidden, weight, bias, labels, loss_weight, alpha,
                                     alpha_per_sample, dw, False, ignore_index, reduction,
                                     label_smoothing, logit_scale, softcap, lse_square_scale,
                                     chunk_size, memory_budget, want_z_loss, want_grad_hidden,
                                     want_weight_grad)
    def f32():  # a distinct placeholder per absent output (returns must not alias)
        return hidden.new_empty(_EMPTY, dtype=_acc(hidden))
    return (loss, z_loss if z_loss is not None else f32(),
            dh if dh is not None else hidden.new_empty(_EMPTY),
            dw if dw is not None else weight.new_empty(_EMPTY), glw if glw is not None else f32())


def _fwd_fake(hidden, weight, bias, labels, loss_weight, alpha, alpha_per_sample, ignore_index, reduction,
      label_smoothing, logit_scale, softcap, lse_square_scale, chunk_size, memory_budget,
      want_z_loss, want_grad_hidden, want_grad_weight, want_weight_grad):
    f32 = _acc(hidden)
    return (hidden.new_empty((), dtype=f32), hidden.new_empty(() if want_z_loss else _EMPTY, dtype=f32),
            hidden.new_empty(hidden.shape if want_grad_hidden else _EMPTY),
            weight.new_empty(weight.shape if want_grad_weight else _EMPTY),
            hidden.new_empty(labels.shape if want_weight_grad else _EMPTY, dtype=f32))


def _fwd_accumulate_impl(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], labels: Tensor,
                    loss_weight: Optional[Tensor], alpha: float, alpha_per_sample: Optional[Tensor],
                    grad_weight_buffer: Tensor, ignore_index: int, reduction: str,
                    label_smoothing: float, logit_scale: float, softcap: Optional[float],
                    lse_square_scale: float, chunk_size: int, memory_budget: int, want_z_loss: bool,
                    want_grad_hidden: bool, want_weight_grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward that adds d_weight into a caller's fp32 buffer."""
    loss, z_loss, dh, glw = _run_fwd(hidden, weight, bias, labels, loss_weight, alpha,
                                     alpha_per_sample, grad_weight_buffer, True, ignore_index,
                                     reduction, label_smoothing, logit_scale, softcap,
                                     lse_square_scale, chunk_size, memory_budget, want_z_loss,
                                     want_grad_hidden, want_weight_grad)
    def f32():
        return hidden.new_empty(_EMPTY, dtype=_acc(hidden))
    return (loss, z_loss if z_loss is not None else f32(),
            dh if dh is not None else hidden.new_empty(_EMPTY), glw if glw is not None else f32())


def _fwd_accumulate_fake(hidden, weight, bias, labels, loss_weight, alpha, alpha_per_sample, grad_weight_buffer,
      ignore_index, reduction, label_smoothing, logit_scale, softcap, lse_square_scale, chunk_size,
      memory_budget, want_z_loss, want_grad_hidden, want_weight_grad):
    f32 = _acc(hidden)
    return (hidden.new_empty((), dtype=f32), hidden.new_empty(() if want_z_loss else _EMPTY, dtype=f32),
            hidden.new_empty(hidden.shape if want_grad_hidden else _EMPTY),
            hidden.new_empty(labels.shape if want_weight_grad else _EMPTY, dtype=f32))


def _bwd_impl(grad_loss: Tensor, grad_hidden: Optional[Tensor], grad_weight: Optional[Tensor],
         grad_loss_weight: Optional[Tensor], weight_dtype: Optional[torch.dtype]
         ) -> tuple[Tensor, Tensor, Tensor]:
    """Functional backward: new tensors g * saved."""
    def like(t, dtype=None):
        return torch.empty(t.shape, dtype=dtype or t.dtype, device=t.device) if t is not None else None
    dh, dw, dlw = like(grad_hidden), like(grad_weight), like(grad_loss_weight, weight_dtype)
    _C.chunk_loss_bwd(context(_OP, grad_loss), _grad_loss(grad_loss), grad_hidden, dh, grad_weight,
                      dw, grad_loss_weight, dlw)
    return tuple(t if t is not None else grad_loss.new_empty(_EMPTY) for t in (dh, dw, dlw))


def _bwd_fake(grad_loss, grad_hidden, grad_weight, grad_loss_weight, weight_dtype):
    def empty():
        return grad_loss.new_empty(_EMPTY)
    return (grad_hidden.new_empty(grad_hidden.shape) if grad_hidden is not None else empty(),
            grad_weight.new_empty(grad_weight.shape) if grad_weight is not None else empty(),
            grad_loss_weight.new_empty(grad_loss_weight.shape, dtype=weight_dtype)
            if grad_loss_weight is not None else empty())


def _bwd_inplace_impl(grad_loss: Tensor, grad_hidden: Optional[Tensor], grad_weight: Optional[Tensor],
                 grad_loss_weight: Optional[Tensor]) -> None:
    """Eager backward: saved *= g in place (nothing is touched when g == 1)."""
    _C.chunk_loss_bwd(context(_OP, grad_loss), _grad_loss(grad_loss), grad_hidden, grad_hidden,
                      grad_weight, grad_weight, grad_loss_weight, grad_loss_weight)


def _bwd_inplace_fake(grad_loss, grad_hidden, grad_weight, grad_loss_weight):
    return None


_fwd_accumulate = PlainOp("chunk_loss_fwd_accumulate", _fwd_accumulate_impl, _fwd_accumulate_fake,
                          mutates_args=("grad_weight_buffer",))
_bwd = PlainOp("chunk_loss_bwd", _bwd_impl, _bwd_fake)
_bwd_inplace = PlainOp("chunk_loss_bwd_inplace", _bwd_inplace_impl, _bwd_inplace_fake,
                       mutates_args=("grad_hidden", "grad_weight", "grad_loss_weight"))


def _rescale(ctx, grad_loss, dh, dw, glw):
    if _is_eager(grad_loss, dh, dw, glw):
        if _unit_upstream(grad_loss):
            _bwd_inplace.mark_mutated(grad_loss, dh, dw, glw)
        else:
            _bwd_inplace(grad_loss, dh, dw, glw)
        return dh, dw, glw.to(ctx.weight_dtype) if glw is not None else None
    out = _bwd(grad_loss, dh, dw, glw, ctx.weight_dtype)
    return tuple(o if s is not None else None for o, s in zip(out, (dh, dw, glw)))


def _setup(ctx, inputs, output):
    loss_weight = inputs[4]
    ctx.want = inputs[16:19]  # grad_hidden, grad_weight, loss-weight gradient
    ctx.weight_dtype = loss_weight.dtype if loss_weight is not None else torch.float32
    # The saved gradients are outputs too: without this, autograd would hand the backward
    # zero-filled "gradients" of their sizes ([V, H] for the weight).
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[2], output[3], output[4])


def _backward(ctx, grad_loss, _g_z, _g_dh, _g_dw, _g_glw):
    if grad_loss is None:
        return (None,) * 19
    saved = ctx.saved_tensors
    dh, dw, glw = (t if want else None for t, want in zip(saved, ctx.want))
    dh, dw, dlw = _rescale(ctx, grad_loss, dh, dw, glw)
    return (dh, dw, None, None, dlw) + (None,) * 14


_fwd = DifferentiableOp("chunk_loss_fwd", _fwd_impl, _fwd_fake, _setup, _backward)


class _Accumulate(torch.autograd.Function):
    """grad_weight_buffer given (eager): d_weight is added to the buffer in the forward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, loss_weight, alpha, alpha_per_sample, buffer,
                *rest):
        want_grad_hidden, want_weight_grad = rest[-2], rest[-1]
        loss, z_loss, dh, glw = _fwd_accumulate(hidden, weight, bias, labels, loss_weight, alpha,
                                                alpha_per_sample, buffer, *rest)
        ctx.want = (want_grad_hidden, False, want_weight_grad)
        ctx.weight_dtype = loss_weight.dtype if loss_weight is not None else torch.float32
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(dh, glw)
        ctx.mark_non_differentiable(z_loss)
        return loss, z_loss

    @staticmethod
    def backward(ctx, grad_loss, _g_z):
        if grad_loss is None:
            return (None,) * 19
        dh, glw = ctx.saved_tensors
        if grad_loss.is_cpu or debug_checks_enabled():
            if bool(grad_loss != 1):
                raise RuntimeError(
                    "fusedops: chunk_loss: with grad_weight_buffer the weight gradient is added "
                    "to the buffer in the forward for an upstream gradient of 1, but the upstream "
                    f"gradient is {float(grad_loss)}; scale the loss after the buffer is used or "
                    "leave grad_weight_buffer unset")
        dh, _, dlw = _rescale(ctx, grad_loss, dh if ctx.want[0] else None, None,
                              glw if ctx.want[2] else None)
        return (dh, None, None, None, dlw) + (None,) * 14


def chunk_loss(hidden: Tensor, weight: Tensor, labels: Tensor, loss_weight: Optional[Tensor] = None,
               *, chunk_size: Optional[int] = None, ignore_index: int = -100, reduction: str = "sum",
               alpha: Union[None, float, Tensor] = None, label_smoothing: float = 0.0,
               lse_square_scale: float = 0.0, logit_softcapping: Optional[float] = None,
               bias: Optional[Tensor] = None, logit_scale: float = 1.0,
               memory_budget: Optional[int] = None, return_z_loss: bool = False,
               grad_weight_buffer: Optional[Tensor] = None, softcap: Optional[float] = None,
               process_group=None, vocab_start: Optional[int] = None):
    """``CE(hidden @ weight.T)`` computed in chunks of tokens so that the ``[N, V]`` logits never
    exist (docs/specs/ops.md section 10, MindSpeed-MM's ChunkLoss with the loss of section 1).

    * ``hidden``: ``[B, S, H]`` or ``[N, H]``; ``weight``: ``[V, H]`` (same dtype); ``labels``:
      hidden's shape without ``H`` (already shifted); ``loss_weight``: per token, differentiable.
    * ``reduction``: ``"sum"`` (default, MindSpeed) or ``"mean"`` (over the non-ignored tokens of
      the whole batch). ``alpha``: MindSpeed's normaliser, the loss is divided by it; a ``[B]``
      tensor divides each sample's rows by its own alpha.
    * The cross-entropy options (``ignore_index``, ``label_smoothing``, ``lse_square_scale``
      z-loss, ``logit_softcapping``, ``logit_scale``) are those of
      :func:`fused_cross_entropy_loss`; ``softcap`` is an alias of ``logit_softcapping``.
    * ``chunk_size``: tokens per chunk; by default chosen so that the per-chunk logits and
      gradient buffers fit ``memory_budget`` bytes (default 2 GiB on CUDA, 32 MiB on the CPU).
      On CUDA with 16-bit operands the budget goes to the 16-bit gradient chunk first and the
      fp32 logits are computed in sub-chunks of it (see the family README). On CUDA, a call that
      returns a 16-bit weight gradient without ``chunk_size`` or ``memory_budget`` keeps its
      memory to Liger-Kernel's (one logits chunk of about ``N x H`` values besides the gradients;
      the compact plan of the family README: 16-bit logits, the weight gradient accumulated in
      its own dtype); give ``memory_budget`` (or ``grad_weight_buffer``) for the fp32 plan.
    * ``grad_weight_buffer``: an fp32 ``[V, H]`` tensor (e.g. a ``main_grad``) that the weight
      gradient is added to during the forward instead of being returned through autograd; the
      upstream gradient must then be 1 (checked where that needs no synchronization: CPU, or
      inside ``fusedops.debug_checks()``).
    * ``bias`` is rejected (``ValueError``), as in MindSpeed.
    * ``process_group``: ``weight`` is this rank's shard ``[V_shard, H]`` of a vocabulary sharded
      over the group (``fusedops.distributed``; rows ``[vocab_start, vocab_start + V_shard)``,
      default: the shards in rank order). The loss is the same on every rank; the gradients are
      computed in the backward (the logits chunks again), d_hidden summed over the group.

    Returns the float32 scalar loss (and the z-loss, not differentiable, with ``return_z_loss``).
    """
    softcap = softcap_alias(_OP, logit_softcapping, softcap)
    if reduction not in ("sum", "mean"):
        raise ValueError(f"fusedops: {_OP}: reduction must be 'sum' or 'mean' (the weight "
                         f"gradient cannot be rescaled per row after the forward), got {reduction!r}")
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"fusedops: {_OP}: chunk_size must be > 0 (or None to choose it from "
                         f"memory_budget), got {chunk_size}")
    if process_group is not None:
        if bias is not None:
            raise ValueError(f"fusedops: {_OP}: bias must be None (MindSpeed's chunk loss has none)")
        from ..distributed._vocab import chunk_loss_tp
        return chunk_loss_tp(hidden, weight, labels, loss_weight, chunk_size=chunk_size, ignore_index=ignore_index,
                             reduction=reduction, alpha=alpha, label_smoothing=label_smoothing,
                             lse_square_scale=lse_square_scale, softcap=softcap, logit_scale=logit_scale,
                             memory_budget=memory_budget, return_z_loss=return_z_loss,
                             grad_weight_buffer=grad_weight_buffer, process_group=process_group,
                             vocab_start=vocab_start)
    h, lab, alpha_s, alpha_t = _prepare(hidden, labels, alpha)
    grad_on = torch.is_grad_enabled()
    want_dh = grad_on and hidden.requires_grad
    want_dw = grad_on and weight.requires_grad and grad_weight_buffer is None
    want_lw = grad_on and loss_weight is not None and loss_weight.requires_grad
    lw = loss_weight.reshape(lab.shape) if loss_weight is not None and loss_weight.shape != lab.shape \
        else loss_weight
    opts = (int(ignore_index), reduction, float(label_smoothing), float(logit_scale),
            None if softcap is None else float(softcap), float(lse_square_scale),
            int(chunk_size or 0), int(memory_budget or 0), bool(return_z_loss))
    if grad_weight_buffer is not None:
        loss, z_loss = _Accumulate.apply(h, weight, bias, lab, lw, alpha_s, alpha_t, grad_weight_buffer,
                                         *opts, want_dh, want_lw)
    else:
        loss, z_loss, _, _, _ = _fwd(h, weight, bias, lab, lw, alpha_s, alpha_t, *opts, want_dh,
                                     want_dw, want_lw)
    if return_z_loss:
        return loss, z_loss.detach()
    return loss
