"""matmul_add (main_grad += grad_output^T @ input, gradient-accumulation fusion) in the report.

A GEMM, so the figure that matters is the rate: FLOPs = 2 * tokens * out * in. Issue 6's target
is at least 85% of the cuBLAS bf16 GEMM rate measured in the same run; the ``matmul`` row is that
rate's measurement: ``torch.matmul(grad_output.t(), input)`` of the same shape, bf16 out, no
accumulation. Rate of fusedops as a fraction of it = median(matmul) / median(fusedops).

Rows (case shape [out, in], params tokens):
  fusedops  fusedops.matmul_add (cuBLASLt beta = 1 into fp32 main_grad; CPU: oneDNN, sum post-op)
  eager     main_grad.add_(grad_output.t() @ input): the product in the operand dtype, then added
  addmm     the fused form PyTorch has: CUDA torch.addmm(..., out_dtype=float32, out=main_grad);
            CPU main_grad.addmm_ on fp32 copies of the operands (the CPU has no mixed addmm)
  matmul    torch.matmul(grad_output.t(), input): the GEMM rate, not a matmul_add (checked
            against the product, not against main_grad)

Minimum bytes (T tokens, s operand element size): read grad_output and input, read and write
main_grad (fp32) = T*(out+in)*s + 8*out*in. The op is bound by arithmetic, not bytes: read the
time columns and the rate. matmul_add has no backward (it is the weight-gradient half of a
linear layer's backward); the report's fwd+bwd pass repeats the forward.

Each timed call starts from the same main_grad (restored, untimed, before every call). The check
compares main_grad rows (the report's row sample) with float64 main_grad + grad_output^T @ input.
"""

from __future__ import annotations

import fusedops
import torch

from .. import common
from ..common import Case, Impl, shapes_and_dtypes

OP = "matmul_add"

GPU_SHAPES = [(8192, 4096, 4096)]     # (tokens, out, in): issue 6's target
GPU_QUICK_SHAPES = [(2048, 1024, 1024)]
CPU_SHAPES = [(512, 512, 512)]
CPU_QUICK_SHAPES = [(128, 256, 128)]
GPU_DTYPES = [torch.bfloat16]
CPU_DTYPES = [torch.float32, torch.bfloat16]


def bytes_moved(tokens, out, inn, dtype) -> dict[str, int]:
    s = torch.empty(0, dtype=dtype).element_size()
    b = tokens * (out + inn) * s + 8 * out * inn
    return {"fwd": b, "fwd+bwd": b}


BYTES_NOTE = {"fwd": "read grad_output, input; read+write main_grad (fp32)",
              "fwd+bwd": "no backward: the forward again"}


def _restore(inp):
    inp["main_grad"].copy_(inp["x"])


def _impls(device: torch.device, dtype: torch.dtype) -> list[Impl]:
    def fused(inp):
        fusedops.matmul_add(inp["dy"], inp["input"], inp["main_grad"])
        return {"main_grad": inp["main_grad"]}

    def eager(inp):
        inp["main_grad"].add_(inp["dy"].t() @ inp["input"])
        return {"main_grad": inp["main_grad"]}

    if dtype == torch.float32:
        def addmm(inp):
            inp["main_grad"].addmm_(inp["dy"].t(), inp["input"])
            return {"main_grad": inp["main_grad"]}
        addmm_note = "main_grad.addmm_(grad_output.t(), input)"
    elif device.type == "cuda":
        def addmm(inp):
            torch.addmm(inp["main_grad"], inp["dy"].t(), inp["input"], out_dtype=torch.float32,
                        out=inp["main_grad"])
            return {"main_grad": inp["main_grad"]}
        addmm_note = "torch.addmm(main_grad, grad_output.t(), input, out_dtype=float32, out=main_grad)"
    else:
        def addmm(inp):
            inp["main_grad"].addmm_(inp["dy"].t().float(), inp["input"].float())
            return {"main_grad": inp["main_grad"]}
        addmm_note = "main_grad.addmm_ on fp32 copies of the operands (no mixed-dtype addmm on the CPU)"

    def matmul(inp):
        return {"product": torch.matmul(inp["dy"].t(), inp["input"])}

    return [
        Impl("fusedops", fused, fused, prepare=_restore),
        Impl("eager", eager, eager, prepare=_restore,
             note="PyTorch eager: main_grad.add_(grad_output.t() @ input)"),
        Impl("addmm", addmm, addmm, prepare=_restore, note=addmm_note),
        Impl("matmul", matmul, matmul,
             note="torch.matmul(grad_output.t(), input), operand dtype out: the GEMM rate of the "
                  "target (rate of fusedops = median(matmul) / median(fusedops))"),
    ]


def _case(device, tokens, out, inn, dtype) -> Case:
    # The reference needs the whole operands (a main_grad row sums over every token), which the
    # report does not pass: make_inputs keeps them here until the base has been computed.
    held: dict = {}

    def make(dev, seed):
        gen = torch.Generator(device=dev).manual_seed(seed)

        def randn(*shape, dt=dtype):
            return torch.randn(shape, generator=gen, dtype=torch.float32, device=dev).to(dt)

        inp = {"dy": randn(tokens, out), "input": randn(tokens, inn),
               "x": randn(out, inn, dt=torch.float32)}
        inp["main_grad"] = inp["x"].clone()
        held["inputs"] = inp
        return inp

    def reference(_sliced):
        inp = held["inputs"]
        rows = common.row_sample(case.rows, inn, case.ref_row_budget_elems).to(inp["x"].device)
        g = inp["dy"][:, rows]
        prod64 = (g.double().t() @ inp["input"].double())
        mg64 = inp["x"][rows].double() + prod64
        prod = g.t() @ inp["input"]  # the eager product in the operand dtype
        held["base"] = {"fwd": {"main_grad": inp["x"][rows] + prod, "product": prod}}
        held["base"]["fwd+bwd"] = held["base"]["fwd"]
        ref = {"main_grad": mg64.cpu(), "product": prod64.cpu()}
        return {"fwd": ref, "fwd+bwd": ref}

    def base(_sliced):
        out_ = held.pop("base")
        held.clear()
        return out_

    case = Case(op=OP, shape=(out, inn), dtype=dtype, params={"tokens": tokens,
                                                               "gflop": round(2 * tokens * out * inn / 1e9, 2)},
                make_inputs=make, impls=_impls(device, dtype), reference=reference, base=base,
                bytes_moved=bytes_moved(tokens, out, inn, dtype), bytes_note=BYTES_NOTE)
    return case


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    shapes, dtypes = shapes_and_dtypes(globals(), device, quick, dtypes)
    return [_case(device, t, o, i, dt) for (t, o, i) in shapes for dt in dtypes]
