"""rmsnorm_without_weight (docs/specs/ops.md section 2) in the operator report.

Mode: return_normalized=True, outputs y = x * rstd (x's dtype) and rstd (float32, one per row).
Minimum bytes (s = element size of x, N rows of D):
  fwd      read x + write y + write rstd                       = 2*N*D*s + 4*N
  fwd+bwd  fwd + read x + read dy + read rstd + write dx        = 5*N*D*s + 8*N
"""

from __future__ import annotations

import inspect

import fusedops
import torch

from ..common import Case, Impl, grad_of, peer_status, randn_inputs, row_norm_bytes, shapes_and_dtypes

OP = "rmsnorm_without_weight"
EPS = 1e-6

GPU_SHAPES = [(32768, 4096)]          # issue 2's target shape
GPU_QUICK_SHAPES = [(4096, 4096)]
CPU_SHAPES = [(4096, 4096)]           # 4096 tokens of a 4096-wide hidden state
CPU_QUICK_SHAPES = [(256, 1024)]
GPU_DTYPES = [torch.bfloat16]
CPU_DTYPES = [torch.float32, torch.bfloat16]


BYTES_NOTE = {
    "fwd": "read x + write y + write rstd",
    "fwd+bwd": "fwd + read x, dy, rstd + write dx",
}


def _fusedops_impl() -> Impl:
    def fwd(inp):
        y, rstd = fusedops.rmsnorm_without_weight(inp["x"], EPS, return_normalized=True)
        return {"y": y, "rstd": rstd}

    def fwd_bwd(inp):
        y, _ = fusedops.rmsnorm_without_weight(inp["x_req"], EPS, return_normalized=True)
        return {"dx": grad_of(y, inp["x_req"], inp["dy"])}

    return Impl("fusedops", fwd, fwd_bwd)


def _eager(x: torch.Tensor):
    # The way a user writes it (HF LlamaRMSNorm without the weight): fp32 statistics, cast back.
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
    return (x * rstd).to(x.dtype), rstd


def _eager_impl() -> Impl:
    def fwd(inp):
        y, rstd = _eager(inp["x"])
        return {"y": y, "rstd": rstd}

    def fwd_bwd(inp):
        y, _ = _eager(inp["x_req"])
        return {"dx": grad_of(y, inp["x_req"], inp["dy"])}

    return Impl("eager", fwd, fwd_bwd, note="PyTorch eager: fp32 statistics, cast back")


def _liger_impls(shape, dtype, device) -> list[Impl]:
    status = peer_status("liger_kernel", device)
    variants = [
        ("liger", {}, "Liger-Kernel LigerRMSNorm with a weight of ones (its backward also computes dW)"),
        ("liger-nw", {"elementwise_affine": False},
         "Liger-Kernel LigerRMSNorm(elementwise_affine=False): no weight (newer Liger versions)"),
    ]
    if status != "ok":
        return [Impl("liger", status=status, note=variants[0][2])]
    impls = []
    for name, kwargs, note in variants:
        # Liger's backward writes dx into the incoming gradient (in_place=True, its default),
        # so it gets its own dy, restored before every call (untimed).
        state: dict = {}

        def setup(kwargs=kwargs, state=state):
            from liger_kernel.transformers.rms_norm import LigerRMSNorm

            params = inspect.signature(LigerRMSNorm.__init__).parameters
            if any(k not in params for k in kwargs):
                raise RuntimeError(f"this Liger-Kernel has no LigerRMSNorm({', '.join(kwargs)})")
            mod = LigerRMSNorm(shape[-1], eps=EPS, **kwargs).to(device=device, dtype=dtype)
            if getattr(mod, "weight", None) is not None:
                with torch.no_grad():
                    mod.weight.fill_(1.0)
            state["mod"] = mod

        def prepare(inp, state=state):
            if "dy" not in state:
                state["dy"] = torch.empty_like(inp["dy"])
            state["dy"].copy_(inp["dy"])

        def fwd(inp, state=state):
            return {"y": state["mod"](inp["x"])}

        def fwd_bwd(inp, state=state):
            y = state["mod"](inp["x_req"])
            return {"dx": grad_of(y, inp["x_req"], state["dy"])}

        impls.append(Impl(name, fwd, fwd_bwd, note=note, prepare=prepare, setup=setup))
    return impls


def _reference(inp) -> dict:
    x64 = inp["x"].detach().to("cpu", torch.float64).requires_grad_()
    y, rstd = fusedops.reference.rmsnorm_without_weight(x64, EPS, return_normalized=True)
    dx = grad_of(y, x64, inp["dy"].detach().to("cpu", torch.float64))
    return {"fwd": {"y": y.detach(), "rstd": rstd.detach()}, "fwd+bwd": {"dx": dx}}


def _base(inp) -> dict:
    # The precision policy's baseline: the same formula with every step in the input dtype.
    x = inp["x"].detach().requires_grad_()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    y = x * rstd
    dx = grad_of(y, x, inp["dy"])
    return {"fwd": {"y": y.detach(), "rstd": rstd.detach()}, "fwd+bwd": {"dx": dx}}


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    shapes, dtypes = shapes_and_dtypes(globals(), device, quick, dtypes)
    out = []
    for shape in shapes:
        for dtype in dtypes:
            impls = [_fusedops_impl(), _eager_impl(), *_liger_impls(shape, dtype, device)]
            out.append(Case(
                op=OP, shape=shape, dtype=dtype,
                params={"norm_eps": EPS, "return_normalized": True},
                make_inputs=lambda dev, seed, shape=shape, dtype=dtype: randn_inputs(shape, dtype, dev, seed),
                impls=impls, reference=_reference, base=_base,
                bytes_moved=row_norm_bytes(shape, dtype), bytes_note=BYTES_NOTE,
            ))
    return out
