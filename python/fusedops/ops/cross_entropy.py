"""fused_cross_entropy_loss (docs/specs/ops.md section 1),
as the ops of fusedops._op: an autograd.Function eagerly, torch.library custom ops under
torch.compile.

The forward computes the loss and, in the same pass over the logits, the gradient for an upstream
gradient of 1 (as Liger-Kernel and TransformerEngine do); the backward only rescales it. In eager
mode the rescaling happens in place on the saved gradient and is skipped (on the device, without
a host synchronization) where the factor is exactly 1, so ``loss.backward()`` costs no pass over
the logits; under torch.compile the backward is the functional (out-of-place) op. The in-place
form consumes the saved gradient, so a second backward through the same graph raises
(PyTorch's saved-tensor version check).
"""

import math
from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .._backend import context, rows_view
from .._op import DifferentiableOp, PlainOp

_OP = "fused_cross_entropy_loss"
_EMPTY = (0,)


def _is_eager(*tensors) -> bool:
    """True outside torch.compile / AOT tracing (plain tensors, not fake or functional ones)."""
    if torch.compiler.is_compiling():
        return False
    return all(t is None or type(t) is Tensor for t in tensors)


def _workspace(t: Tensor, rows: int, vocab: int) -> Optional[Tensor]:
    n = _C.cross_entropy_workspace_size(context(_OP, t), rows, vocab)
    return torch.empty(n, dtype=torch.uint8, device=t.device) if n else None


def _loss_shape(labels: Tensor, reduction: str):
    return tuple(labels.shape) if reduction == "none" else ()


def _acc(t: Tensor) -> torch.dtype:
    """dtype of the loss and of the saved loss-weight gradient: float32, float64 for float64
    logits (the reference backend computes in float64)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _run_fwd(logits: Tensor, labels: Tensor, loss_weight: Optional[Tensor], grad: Optional[Tensor],
             ignore_index: int, reduction: str, label_smoothing: float, logit_scale: float,
             logit_softcapping: Optional[float], lse_square_scale: float, want_z_loss: bool,
             want_weight_grad: bool):
    """Allocates the outputs and calls the C++ forward; `grad` is where the gradient goes (a new
    tensor, logits itself for inplace_backward, or None)."""
    dev = logits.device
    rows = math.prod(logits.shape[:-1])
    shape = _loss_shape(labels, reduction)
    acc = _acc(logits)
    loss = torch.empty(shape, dtype=acc, device=dev)
    z_loss = torch.empty(shape, dtype=acc, device=dev) if want_z_loss else None
    glw = torch.empty(labels.shape, dtype=acc, device=dev) if want_weight_grad else None
    lw = loss_weight.contiguous() if loss_weight is not None else None
    x = logits if grad is logits else rows_view(logits)
    _C.fused_cross_entropy_loss_fwd(
        context(_OP, logits), x, labels.contiguous(), lw, loss, z_loss, grad, glw,
        _workspace(logits, rows, logits.shape[-1]), ignore_index, reduction, label_smoothing,
        logit_scale, logit_softcapping, lse_square_scale)
    return loss, z_loss, glw


def _fwd_impl(logits: Tensor, labels: Tensor, loss_weight: Optional[Tensor], ignore_index: int,
              reduction: str, label_smoothing: float, logit_scale: float,
              logit_softcapping: Optional[float], lse_square_scale: float, want_z_loss: bool,
              want_grad: bool, want_weight_grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device) if want_grad else None
    loss, z_loss, glw = _run_fwd(logits, labels, loss_weight, grad, ignore_index, reduction,
                                 label_smoothing, logit_scale, logit_softcapping, lse_square_scale,
                                 want_z_loss, want_weight_grad)
    def empty():  # a distinct placeholder per absent output (returns must not alias)
        return logits.new_empty(_EMPTY, dtype=_acc(logits))
    return (loss, z_loss if z_loss is not None else empty(),
            grad if grad is not None else logits.new_empty(_EMPTY),
            glw if glw is not None else empty())


def _fwd_fake(logits, labels, loss_weight, ignore_index, reduction, label_smoothing, logit_scale,
              logit_softcapping, lse_square_scale, want_z_loss, want_grad, want_weight_grad):
    shape = _loss_shape(labels, reduction)
    f32 = _acc(logits)
    return (logits.new_empty(shape, dtype=f32),
            logits.new_empty(shape if want_z_loss else _EMPTY, dtype=f32),
            logits.new_empty(logits.shape if want_grad else _EMPTY),
            logits.new_empty(labels.shape if want_weight_grad else _EMPTY, dtype=f32))


def _fwd_inplace_impl(logits: Tensor, labels: Tensor, loss_weight: Optional[Tensor], ignore_index: int,
                      reduction: str, label_smoothing: float, logit_scale: float,
                      logit_softcapping: Optional[float], lse_square_scale: float, want_z_loss: bool,
                      want_weight_grad: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The forward of inplace_backward: the gradient replaces the (contiguous) logits."""
    loss, z_loss, glw = _run_fwd(logits, labels, loss_weight, logits, ignore_index, reduction,
                                 label_smoothing, logit_scale, logit_softcapping, lse_square_scale,
                                 want_z_loss, want_weight_grad)
    def empty():
        return logits.new_empty(_EMPTY, dtype=_acc(logits))
    return loss, z_loss if z_loss is not None else empty(), glw if glw is not None else empty()


