"""chunk_loss (docs/specs/ops.md section 10) in the operator report: the LM head and cross-entropy,
loss = CE(hidden @ weight.T), reduction "mean", every label valid.

Passes:
  fwd      the loss with gradients enabled (all the work happens here: logits GEMM, cross-
           entropy, the two gradient GEMMs for fusedops and Liger; a linear + CE forward for
           eager); output: the loss
  fwd+bwd  fwd + loss.backward(); outputs: d_hidden and d_weight
The "no_grad" variant (evaluation) runs the loss under torch.no_grad(): fusedops then does only
the logits GEMM and the loss pass, eager its linear + CE forward. It has no backward; its fwd+bwd
pass repeats the forward.
This op is bound by its three GEMMs (6 N V H flops: 25.8 TFLOP at N=8192, H=4096, V=128256), so
the byte count below (read hidden and weight, write their gradients) gives a floor that is far
from the real one; the time and the peak memory are the numbers to read.

The report checks row slices; here the whole problem is one "row" (case shape [1, N*H]), so every
output is checked in full against a float64 torch composite (chunked over tokens, on the
benchmark's device; the weight and labels come from the case's inputs) with the composite in the
input dtype as the base.

Baselines: PyTorch eager (F.linear + F.cross_entropy in the input dtype) and Liger-Kernel's
LigerFusedLinearCrossEntropyLoss (Triton + torch matmuls, chunked). fusedops runs twice: returning
d_weight in the weight's dtype (its fp32 accumulator, 4 V H bytes, is part of its peak), and as
"fusedops-mg", adding the weight gradient into the caller's fp32 main_grad.
"""

from __future__ import annotations

import fusedops
import torch
import torch.nn.functional as F

from ..common import Case, Impl, peer_status

OP = "chunk_loss"

GPU_SHAPES = [(8192, 4096, 128256)]   # issue 5's target: N tokens, hidden H, vocabulary V
GPU_QUICK_SHAPES = [(2048, 4096, 128256)]
GPU_DTYPES = [torch.bfloat16]
# (N, H, V) per dtype on the CPU: PyTorch's bfloat16 matmul on a CPU without native bf16 units
# is ~100x slower than float32 (its fwd+bwd took 72 s at [512, 256, 32000] here), so bfloat16
# gets a smaller shape to keep the report short.
CPU_CASES = {torch.float32: (512, 256, 32000), torch.bfloat16: (128, 128, 8000)}
CPU_QUICK_CASES = {torch.float32: (64, 128, 32000), torch.bfloat16: (32, 64, 4000)}


def bytes_moved(nhv, dtype) -> dict[str, int]:
    n, h, v = nhv
    e = torch.empty(0, dtype=dtype).element_size()
    fwd = (n * h + v * h) * e + 8 * n + 4
    return {"fwd": fwd, "fwd+bwd": fwd + (n * h + v * h) * e}


BYTES_NOTE = {
    "fwd": "read hidden, weight, labels (GEMM-bound: see the module docstring)",
    "fwd+bwd": "fwd + write d_hidden, d_weight",
}


def _make_inputs(nhv, dtype, device, seed, state) -> dict:
    n, h, v = nhv
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float32, device=device).to(dtype)
    weight = (torch.randn(v, h, generator=gen, dtype=torch.float32, device=device) / h ** 0.5).to(dtype)
    labels = torch.randint(0, v, (n,), generator=gen, device=device)
    inp = {"x": hidden.reshape(1, n * h), "dy": torch.ones(1, 1, device=device), "hidden": hidden,
           "weight": weight, "labels": labels,
           "h_req": hidden.detach().clone().requires_grad_(),
           "w_req": weight.detach().clone().requires_grad_()}
    state.clear()
    state.update(weight=weight, labels=labels, shape=(n, h, v))
    return inp


def _grads(loss, inp):
    dh, dw = torch.autograd.grad(loss, [inp["h_req"], inp["w_req"]])
    return {"dh": dh, "dw": dw}


