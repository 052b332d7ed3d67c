"""fused_cross_entropy_loss (docs/specs/ops.md section 1) in the operator report.

Passes (x = logits [N, V], every label valid):
  fwd      per-row losses (reduction "none") without a gradient: read x once
  fwd+bwd  reduction "mean", loss.backward(): the gradient d loss / d logits [N, V]
Minimum bytes (s = element size of the logits; labels int64, losses fp32):
  fwd      read x + read labels + write the losses            = N*V*s + 12*N
  fwd+bwd  read x + write dlogits (+ labels, loss)            = 2*N*V*s + 8*N + 4

The report hands the reference only row slices of "x" and "dy": "dy" carries each row's label as
a float (one column), so the float64 reference (fusedops.reference) and the base (the PyTorch
composite in the input dtype) see the labels of exactly the rows they check. Because every label
is valid, the "mean" gradient of a row is its "sum" gradient divided by N.

Baselines: PyTorch eager (F.cross_entropy on the logits as given, no upcast) and Liger-Kernel's
LigerCrossEntropyLoss (Triton; it writes the gradient over its input in the forward, so its
logits are restored, untimed, before every call).
"""

from __future__ import annotations

import fusedops
import torch
import torch.nn.functional as F

from ..common import Case, Impl, grad_of, peer_status, shapes_and_dtypes

OP = "fused_cross_entropy_loss"

GPU_SHAPES = [(8192, 128256)]        # issue 5's target: 8192 tokens, Llama-3 vocabulary
GPU_QUICK_SHAPES = [(1024, 128256)]
CPU_SHAPES = [(1024, 32000)]         # 1024 tokens, Llama-2 vocabulary
CPU_QUICK_SHAPES = [(64, 32000)]
GPU_DTYPES = [torch.bfloat16]
CPU_DTYPES = [torch.float32, torch.bfloat16]


def bytes_moved(shape, dtype) -> dict[str, int]:
    n, v = shape
    e = torch.empty(0, dtype=dtype).element_size()
    return {"fwd": n * v * e + 12 * n, "fwd+bwd": 2 * n * v * e + 8 * n + 4}


BYTES_NOTE = {
    "fwd": "read logits + labels, write per-row losses",
    "fwd+bwd": "read logits, write dlogits (+ labels, loss)",
}


def make_inputs(shape, dtype, device, seed) -> dict:
    n, v = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    x = (2.0 * torch.randn(shape, generator=gen, dtype=torch.float32, device=device)).to(dtype)
    labels = torch.randint(0, v, (n,), generator=gen, device=device)
    return {"x": x, "dy": labels.to(torch.float32)[:, None], "labels": labels,
            "x_req": x.detach().clone().requires_grad_(),
            "x_peer": x.detach().clone().requires_grad_()}


def _labels_of(inp) -> torch.Tensor:
    return inp["dy"][:, 0].round().long()


def _fusedops_impl() -> Impl:
    def fwd(inp):
        return {"loss": fusedops.fused_cross_entropy_loss(inp["x"], inp["labels"], reduction="none")}

    def fwd_bwd(inp):
        loss = fusedops.fused_cross_entropy_loss(inp["x_req"], inp["labels"])
        return {"dx": grad_of(loss, inp["x_req"])}

    return Impl("fusedops", fwd, fwd_bwd)


def _eager_impl() -> Impl:
    def fwd(inp):
        return {"loss": F.cross_entropy(inp["x"], inp["labels"], reduction="none")}

    def fwd_bwd(inp):
        loss = F.cross_entropy(inp["x_req"], inp["labels"])
        return {"dx": grad_of(loss, inp["x_req"])}

    return Impl("eager", fwd, fwd_bwd, note="PyTorch eager: F.cross_entropy on the logits as given")


def _liger_impl(device) -> Impl:
    note = ("Liger-Kernel liger_kernel.transformers.LigerCrossEntropyLoss (Triton); overwrites its "
            "input with the gradient, so the logits are restored (untimed) before each call")
    status = peer_status("liger_kernel.transformers", device)
    if status != "ok":
        return Impl("liger", status=status, note=note)
    from liger_kernel.transformers import LigerCrossEntropyLoss

    none_loss = LigerCrossEntropyLoss(reduction="none")
    mean_loss = LigerCrossEntropyLoss(reduction="mean")

    def first(out):
        return out[0] if isinstance(out, (tuple, list)) else getattr(out, "loss", out)

    def fwd(inp):
        with torch.no_grad():
            return {"loss": first(none_loss(inp["x_peer"], inp["labels"]))}

    def fwd_bwd(inp):
        loss = first(mean_loss(inp["x_peer"], inp["labels"]))
        return {"dx": grad_of(loss, inp["x_peer"])}

    def restore(inp):
        with torch.no_grad():
            inp["x_peer"].copy_(inp["x"])

    return Impl("liger", fwd, fwd_bwd, note=note, prepare=restore)


def _reference_fn(n_rows: int):
    def reference(inp) -> dict:
        x64 = inp["x"].detach().to("cpu", torch.float64)
        labels = _labels_of(inp).cpu()
        loss = fusedops.reference.fused_cross_entropy_loss(x64, labels, reduction="none")
        xr = x64.clone().requires_grad_()
        total = fusedops.reference.fused_cross_entropy_loss(xr, labels, reduction="sum")
        (dx,) = torch.autograd.grad(total, xr, torch.tensor(1.0 / n_rows, dtype=torch.float64))
        return {"fwd": {"loss": loss.detach()}, "fwd+bwd": {"dx": dx}}

    return reference


def _base_fn(n_rows: int):
    def base(inp) -> dict:
        x = inp["x"].detach()
        labels = _labels_of(inp)
        loss = F.cross_entropy(x, labels, reduction="none")
        xr = x.clone().requires_grad_()
        total = F.cross_entropy(xr, labels, reduction="sum")
        (dx,) = torch.autograd.grad(total, xr, torch.tensor(1.0 / n_rows, dtype=x.dtype, device=x.device))
        return {"fwd": {"loss": loss}, "fwd+bwd": {"dx": dx}}

    return base


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    shapes, dtypes = shapes_and_dtypes(globals(), device, quick, dtypes)
    out = []
    for shape in shapes:
        for dtype in dtypes:
            out.append(Case(
                op=OP, shape=shape, dtype=dtype, params={"reduction": "none (fwd) / mean (fwd+bwd)"},
                make_inputs=lambda dev, seed, shape=shape, dtype=dtype: make_inputs(shape, dtype, dev, seed),
                impls=[_fusedops_impl(), _eager_impl(), _liger_impl(device)],
                reference=_reference_fn(shape[0]), base=_base_fn(shape[0]),
                bytes_moved=bytes_moved(shape, dtype), bytes_note=BYTES_NOTE,
                ref_row_budget_elems=1 << 20,
            ))
    return out