def _fwd_inplace_fake(logits, labels, loss_weight, ignore_index, reduction, label_smoothing, logit_scale,
                      logit_softcapping, lse_square_scale, want_z_loss, want_weight_grad):
    shape = _loss_shape(labels, reduction)
    f32 = _acc(logits)
    return (logits.new_empty(shape, dtype=f32),
            logits.new_empty(shape if want_z_loss else _EMPTY, dtype=f32),
            logits.new_empty(labels.shape if want_weight_grad else _EMPTY, dtype=f32))


_fwd_inplace = PlainOp("fused_cross_entropy_loss_fwd_inplace", _fwd_inplace_impl, _fwd_inplace_fake,
                       mutates_args=("logits",))


def _grad_loss(g: Tensor) -> Tensor:
    # The upstream gradient of sum()/mean() may be an expanded 0-stride tensor: make it dense
    # (float32, or float64 as the loss of float64 logits).
    return g.to(_acc(g)).contiguous()


def _bwd_impl(grad_loss: Tensor, grad: Optional[Tensor], grad_loss_weight: Optional[Tensor],
              reduction: str, weight_dtype: Optional[torch.dtype]) -> tuple[Tensor, Tensor]:
    """Functional backward: new tensors g * saved."""
    out = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device) if grad is not None else None
    out_w = (torch.empty(grad_loss_weight.shape, dtype=weight_dtype, device=grad_loss_weight.device)
             if grad_loss_weight is not None else None)
    _C.fused_cross_entropy_loss_bwd(context(_OP, grad_loss), _grad_loss(grad_loss), grad, out,
                                    grad_loss_weight, out_w, reduction)
    return (out if out is not None else grad_loss.new_empty(_EMPTY),
            out_w if out_w is not None else grad_loss.new_empty(_EMPTY))


def _bwd_fake(grad_loss, grad, grad_loss_weight, reduction, weight_dtype):
    return (grad.new_empty(grad.shape) if grad is not None else grad_loss.new_empty(_EMPTY),
            grad_loss_weight.new_empty(grad_loss_weight.shape, dtype=weight_dtype)
            if grad_loss_weight is not None else grad_loss.new_empty(_EMPTY))


_bwd = PlainOp("fused_cross_entropy_loss_bwd", _bwd_impl, _bwd_fake)


def _bwd_inplace_impl(grad_loss: Tensor, grad: Optional[Tensor], grad_loss_weight: Optional[Tensor],
                      reduction: str) -> None:
    """Eager backward: saved *= g in place (rows whose factor is 1 are skipped)."""
    _C.fused_cross_entropy_loss_bwd(context(_OP, grad_loss), _grad_loss(grad_loss), grad, grad,
                                    grad_loss_weight, grad_loss_weight, reduction)


def _bwd_inplace_fake(grad_loss, grad, grad_loss_weight, reduction):
    return None


_bwd_inplace = PlainOp("fused_cross_entropy_loss_bwd_inplace", _bwd_inplace_impl, _bwd_inplace_fake,
                       mutates_args=("grad", "grad_loss_weight"))


def _unit_upstream(g: Tensor) -> bool:
    """True for an upstream gradient of exactly 1 held on the CPU (``loss.backward()`` of a
    scalar loss): the saved gradients are already the answer, so the eager backward skips the
    in-place call, which would touch nothing (bench/notes/ARCHIVE.md, stop 61), and only bumps
    the saved tensors' versions as that call does (PlainOp.mark_mutated), so a second backward
    through the same graph still raises. Read only on the CPU, where it needs no device
    synchronisation."""
    return g.is_cpu and g.numel() == 1 and g.item() == 1.0


