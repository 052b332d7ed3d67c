#!/usr/bin/env python
"""Per-kernel GPU time of one call of several report cases (torch.profiler / CUPTI), to see where
an operator's time goes before optimising it: each kernel's name, launches per call and time per
call, plus the busy time (sum of kernels) and the span (first kernel start to last kernel end,
launch gaps included) per call.

    python bench/kernel_times.py                    # every scenario
    python bench/kernel_times.py hc_split ce        # some of them

Scenarios (the report's shapes): hc_split / hc_split_ds (fwd+bwd, fp32 [32768, 24], mindspeed /
deepseek), ce (fwd+bwd, bf16 [8192, 128256]), ce_fwd (the same, loss only, reduction none), chunk_loss / chunk_loss_mg
(fwd+bwd, N=8192 H=4096 V=128256 bf16; default budget / caller's fp32 main_grad at 1 GiB chunks), mhc_pre (fwd, T=32768 n=4 C=4096 bf16),
conv (causal_conv1d fwd, [4, 4096, 8192] W=4 silu bf16), gdn / gdn_fwd and kda / kda_fwd
(chunk_gated_delta_rule and chunk_kda fwd+bwd / fwd, B=8 T=4096 H=16 K=V=128 bf16), gdn_long /
gdn_long_fwd (B=1 T=32768) and gdn_varlen (fwd+bwd, the report's 8 packed sequences).
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import fusedops
import torch

DEV = torch.device("cuda")


def _gen(seed=0):
    return torch.Generator(device=DEV).manual_seed(seed)


def hc_split(variant: str = "mindspeed"):
    rows, n = 32768, 4
    w = (2 + n) * n
    g = _gen()
    m = torch.randn(rows, w, generator=g, device=DEV).requires_grad_()
    s = torch.tensor([0.8, 1.1, 1.3], device=DEV).requires_grad_()
    b = (0.5 * torch.randn(w, generator=g, device=DEV)).requires_grad_()
    dy = torch.randn(rows, w, generator=g, device=DEV)

    def step():
        outs = fusedops.hc_split_sinkhorn(m, s, b, n, 20, 1e-6, variant=variant)
        torch.autograd.grad(outs, [m], [dy[:, :n], dy[:, n:2 * n], dy[:, 2 * n:].reshape(-1, n, n)])
    return step


def hc_split_ds():
    return hc_split("deepseek")


def ce():
    n, v = 8192, 128256
    g = _gen()
    x = (2.0 * torch.randn(n, v, generator=g, device=DEV)).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=g, device=DEV)

    def step():
        loss = fusedops.fused_cross_entropy_loss(x, labels)
        torch.autograd.grad(loss, [x])
    return step


def ce_fwd():
    n, v = 8192, 128256
    g = _gen()
    x = (2.0 * torch.randn(n, v, generator=g, device=DEV)).to(torch.bfloat16)
    labels = torch.randint(0, v, (n,), generator=g, device=DEV)

    def step():
        fusedops.fused_cross_entropy_loss(x, labels, reduction="none")
    return step


def _chunk_loss(main_grad: bool):
    n, h, v = 8192, 4096, 128256
    g = _gen()
    hidden = torch.randn(n, h, generator=g, device=DEV).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(v, h, generator=g, device=DEV) * 0.02).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=g, device=DEV)
    mg = torch.zeros(v, h, device=DEV) if main_grad else None

    def step():
        if mg is not None:
            loss = fusedops.chunk_loss(hidden, weight, labels, reduction="mean", grad_weight_buffer=mg,
                                       memory_budget=1 << 30)
            torch.autograd.grad(loss, [hidden])
        else:
            loss = fusedops.chunk_loss(hidden, weight, labels, reduction="mean")
            torch.autograd.grad(loss, [hidden, weight])
    return step


def chunk_loss():
    return _chunk_loss(False)


def chunk_loss_mg():
    return _chunk_loss(True)


def mhc_pre():
    t, n, c = 32768, 4, 4096
    g = _gen()
    x = torch.randn(t, n, c, generator=g, device=DEV).to(torch.bfloat16)
    h = torch.rand(t, n, generator=g, device=DEV)

    def step():
        fusedops.mhc_pre_bmm(h, x)
    return step


def conv():
    g = _gen()
    x = torch.randn(4, 4096, 8192, generator=g, device=DEV).to(torch.bfloat16)
    w = torch.randn(4, 8192, generator=g, device=DEV).to(torch.bfloat16)

    def step():
        fusedops.causal_conv1d(x, w, activation="silu")
    return step


def _linear_attention(backward: bool, kda: bool, B: int = 8, T: int = 4096, lengths=None):
    """One call at B x T (H = 16, K = V = 128, bf16); lengths: packed sequences (B = 1, cu_seqlens
    built once, as a training step's layers share it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from la_timing import _inputs

    H, K = 16, 128
    inputs = _inputs(B, T, H, H, K, K, torch.bfloat16, kda)
    leaves = [x.detach().clone().requires_grad_(backward) for x in inputs]
    do = torch.randn(B, T, H, K, device=DEV, dtype=torch.bfloat16)
    op = fusedops.chunk_kda if kda else fusedops.chunk_gated_delta_rule
    cu = None if lengths is None else torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=DEV)

    def step():
        o = op(*leaves, K ** -0.5, cu_seqlens=cu)[0]
        if backward:
            torch.autograd.grad(o, leaves, do)
    return step


def gdn():
    return _linear_attention(True, False)


def gdn_fwd():
    return _linear_attention(False, False)


def gdn_long():
    return _linear_attention(True, False, B=1, T=32768)


def gdn_long_fwd():
    return _linear_attention(False, False, B=1, T=32768)


def gdn_varlen():
    # The report's varlen case: 8 sequences of random lengths (seed 0), 32768 tokens.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.ops.gated_delta_rule import varlen_lengths
    return _linear_attention(True, False, B=1, T=32768, lengths=varlen_lengths(8, 32768))


def kda():
    return _linear_attention(True, True)


def kda_fwd():
    return _linear_attention(False, True)


SCENARIOS = {f.__name__: f for f in (hc_split, hc_split_ds, ce, ce_fwd, chunk_loss, chunk_loss_mg, mhc_pre, conv, gdn, gdn_fwd,
                                     kda, kda_fwd, gdn_long, gdn_long_fwd, gdn_varlen)}


def profile(name: str, calls: int = 5) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    step = SCENARIOS[name]()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    per = defaultdict(lambda: [0, 0.0])
    for e in gpu:
        per[e["name"]][0] += 1
        per[e["name"]][1] += float(e["dur"])
    busy = sum(v[1] for v in per.values()) / calls
    span = (max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)) / calls if gpu else 0.0
    print(f"== {name}: {len(gpu) / calls:.0f} GPU ops per call, busy {busy:.1f} us, span {span:.1f} us "
          f"per call (mean of {calls})")
    for kname, (cnt, dur) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"   {dur / calls:10.1f} us  x{cnt / calls:<5.1f} {kname[:150]}")
    sys.stdout.flush()


def main(names: list[str]) -> None:
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  fusedops {fusedops.__version__}")
    for name in names or list(SCENARIOS):
        if name not in SCENARIOS:
            raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
        profile(name)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
