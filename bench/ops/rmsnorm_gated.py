"""rmsnorm_gated (docs/specs/ops.md section 5) in the operator report.

Norm before a silu gate, with a weight (FLA ``fused_norm_gate.rms_norm_gated``, the GDN / KDA
output norm): y = x * rstd * w * silu(z); rstd fp32 per row saved. Minimum bytes (s = element
size, N rows of D):
  fwd      read x, z + write y + write rstd (+ read w)                         = 3*N*D*s + 4*N (+ D*s)
  fwd+bwd  fwd + read x, z, dy, rstd + write dx, dz (+ read w, write dw)       = fwd + 5*N*D*s + 4*N (+ 2*D*s)

The report hands the reference only the rows of "x" and "dy", so "x" holds [x | z] side by side
([N, 2D]); the implementations run on separate contiguous x and z.
"""

from __future__ import annotations

import importlib

import fusedops
import torch
import torch.nn.functional as F

from ..common import Case, Impl, peer_status, shapes_and_dtypes

OP = "rmsnorm_gated"
EPS = 1e-6

GPU_SHAPES = [(1048576, 128)]        # issue 6's target shape (e.g. 8 x 8192 tokens x 16 heads)
GPU_QUICK_SHAPES = [(65536, 128)]
CPU_SHAPES = [(32768, 128)]
CPU_QUICK_SHAPES = [(2048, 128)]
GPU_DTYPES = [torch.bfloat16]
CPU_DTYPES = [torch.float32, torch.bfloat16]


def bytes_moved(shape, dtype) -> dict[str, int]:
    n, d = shape
    e = torch.empty(0, dtype=dtype).element_size()
    fwd = 3 * n * d * e + 4 * n + d * e
    return {"fwd": fwd, "fwd+bwd": fwd + 5 * n * d * e + 4 * n + 2 * d * e}


BYTES_NOTE = {
    "fwd": "read x, z, w + write y, rstd",
    "fwd+bwd": "fwd + read x, z, dy, rstd, w + write dx, dz, dw",
}


def weight(d: int, dtype: torch.dtype) -> torch.Tensor:
    """A fixed, non-trivial weight (the same on every device, whatever the seed)."""
    return (1.0 + 0.3 * torch.sin(torch.arange(d, dtype=torch.float64) * 0.7)).to(dtype)


def make_inputs(shape, dtype, device, seed) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    n, d = shape
    xz = torch.randn((n, 2 * d), generator=gen, dtype=torch.float32, device=device).to(dtype)
    dy = torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
    w = weight(d, dtype).to(device)
    inp = {"x": xz, "dy": dy, "xa": xz[:, :d].contiguous(), "za": xz[:, d:].contiguous(), "w": w}
    inp["x_req"] = inp["xa"].detach().requires_grad_()
    inp["z_req"] = inp["za"].detach().requires_grad_()
    inp["w_req"] = w.detach().requires_grad_()
    return inp


def _grads(y, inp, dy):
    dx, dz, _dw = torch.autograd.grad(y, [inp["x_req"], inp["z_req"], inp["w_req"]], dy)
    return {"dx": dx, "dz": dz}


def _fusedops_impl() -> Impl:
    def fwd(inp):
        return {"y": fusedops.rms_norm_gated(inp["xa"], inp["za"], inp["w"], eps=EPS)}

    def fwd_bwd(inp):
        y = fusedops.rms_norm_gated(inp["x_req"], inp["z_req"], inp["w_req"], eps=EPS)
        return _grads(y, inp, inp["dy"])

    return Impl("fusedops", fwd, fwd_bwd)


def _eager(x, z, w):
    # FLA's rms_norm_ref with upcast: fp32 math, cast back.
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS) * w.float()
    return (y * F.silu(z.float())).to(x.dtype)


def _eager_impl() -> Impl:
    def fwd(inp):
        return {"y": _eager(inp["xa"], inp["za"], inp["w"])}

    def fwd_bwd(inp):
        return _grads(_eager(inp["x_req"], inp["z_req"], inp["w_req"]), inp, inp["dy"])

    return Impl("eager", fwd, fwd_bwd, note="PyTorch eager: fp32 upcast composite (FLA's rms_norm_ref)")


def _fla_impl(device) -> Impl:
    note = "flash-linear-attention fused_norm_gate.rms_norm_gated (Triton), activation swish"
    fn = None
    status = "not installed"
    for mod in ("fla.modules.fused_norm_gate", "fla.modules.norm.fused_norm_gate"):
        status = peer_status(mod, device)
        if status == "ok":
            fn = getattr(importlib.import_module(mod), "rms_norm_gated", None)
            if fn is None:
                status = "no rms_norm_gated in " + mod
            break
    if fn is None:
        return Impl("fla", status=status, note=note)

    def call(x, z, w):
        return fn(x, z, w, None, activation="swish", eps=EPS)

    def fwd(inp):
        return {"y": call(inp["xa"], inp["za"], inp["w"])}

    def fwd_bwd(inp):
        return _grads(call(inp["x_req"], inp["z_req"], inp["w_req"]), inp, inp["dy"])

    return Impl("fla", fwd, fwd_bwd, note=note)


def _split(inp):
    xz = inp["x"]
    d = xz.shape[-1] // 2
    return xz[:, :d], xz[:, d:]


def _reference_for(dtype):
    def run(inp) -> dict:
        x, z = _split(inp)
        w_cpu = weight(x.shape[-1], dtype)
        x64 = x.detach().to("cpu", torch.float64).requires_grad_()
        z64 = z.detach().to("cpu", torch.float64).requires_grad_()
        y = fusedops.reference.rms_norm_gated(x64, z64, w_cpu.double(), eps=EPS)
        dx, dz = torch.autograd.grad(y, [x64, z64], inp["dy"].detach().to("cpu", torch.float64))
        return {"fwd": {"y": y.detach()}, "fwd+bwd": {"dx": dx, "dz": dz}}

    return run


def _base_for(dtype):
    def run(inp) -> dict:
        # The precision policy's baseline: the same formula with every step in the input dtype.
        x, z = _split(inp)
        w_cpu = weight(x.shape[-1], dtype)
        x = x.detach().requires_grad_()
        z = z.detach().requires_grad_()
        w = w_cpu.to(x.device, x.dtype)
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * w * F.silu(z)
        dx, dz = torch.autograd.grad(y, [x, z], inp["dy"])
        return {"fwd": {"y": y.detach()}, "fwd+bwd": {"dx": dx, "dz": dz}}

    return run


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    shapes, dtypes = shapes_and_dtypes(globals(), device, quick, dtypes)
    out = []
    for shape in shapes:
        for dtype in dtypes:
            out.append(Case(
                op=OP, shape=shape, dtype=dtype,
                params={"eps": EPS, "activation": "silu", "norm_before_gate": True, "weight": True},
                make_inputs=lambda dev, seed, shape=shape, dtype=dtype: make_inputs(shape, dtype, dev, seed),
                impls=[_fusedops_impl(), _eager_impl(), _fla_impl(device)],
                reference=_reference_for(dtype), base=_base_for(dtype),
                bytes_moved=bytes_moved(shape, dtype), bytes_note=BYTES_NOTE,
            ))
    return out