def _rescale(ctx, grad_loss: Tensor, grad: Optional[Tensor], glw: Optional[Tensor]):
    """g * (saved gradients): in place in eager mode, functional when traced."""
    if _is_eager(grad_loss, grad, glw):
        if _unit_upstream(grad_loss):
            _bwd_inplace.mark_mutated(grad_loss, grad, glw, ctx.reduction)
        else:
            _bwd_inplace(grad_loss, grad, glw, ctx.reduction)
        dlw = glw.to(ctx.weight_dtype) if glw is not None else None
        return grad, dlw
    out, out_w = _bwd(grad_loss, grad, glw, ctx.reduction, ctx.weight_dtype)
    return (out if grad is not None else None), (out_w if glw is not None else None)


def _setup(ctx, inputs, output):
    loss_weight, reduction, want_grad, want_weight_grad = inputs[2], inputs[4], inputs[10], inputs[11]
    ctx.reduction = reduction
    ctx.want_grad, ctx.want_weight_grad = want_grad, want_weight_grad
    ctx.weight_dtype = loss_weight.dtype if loss_weight is not None else torch.float32
    # The saved gradient is an output too: without this, autograd would hand the backward a
    # zero-filled [N, V] "gradient" for it.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[2], output[3])


def _backward(ctx, grad_loss, _g_z, _g_grad, _g_glw):
    if grad_loss is None:
        return (None,) * 12
    grad, glw = ctx.saved_tensors
    dlogits, dlw = _rescale(ctx, grad_loss, grad if ctx.want_grad else None,
                            glw if ctx.want_weight_grad else None)
    return dlogits, None, dlw, None, None, None, None, None, None, None, None, None


_fwd = DifferentiableOp("fused_cross_entropy_loss_fwd", _fwd_impl, _fwd_fake, _setup, _backward)


class _InplaceBackward(torch.autograd.Function):
    """inplace_backward=True (eager): the gradient is written over the logits in the forward."""

    @staticmethod
    def forward(ctx, logits, labels, loss_weight, ignore_index, reduction, label_smoothing,
                logit_scale, logit_softcapping, lse_square_scale, want_z_loss, want_weight_grad):
        loss, z_loss, glw = _fwd_inplace(logits, labels, loss_weight, ignore_index, reduction,
                                         label_smoothing, logit_scale, logit_softcapping,
                                         lse_square_scale, want_z_loss, want_weight_grad)
        ctx.reduction = reduction
        ctx.want_weight_grad = want_weight_grad
        ctx.weight_dtype = loss_weight.dtype if loss_weight is not None else torch.float32
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, glw)
        ctx.mark_non_differentiable(z_loss, glw)
        return loss, z_loss, glw

    @staticmethod
    def backward(ctx, grad_loss, _g_z, _g_glw):
        if grad_loss is None:
            return (None,) * 11
        grad, glw = ctx.saved_tensors
        dlogits, dlw = _rescale(ctx, grad_loss, grad, glw if ctx.want_weight_grad else None)
        return dlogits, None, dlw, None, None, None, None, None, None, None, None


def softcap_alias(op: str, logit_softcapping: Optional[float], softcap: Optional[float]):
    """The soft cap from its name ``logit_softcapping`` (FLA, fusedops) or its alias ``softcap``
    (Liger); both given is an error."""
    if softcap is None:
        return logit_softcapping
    if logit_softcapping is not None:
        raise TypeError(f"fusedops: {op}: pass the soft cap as logit_softcapping or as its alias "
                        f"softcap, not both")
    return softcap


