"""clipped_swiglu (docs/specs/ops.md section 7) in the operator report.

GPT-OSS semantics (alpha 1.702, limit 7.0, bias 1.0, clamp_mode 0) on x [N, 2H] -> y [N, H].
Minimum bytes (s = element size, N rows, K = 2H inputs per row):
  fwd      read x + write y                                   = 1.5*N*K*s
  fwd+bwd  fwd + read x + read dy + write dx                  = 4*N*K*s
The forward saves only x (the backward recomputes the activation).
"""

from __future__ import annotations

import fusedops
import torch

from ..common import Case, Impl, grad_of, peer_status, shapes_and_dtypes

OP = "clipped_swiglu"
ALPHA, LIMIT, BIAS = 1.702, 7.0, 1.0

GPU_SHAPES = [(131072, 5760)]       # issue 6's target shape (GPT-OSS-120B: 2 x 2880 per token)
GPU_QUICK_SHAPES = [(8192, 5760)]
CPU_SHAPES = [(2048, 5760)]
CPU_QUICK_SHAPES = [(256, 1152)]
GPU_DTYPES = [torch.bfloat16]
CPU_DTYPES = [torch.float32, torch.bfloat16]
# GPT-OSS interleaves the gate and linear halves; split halves are what Liger's peer takes.
GPU_LAYOUTS = [True, False]
CPU_LAYOUTS = [True]


def bytes_moved(shape, dtype) -> dict[str, int]:
    n, k = shape[0], shape[-1]
    e = torch.empty(0, dtype=dtype).element_size()
    fwd = n * k * e + n * (k // 2) * e
    return {"fwd": fwd, "fwd+bwd": fwd + 2 * n * k * e + n * (k // 2) * e}


BYTES_NOTE = {"fwd": "read x + write y", "fwd+bwd": "fwd + read x, dy + write dx"}


def make_inputs(shape, dtype, device, seed) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    n, k = shape
    # std 3: some values cross +-limit, so the clamps are exercised
    x = (torch.randn(shape, generator=gen, dtype=torch.float32, device=device) * 3.0).to(dtype)
    dy = torch.randn((n, k // 2), generator=gen, dtype=torch.float32, device=device).to(dtype)
    return {"x": x, "dy": dy, "x_req": x.detach().requires_grad_()}


def _fusedops_impl(interleaved: bool) -> Impl:
    def fwd(inp):
        return {"y": fusedops.clipped_swiglu(inp["x"], interleaved=interleaved)}

    def fwd_bwd(inp):
        y = fusedops.clipped_swiglu(inp["x_req"], interleaved=interleaved)
        return {"dx": grad_of(y, inp["x_req"], inp["dy"])}

    return Impl("fusedops", fwd, fwd_bwd)


def _halves(x, interleaved):
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    h = x.shape[-1] // 2
    return x[..., :h], x[..., h:]


def _eager(x, interleaved):
    # GPT-OSS's reference swiglu (torch/model.py), on either layout.
    x_glu, x_linear = _halves(x, interleaved)
    x_glu = x_glu.clamp(min=None, max=LIMIT)
    x_linear = x_linear.clamp(min=-LIMIT, max=LIMIT)
    return x_glu * torch.sigmoid(ALPHA * x_glu) * (x_linear + BIAS)


def _eager_impl(interleaved: bool) -> Impl:
    def fwd(inp):
        return {"y": _eager(inp["x"], interleaved)}

    def fwd_bwd(inp):
        return {"dx": grad_of(_eager(inp["x_req"], interleaved), inp["x_req"], inp["dy"])}

    return Impl("eager", fwd, fwd_bwd, note="PyTorch eager: GPT-OSS's clamp / sigmoid / mul composite")


def _liger_impl(device, interleaved: bool) -> Impl:
    note = ("Liger-Kernel liger_kernel.ops.swiglu (Triton), plain SiLU-mul SwiGLU: UNCLIPPED, no alpha "
            "or +1, split halves only - a speed reference, not the same function (its errors are not "
            "comparable)")
    if interleaved:
        return Impl("liger", status="split halves only", note=note)
    status = peer_status("liger_kernel.ops.swiglu", device)
    if status != "ok":
        return Impl("liger", status=status, note=note)
    from liger_kernel.ops import swiglu as liger_swiglu

    fused = getattr(liger_swiglu, "LigerFusedGateUpSiLUMulFunction", None)

    def call(x):
        if fused is not None:
            return fused.apply(x)
        a, b = x.chunk(2, -1)
        return liger_swiglu.LigerSiLUMulFunction.apply(a, b)

    def fwd(inp):
        return {"y": call(inp["x"])}

    def fwd_bwd(inp):
        return {"dx": grad_of(call(inp["x_req"]), inp["x_req"], inp["dy"])}

    return Impl("liger", fwd, fwd_bwd, note=note)


def _reference(interleaved):
    def run(inp) -> dict:
        x64 = inp["x"].detach().to("cpu", torch.float64).requires_grad_()
        y = fusedops.reference.clipped_swiglu(x64, interleaved=interleaved)
        dx = grad_of(y, x64, inp["dy"].detach().to("cpu", torch.float64))
        return {"fwd": {"y": y.detach()}, "fwd+bwd": {"dx": dx}}

    return run


def _base(interleaved):
    def run(inp) -> dict:
        # The precision policy's baseline: the composite with every step in the input dtype. Its
        # clamps use the spec's closed-interval masks (the installed torch.clamp may block the
        # gradient at exactly +-limit; see src/ops/clipped_swiglu/README.md).
        x = inp["x"].detach().requires_grad_()
        A, B = _halves(x, interleaved)
        a = torch.where(A <= LIMIT, A, A.detach().clamp(max=LIMIT))
        b = torch.where((B >= -LIMIT) & (B <= LIMIT), B, B.detach().clamp(-LIMIT, LIMIT))
        y = a * torch.sigmoid(ALPHA * a) * (b + BIAS)
        return {"fwd": {"y": y.detach()}, "fwd+bwd": {"dx": grad_of(y, x, inp["dy"])}}

    return run


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    shapes, dtypes = shapes_and_dtypes(globals(), device, quick, dtypes)
    layouts = GPU_LAYOUTS if device.type == "cuda" else CPU_LAYOUTS
    out = []
    for shape in shapes:
        for dtype in dtypes:
            for interleaved in layouts:
                out.append(Case(
                    op=OP, shape=shape, dtype=dtype,
                    params={"interleaved": interleaved, "alpha": ALPHA, "limit": LIMIT, "bias": BIAS,
                            "clamp_mode": 0},
                    make_inputs=lambda dev, seed, shape=shape, dtype=dtype: make_inputs(shape, dtype, dev, seed),
                    impls=[_fusedops_impl(interleaved), _eager_impl(interleaved),
                           _liger_impl(device, interleaved)],
                    reference=_reference(interleaved), base=_base(interleaved),
                    bytes_moved=bytes_moved(shape, dtype), bytes_note=BYTES_NOTE,
                ))
    return out
