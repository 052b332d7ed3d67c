"""l2norm (docs/specs/ops.md section 8) in the operator report.

y = x * rstd with rstd = (sum(x**2, -1) + eps) ** -0.5; the forward saves y and rstd, the
backward reads them. Minimum bytes (s = element size of x, N rows of D):
  fwd      read x + write y + write rstd                       = 2*N*D*s + 4*N
  fwd+bwd  fwd + read y + read dy + read rstd + write dx        = 5*N*D*s + 8*N
"""

from __future__ import annotations

import fusedops
import torch

from ..common import Case, Impl, grad_of, peer_status, randn_inputs, row_norm_bytes, shapes_and_dtypes

OP = "l2norm"
EPS = 1e-6

GPU_SHAPES = [(524288, 128)]          # issue 2's target shape (e.g. 4 x 8192 tokens x 16 heads)
GPU_QUICK_SHAPES = [(65536, 128)]
CPU_SHAPES = [(65536, 128)]           # 4096 tokens x 16 heads of 128
CPU_QUICK_SHAPES = [(4096, 128)]
GPU_DTYPES = [torch.bfloat16]
CPU_DTYPES = [torch.float32, torch.bfloat16]


BYTES_NOTE = {
    "fwd": "read x + write y + write rstd",
    "fwd+bwd": "fwd + read y, dy, rstd + write dx",
}


def _fusedops_impl() -> Impl:
    def fwd(inp):
        return {"y": fusedops.l2norm(inp["x"], EPS)}

    def fwd_bwd(inp):
        y = fusedops.l2norm(inp["x_req"], EPS)
        return {"dx": grad_of(y, inp["x_req"], inp["dy"])}

    return Impl("fusedops", fwd, fwd_bwd)


def _eager(x: torch.Tensor) -> torch.Tensor:
    # The way a user writes it: fp32 sum of squares, cast back.
    return (x / torch.sqrt(x.float().pow(2).sum(-1, keepdim=True) + EPS)).to(x.dtype)


def _eager_impl() -> Impl:
    def fwd(inp):
        return {"y": _eager(inp["x"])}

    def fwd_bwd(inp):
        y = _eager(inp["x_req"])
        return {"dx": grad_of(y, inp["x_req"], inp["dy"])}

    return Impl("eager", fwd, fwd_bwd, note="PyTorch eager: fp32 sum of squares, cast back")


def _fla_impl(device) -> Impl:
    note = "flash-linear-attention fla.modules.l2norm.l2norm (Triton)"
    status = peer_status("fla", device)
    if status != "ok":
        return Impl("fla", status=status, note=note)
    state: dict = {}

    def setup():
        from fla.modules.l2norm import l2norm as fla_l2norm

        state["fn"] = fla_l2norm

    def fwd(inp):
        return {"y": state["fn"](inp["x"], EPS)}

    def fwd_bwd(inp):
        y = state["fn"](inp["x_req"], EPS)
        return {"dx": grad_of(y, inp["x_req"], inp["dy"])}

    return Impl("fla", fwd, fwd_bwd, note=note, setup=setup)


def _reference(inp) -> dict:
    x64 = inp["x"].detach().to("cpu", torch.float64).requires_grad_()
    y = fusedops.reference.l2norm(x64, EPS)
    dx = grad_of(y, x64, inp["dy"].detach().to("cpu", torch.float64))
    return {"fwd": {"y": y.detach()}, "fwd+bwd": {"dx": dx}}


def _base(inp) -> dict:
    # The precision policy's baseline: the same formula with every step in the input dtype.
    x = inp["x"].detach().requires_grad_()
    y = x / torch.sqrt((x * x).sum(-1, keepdim=True) + EPS)
    dx = grad_of(y, x, inp["dy"])
    return {"fwd": {"y": y.detach()}, "fwd+bwd": {"dx": dx}}


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    shapes, dtypes = shapes_and_dtypes(globals(), device, quick, dtypes)
    out = []
    for shape in shapes:
        for dtype in dtypes:
            out.append(Case(
                op=OP, shape=shape, dtype=dtype, params={"eps": EPS},
                make_inputs=lambda dev, seed, shape=shape, dtype=dtype: randn_inputs(shape, dtype, dev, seed),
                impls=[_fusedops_impl(), _eager_impl(), _fla_impl(device)],
                reference=_reference, base=_base,
                bytes_moved=row_norm_bytes(shape, dtype), bytes_note=BYTES_NOTE,
            ))
    return out