def fused_cross_entropy_loss(logits: Tensor, labels: Tensor, loss_weight: Optional[Tensor] = None,
                             *, ignore_index: int = -100, reduction: Optional[str] = None,
                             label_smoothing: float = 0.0, logit_scale: float = 1.0,
                             logit_softcapping: Optional[float] = None,
                             lse_square_scale: float = 0.0, return_z_loss: bool = False,
                             inplace_backward: bool = False, softcap: Optional[float] = None,
                             process_group=None, vocab_start: Optional[int] = None):
    """Cross-entropy over the last dimension of ``logits`` with the gradient computed in the
    forward pass (docs/specs/ops.md section 1).

    Per row: ``z = logit_scale * logits`` (then ``s * tanh(z / s)`` with
    ``logit_softcapping=s``), ``l = (1-eps) (lse - z_y) + eps (lse - mean z) +
    lse_square_scale * lse**2`` (``eps = label_smoothing``), 0 where ``labels == ignore_index``.
    ``reduction``: ``"sum"`` (``sum w_i l_i``, the default when ``loss_weight`` is given, as in
    MindSpeed), ``"mean"`` (``sum w_i l_i / max(1, #non-ignored)``, the default otherwise, as in
    FLA) or ``"none"`` (``w_i l_i`` per row, labels' shape). The loss is float32.

    * ``logits``: ``[..., V]`` float32 / bfloat16 / float16 (float64 runs on the reference
      backend); ``labels``: int32 / int64, one per row; ``loss_weight``: one per row, floating,
      differentiable.
    * ``return_z_loss``: also return the same reduction of ``lse_square_scale * lse**2``
      (unweighted, for logging; not differentiable).
    * ``inplace_backward``: the gradient overwrites ``logits`` (which must be contiguous and
      must not be needed afterwards), saving a ``[N, V]`` buffer. Ignored under torch.compile.
    * ``softcap``: an alias of ``logit_softcapping`` (the name :func:`fusedops.chunk_loss` also
      uses).

    * ``process_group``: the vocabulary is sharded over this group (``fusedops.distributed``):
      ``logits`` holds entries ``[vocab_start, vocab_start + V_shard)`` of every row (default
      ``vocab_start``: the shards in rank order); the loss is over the whole vocabulary and the
      same on every rank; the gradient is computed in the backward.

    Labels outside ``[0, V)`` that are not ``ignore_index`` raise ``ValueError`` on the CPU; on
    CUDA they give a NaN loss for their row and a report that ``fusedops.check_errors()`` (or a
    later call) raises; inside ``fusedops.debug_checks()`` the CUDA call raises at once. The backward rescales the saved gradient
    in place, so backpropagating twice through the same call raises ``RuntimeError``.
    """
    logit_softcapping = softcap_alias(_OP, logit_softcapping, softcap)
    if reduction is None:
        reduction = "sum" if loss_weight is not None else "mean"
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"fusedops: {_OP}: reduction must be one of 'none', 'sum', 'mean', got "
                         f"{reduction!r}")
    if logits.dim() < 2:
        raise ValueError(f"fusedops: {_OP}: logits must have rank >= 2, got rank {logits.dim()} "
                         f"with shape {list(logits.shape)}")
    if process_group is not None:
        from ..distributed._vocab import cross_entropy_tp
        return cross_entropy_tp(logits, labels, loss_weight, ignore_index=ignore_index, reduction=reduction,
                                label_smoothing=label_smoothing, logit_scale=logit_scale,
                                logit_softcapping=logit_softcapping, lse_square_scale=lse_square_scale,
                                return_z_loss=return_z_loss, inplace_backward=inplace_backward,
                                process_group=process_group, vocab_start=vocab_start)
    grad_on = torch.is_grad_enabled()
    want_grad = grad_on and logits.requires_grad
    want_weight_grad = grad_on and loss_weight is not None and loss_weight.requires_grad
    args = (int(ignore_index), reduction, float(label_smoothing), float(logit_scale),
            None if logit_softcapping is None else float(logit_softcapping),
            float(lse_square_scale), bool(return_z_loss))
    if inplace_backward and want_grad and _is_eager(logits, labels, loss_weight):
        loss, z_loss, _ = _InplaceBackward.apply(logits, labels, loss_weight, *args,
                                                 want_weight_grad)
    else:
        loss, z_loss, _, _ = _fwd(logits, labels, loss_weight, *args, want_grad, want_weight_grad)
    if return_z_loss:
        return loss, z_loss.detach()
    return loss


class FusedCrossEntropyLossFunction(torch.autograd.Function):
    """The MindSpeed-Ops entry point, a ``torch.autograd.Function``:
    ``FusedCrossEntropyLossFunction.apply(logits, loss_weight, labels, ignore_index=-100)``
    returns the float32 scalar ``sum_i CE_i * loss_weight_i`` (``loss_weight`` None: weight 1);
    rows whose label is ``ignore_index`` contribute 0. Its backward gives the gradients of
    ``logits`` and of ``loss_weight`` (those of :func:`fused_cross_entropy_loss`, computed in the
    forward)."""

    @staticmethod
    def forward(ctx, logits: Tensor, loss_weight: Optional[Tensor], labels: Tensor,
                ignore_index: int = -100) -> Tensor:
        x = logits.detach().requires_grad_(logits.requires_grad)
        w = None if loss_weight is None else loss_weight.detach().requires_grad_(
            loss_weight.requires_grad)
        with torch.enable_grad():
            loss = fused_cross_entropy_loss(x, labels, w, ignore_index=ignore_index, reduction="sum")
        ctx.inner = (x, w, loss)
        return loss.detach()

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, w, loss = ctx.inner
        ctx.inner = None
        wrt = [t for t in (x, w) if t is not None and t.requires_grad]
        got = list(torch.autograd.grad(loss, wrt, grad)) if wrt and loss.requires_grad else []
        dx = got.pop(0) if x.requires_grad else None
        dw = got.pop(0) if w is not None and w.requires_grad else None
        return dx, dw, None, None
