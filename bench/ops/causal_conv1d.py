"""causal_conv1d (docs/specs/ops.md section 4) in the operator report.

y = silu(conv(x) + bias) with a depthwise causal filter of width W over x [B, T, D] (no bias,
residual or states here: the ShortConvolution use of GDN / KDA layers). The forward saves x; the
backward recomputes the pre-activation and also produces dweight (timed, not row-checked: it is
a sum over every row). Minimum bytes (s = element size, N = B*T rows of D):
  fwd      read x + write y                                     = 2*N*D*s   (+ weight)
  fwd+bwd  fwd + read x + read dy + write dx                    = 5*N*D*s   (+ weight, dweight)
Rows of this case are whole sequences (the convolution runs along T), so the report checks whole
sequences against the float64 reference: all of them at the quick shapes, the first and the last
at the full GPU shape.
"""

from __future__ import annotations

import dataclasses

import fusedops
import torch
import torch.nn.functional as F

from ..common import Case, Impl, peer_status, shapes_and_dtypes

OP = "causal_conv1d"
W = 4
ACT = "silu"

GPU_SHAPES = [(4, 4096, 8192)]     # issue 6's target shape
GPU_QUICK_SHAPES = [(2, 1024, 2048)]
CPU_SHAPES = [(2, 1024, 1024)]
CPU_QUICK_SHAPES = [(2, 256, 256)]
GPU_DTYPES = [torch.bfloat16]
CPU_DTYPES = [torch.float32, torch.bfloat16]


@dataclasses.dataclass
class ConvCase(Case):
    """A case whose report rows are sequences [T*D] (the op mixes neighbouring time steps)."""

    @property
    def rows(self) -> int:
        return self.shape[0]


def bytes_moved(shape, dtype) -> dict[str, int]:
    B, T, D = shape
    e = torch.empty(0, dtype=dtype).element_size()
    n = B * T * D * e
    w = W * D * e
    return {"fwd": 2 * n + w, "fwd+bwd": 5 * n + 3 * w}


BYTES_NOTE = {
    "fwd": "read x + write y (+ weight)",
    "fwd+bwd": "fwd + read x, dy + write dx (+ weight, dweight)",
}


def _weight(D: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The [W, D] filter of every case: fixed, so that the reference sees the same one."""
    g = torch.Generator().manual_seed(1234)
    return (torch.randn(W, D, generator=g, dtype=torch.float32) * 0.5).to(dtype).to(device)


def make_inputs(shape, dtype, device, seed) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
    dy = torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
    w = _weight(shape[-1], dtype, device)
    return {"x": x, "dy": dy, "x_req": x.detach().requires_grad_(), "w": w,
            "w_req": w.detach().requires_grad_(), "w_dw": w.t().contiguous()}


def _grads(y, inp, dy):
    dx, _dw = torch.autograd.grad(y, (inp["x_req"], inp["w_req"]), dy)
    return dx


def _fusedops_impl() -> Impl:
    def fwd(inp):
        return {"y": fusedops.causal_conv1d(inp["x"], inp["w"], activation=ACT)[0]}

    def fwd_bwd(inp):
        y, _ = fusedops.causal_conv1d(inp["x_req"], inp["w_req"], activation=ACT)
        return {"dx": _grads(y, inp, inp["dy"])}

    return Impl("fusedops", fwd, fwd_bwd)


def _composite(x, w):
    """The way a user writes it with PyTorch: a depthwise F.conv1d padded by W-1 on the left."""
    T = x.shape[1]
    a = F.conv1d(x.transpose(1, 2), w.t().unsqueeze(1), None, padding=W - 1, groups=x.shape[-1])
    return F.silu(a[..., :T]).transpose(1, 2)


def _eager_impl() -> Impl:
    def fwd(inp):
        return {"y": _composite(inp["x"], inp["w"])}

    def fwd_bwd(inp):
        return {"dx": _grads(_composite(inp["x_req"], inp["w_req"]), inp, inp["dy"])}

    return Impl("eager", fwd, fwd_bwd, note="PyTorch eager: depthwise F.conv1d (padding W-1) + F.silu")


def _fla_impl(device) -> Impl:
    note = ("flash-linear-attention fla.modules.convolution.causal_conv1d (Triton backend, weight "
            "[D, W]); its backward also recomputes the pre-activation")
    status = peer_status("fla.modules.convolution", device)
    if status != "ok":
        return Impl("fla", status=status, note=note)
    from fla.modules.convolution import causal_conv1d as fla_causal_conv1d

    w_fla = {}

    def fwd(inp):
        return {"y": fla_causal_conv1d(x=inp["x"], weight=inp["w_dw"], activation=ACT)[0]}

    def fwd_bwd(inp):
        if "w" not in w_fla:
            w_fla["w"] = inp["w_dw"].detach().requires_grad_()
        y, _ = fla_causal_conv1d(x=inp["x_req"], weight=w_fla["w"], activation=ACT)
        dx, _dw = torch.autograd.grad(y, (inp["x_req"], w_fla["w"]), inp["dy"])
        return {"dx": dx}

    return Impl("fla", fwd, fwd_bwd, note=note)


def _reference(shape):
    def run(inp) -> dict:
        # inp["x"], inp["dy"]: the checked sequences as rows [k, T*D]; float64 on the device.
        _, T, D = shape
        dev = inp["x"].device
        x64 = inp["x"].detach().reshape(-1, T, D).to(torch.float64).requires_grad_()
        w64 = _weight(D, torch.float64, dev)
        y = _composite(x64, w64)
        (dx,) = torch.autograd.grad(y, x64, inp["dy"].reshape(-1, T, D).to(torch.float64))
        return {"fwd": {"y": y.detach()}, "fwd+bwd": {"dx": dx}}

    return run


def _base(shape, dtype):
    def run(inp) -> dict:
        # The precision policy's baseline: the same composite in the input dtype.
        _, T, D = shape
        x = inp["x"].detach().reshape(-1, T, D).requires_grad_()
        w = _weight(D, torch.float32, x.device).to(dtype)
        y = _composite(x, w)
        (dx,) = torch.autograd.grad(y, x, inp["dy"].reshape(-1, T, D))
        return {"fwd": {"y": y.detach()}, "fwd+bwd": {"dx": dx}}

    return run


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    shapes, dtypes = shapes_and_dtypes(globals(), device, quick, dtypes)
    out = []
    for shape in shapes:
        for dtype in dtypes:
            out.append(ConvCase(
                op=OP, shape=shape, dtype=dtype, params={"W": W, "activation": ACT},
                make_inputs=lambda dev, seed, shape=shape, dtype=dtype: make_inputs(shape, dtype, dev, seed),
                impls=[_fusedops_impl(), _eager_impl(), _fla_impl(device)],
                reference=_reference(shape), base=_base(shape, dtype),
                bytes_moved=bytes_moved(shape, dtype), bytes_note=BYTES_NOTE,
                # Two whole sequences (the first and the last) at the full GPU shape.
                ref_row_budget_elems=2 * shape[-1] if device.type == "cuda" and not quick
                else 1 << 30,
            ))
    return out