def _fusedops_impl() -> Impl:
    def fwd(inp):
        return {"loss": fusedops.chunk_loss(inp["h_req"], inp["w_req"], inp["labels"], reduction="mean")}

    def fwd_bwd(inp):
        return _grads(fusedops.chunk_loss(inp["h_req"], inp["w_req"], inp["labels"], reduction="mean"), inp)

    return Impl("fusedops", fwd, fwd_bwd, note="chunk size from the default memory budget")


# The Megatron form: the weight gradient is added to the caller's fp32 main_grad during the
# forward (gradient-accumulation fusion), so neither the fp32 accumulator nor a 16-bit d_weight is
# allocated by the call; chunks from a 1 GiB budget on CUDA (the CPU default on the CPU).
# main_grad is a buffer the trainer holds anyway (allocated and zeroed untimed, outside the peak
# measurement). Liger's and eager's rows return a 16-bit d_weight that such a trainer would then
# add to its main_grad.
# Stop 24 (bench/chunk_loss_budgets.py): 1 GiB 46.4 ms at 0.97 GiB, 512 MiB 50.7 ms at 0.55 GiB.
MAIN_GRAD_BUDGET = 1 << 30


def _fusedops_main_grad_impl() -> Impl:
    def prepare(inp):
        mg = inp.get("main_grad")
        if mg is None:
            inp["main_grad"] = torch.zeros(inp["weight"].shape, dtype=torch.float32, device=inp["weight"].device)
        else:
            mg.zero_()

    def loss_of(inp):
        budget = MAIN_GRAD_BUDGET if inp["h_req"].is_cuda else None  # the CPU default elsewhere
        return fusedops.chunk_loss(inp["h_req"], inp["w_req"], inp["labels"], reduction="mean",
                                   grad_weight_buffer=inp["main_grad"], memory_budget=budget)

    def fwd_bwd(inp):
        (dh,) = torch.autograd.grad(loss_of(inp), [inp["h_req"]])
        return {"dh": dh, "dw": inp["main_grad"]}

    return Impl("fusedops-mg", lambda inp: {"loss": loss_of(inp)}, fwd_bwd, prepare=prepare,
                note="fusedops with grad_weight_buffer=main_grad (fp32, the caller's; Megatron's "
                     "gradient-accumulation fusion) and memory_budget=1 GiB on CUDA; dw = main_grad")


def _eager(inp):
    return F.cross_entropy(F.linear(inp["h_req"], inp["w_req"]), inp["labels"])


def _eager_impl() -> Impl:
    return Impl("eager", lambda inp: {"loss": _eager(inp)}, lambda inp: _grads(_eager(inp), inp),
                note="PyTorch eager: F.linear + F.cross_entropy in the input dtype")


def _liger_impl(device) -> Impl:
    note = "Liger-Kernel liger_kernel.transformers.LigerFusedLinearCrossEntropyLoss (chunked)"
    status = peer_status("liger_kernel.transformers", device)
    if status != "ok":
        return Impl("liger", status=status, note=note)
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    flce = LigerFusedLinearCrossEntropyLoss(reduction="mean")

    def loss_of(inp):
        out = flce(inp["w_req"], inp["h_req"], inp["labels"])
        return out[0] if isinstance(out, (tuple, list)) else getattr(out, "loss", out)

    return Impl("liger", lambda inp: {"loss": loss_of(inp)}, lambda inp: _grads(loss_of(inp), inp), note=note)


def _composite(hidden, weight, labels, chunk: int):
    """loss and (d_hidden, d_weight) of mean CE(hidden @ weight.T) in hidden's dtype, `chunk`
    tokens at a time (the [N, V] logits of a float64 reference would not fit)."""
    n = hidden.shape[0]
    loss = torch.zeros((), dtype=hidden.dtype, device=hidden.device)
    dh = torch.empty_like(hidden)
    dw = torch.zeros_like(weight)
    for r0 in range(0, n, chunk):
        h = hidden[r0:r0 + chunk].detach().requires_grad_()
        w = weight.detach().requires_grad_()
        part = F.cross_entropy(F.linear(h, w), labels[r0:r0 + chunk], reduction="sum") / n
        gh, gw = torch.autograd.grad(part, [h, w])
        loss += part.detach()
        dh[r0:r0 + chunk] = gh
        dw += gw
    return loss, dh, dw


def _reference_fn(state):
    def reference(inp) -> dict:
        n, h, v = state["shape"]
        hidden = inp["x"].detach().reshape(n, h).to(torch.float64)
        loss, dh, dw = _composite(hidden, state["weight"].to(torch.float64), state["labels"],
                                  max(1, (1 << 27) // v))
        return {"fwd": {"loss": loss}, "fwd+bwd": {"dh": dh, "dw": dw}}

    return reference


def _base_fn(state):
    def base(inp) -> dict:
        n, h, v = state["shape"]
        hidden = inp["x"].detach().reshape(n, h)
        loss, dh, dw = _composite(hidden, state["weight"], state["labels"], n)
        return {"fwd": {"loss": loss}, "fwd+bwd": {"dh": dh, "dw": dw}}

    return base


def _no_grad_impls(device) -> list[Impl]:
    """fusedops, eager and Liger under torch.no_grad(): the loss only (both passes)."""
    def no_grad(loss_of):
        def run(inp):
            with torch.no_grad():
                return {"loss": loss_of(inp)}
        return run

    out = []
    for impl in (_fusedops_impl(), _eager_impl(), _liger_impl(device)):
        if impl.available:
            fn = no_grad(lambda inp, f=impl.fwd: f(inp)["loss"])
            impl = Impl(impl.name, fn, fn, note=impl.note and impl.note + " (under torch.no_grad)")
        out.append(impl)
    return out


def _loss_only(fn):
    def loss_only(inp) -> dict:
        r = fn(inp)
        return {"fwd": r["fwd"], "fwd+bwd": r["fwd"]}
    return loss_only


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    if device.type == "cuda":
        shapes = GPU_QUICK_SHAPES if quick else GPU_SHAPES
        pairs = [(nhv, dt) for nhv in shapes for dt in (dtypes or GPU_DTYPES)]
    else:
        table = CPU_QUICK_CASES if quick else CPU_CASES
        pairs = [(table.get(dt, table[torch.float32]), dt) for dt in (dtypes or list(table))]
    out = []
    for nhv, dtype in pairs:
        state: dict = {}
        n, h, v = nhv
        out.append(Case(
            op=OP, shape=(1, n * h), dtype=dtype, params={"N": n, "H": h, "V": v, "reduction": "mean"},
            make_inputs=lambda dev, seed, nhv=nhv, dtype=dtype, state=state: _make_inputs(nhv, dtype, dev, seed, state),
            impls=[_fusedops_impl(), _fusedops_main_grad_impl(), _eager_impl(), _liger_impl(device)],
            reference=_reference_fn(state), base=_base_fn(state),
            bytes_moved=bytes_moved(nhv, dtype), bytes_note=BYTES_NOTE,
            ref_row_budget_elems=1 << 62,
        ))
        if device.type == "cpu":
            fwd_bytes = bytes_moved(nhv, dtype)["fwd"]
            state = {}  # this case's own (the report makes each case's inputs with its own seed)
            out.append(Case(
                op=OP, shape=(1, n * h), dtype=dtype, variant="no_grad",
                params={"N": n, "H": h, "V": v, "reduction": "mean", "grad": "off"},
                make_inputs=lambda dev, seed, nhv=nhv, dtype=dtype, state=state: _make_inputs(nhv, dtype, dev, seed,
                                                                                              state),
                impls=_no_grad_impls(device), reference=_loss_only(_reference_fn(state)),
                base=_loss_only(_base_fn(state)), bytes_moved={"fwd": fwd_bytes, "fwd+bwd": fwd_bytes},
                bytes_note={"fwd": BYTES_NOTE["fwd"], "fwd+bwd": "no backward under no_grad: the forward again"},
                ref_row_budget_elems=1 << 62,
            ))
    return out
