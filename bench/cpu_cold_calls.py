#!/usr/bin/env python
"""What a cold call costs on the CPU: the report's CPU timing writes a buffer twice the
last-level cache between calls (bench/common.py Timer), so every call starts with its code,
data and page tables out of the caches. This study times the cases nearest issue 40's targets
both ways: cold (the report's flush before each call; fusedops and eager interleaved call by
call) and warm (back to back). Two floors that no operator goes below are timed the same ways:
the backward of an autograd.Function that only returns two prebuilt tensors, and one small
PyTorch op (zeros(1)); GDN's fixed cost is timed on a one-chunk call ([1, 64, 1, 16]). For
matmul_add, "fusedops C++" is the extension's call alone (a Context made once, no Python layer).

The cases made only of bf16 products (issue 40's bf16 rows: chunk_loss forward+backward and its
loss-only forward, matmul_add) also get their floor: the products' flops at the CPU's bf16 peak
(all cores issuing vdpbf16ps, bench/gemm/peak_bench.cpp, built and run here unless --peak-gflops
gives it), beside the time a call must take to be the target multiple of eager's, warm and cold.
A needed time under the floor is out of reach for any implementation of the same products.

    python bench/cpu_cold_calls.py [--calls 60] [--cases REGEX] [--peak-gflops G]
                                   [--out bench/results/cpu/studies/NAME.txt]

Medians (and the 20th percentile) of the calls, in ms.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fusedops  # noqa: E402

from bench.common import last_level_cache_bytes, study_commit, write_study  # noqa: E402
from bench.gemm import peak  # noqa: E402
from bench.ops.gated_delta_rule import chunked_torch  # noqa: E402


def cases():
    torch.manual_seed(0)
    n, h, v = 128, 128, 8000  # the report's CPU chunk_loss bf16 case
    hidden = torch.randn(n, h).bfloat16()
    weight = (torch.randn(v, h) / h ** 0.5).bfloat16()
    labels = torch.randint(0, v, (n,))
    hr, wr = hidden.clone().requires_grad_(), weight.clone().requires_grad_()

    def cl_fused():
        return torch.autograd.grad(fusedops.chunk_loss(hr, wr, labels, reduction="mean"), [hr, wr])

    def cl_eager():
        loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(hr, wr), labels)
        return torch.autograd.grad(loss, [hr, wr])

    def cl_loss_fused():
        with torch.no_grad():
            return fusedops.chunk_loss(hr, wr, labels, reduction="mean")

    def cl_loss_eager():
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(torch.nn.functional.linear(hr, wr), labels)

    # The loss-only C++ call alone (a Context made once, no Python layer) and eager's product alone.
    cl_ctx, cl_out = fusedops._backend.context("chunk_loss", hidden), torch.empty(())

    def cl_loss_cxx():
        fusedops._C.chunk_loss_fwd(cl_ctx, hidden, weight, None, labels, None, 1.0, None, cl_out, None, None,
                                   None, False, None, 0, 0, None, -100, "mean", 0.0, 1.0, None, 0.0)

    def cl_loss_product():
        with torch.no_grad():
            return torch.nn.functional.linear(hr, wr)

    t = o = i = 512  # the report's CPU matmul_add case
    dy, x, base = torch.randn(t, o), torch.randn(t, i), torch.randn(o, i)
    mg = base.clone()
    dy16, x16 = dy.bfloat16(), x.bfloat16()

    def restore():
        mg.copy_(base)

    def mm_fused():
        fusedops.matmul_add(dy, x, mg)

    def mm_eager():
        mg.add_(dy.t() @ x)

    # The C++ call alone (a Context made once, no Python layer): what the torch layer adds.
    mm_ctx = fusedops._backend.context("matmul_add", dy)

    def mm_cxx():
        fusedops._C.matmul_add_fwd(mm_ctx, dy, x, mg, None)

    def mm16_fused():
        fusedops.matmul_add(dy16, x16, mg)

    def mm16_cxx():
        fusedops._C.matmul_add_fwd(mm_ctx, dy16, x16, mg, None)

    def mm16_eager():
        mg.add_(dy16.t() @ x16)

    def mm16_product():  # eager's product alone (bf16 out): what PyTorch's GEMM takes
        return dy16.t() @ x16

    dh, dw = torch.zeros(n, h).bfloat16(), torch.zeros(v, h).bfloat16()

    class Returns(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return torch.zeros(())

        @staticmethod
        def backward(ctx, g):
            return dh, dw

    state = {}

    def noop_prepare():
        state["loss"] = Returns.apply(hr, wr)

    def noop_backward():
        return torch.autograd.grad(state.pop("loss"), [hr, wr])

    def gdn(shape):
        b, t, hh, d = shape
        x = [torch.randn(b, t, hh, d) for _ in range(3)]
        x[1] = torch.nn.functional.normalize(x[1], dim=-1)
        x += [-torch.rand(b, t, hh) * 0.5, torch.rand(b, t, hh)]
        leaves = [a.clone().requires_grad_() for a in x]
        do = torch.randn(b, t, hh, d)

        def fused():
            o = fusedops.chunk_gated_delta_rule(*leaves, d ** -0.5)[0]
            return torch.autograd.grad(o, leaves, do)

        def eager():
            o = chunked_torch(*leaves, d ** -0.5)[0]
            return torch.autograd.grad(o, leaves, do)
        return fused, eager

    # The backward alone, after an untimed forward: ours with an upstream gradient of 1 (no call:
    # cross_entropy._unit_upstream), ours with the in-place call it skips (the check patched to
    # answer no, as before stop 61), and eager's (the two products' backward).
    from fusedops.ops import chunk_loss as cl_module
    pending = {}

    def cl_forward():
        pending["fusedops"] = fusedops.chunk_loss(hr, wr, labels, reduction="mean")
        pending["eager"] = torch.nn.functional.cross_entropy(torch.nn.functional.linear(hr, wr), labels)

    def cl_backward(name, skip=True):
        def run():
            check = cl_module._unit_upstream
            if not skip:
                cl_module._unit_upstream = lambda g: False
            try:
                return torch.autograd.grad(pending.pop(name), [hr, wr])
            finally:
                cl_module._unit_upstream = check
        return run

    gdn_fused, gdn_eager = gdn((2, 256, 4, 128))  # the report's small CPU GDN case
    gdn_tiny, _ = gdn((1, 64, 1, 16))

    # Floors (bf16 cases): the products' flops, and issue 40's target multiple of eager.
    products = 2 * n * h * v
    return [
        ("chunk_loss bf16 N=128 H=128 V=8000, fwd+bwd", None,
         [("fusedops", cl_fused), ("eager", cl_eager)], {"flops": 3 * products, "target": 1.5}),
        ("chunk_loss bf16 N=128 H=128 V=8000, loss only (torch.no_grad)", None,
         [("fusedops", cl_loss_fused), ("fusedops C++", cl_loss_cxx), ("eager", cl_loss_eager),
          ("eager product", cl_loss_product)], {"flops": products, "target": 1.5}),
        ("chunk_loss bf16 N=128 H=128 V=8000, backward alone (upstream gradient 1)", cl_forward,
         [("fusedops", cl_backward("fusedops")), ("fusedops-call", cl_backward("fusedops", False)),
          ("eager", cl_backward("eager"))]),
        ("matmul_add fp32 512^3", restore,
         [("fusedops", mm_fused), ("fusedops C++", mm_cxx), ("eager", mm_eager)]),
        ("matmul_add bf16 512^3", restore,
         [("fusedops", mm16_fused), ("fusedops C++", mm16_cxx), ("eager", mm16_eager),
          ("eager product", mm16_product)], {"flops": 2 * t * o * i, "target": 1.3}),
        ("floor: backward of an autograd.Function returning two prebuilt tensors", noop_prepare,
         [("autograd.grad", noop_backward)]),
        ("floor: torch.zeros(1)", None, [("torch op", lambda: torch.zeros(1))]),
        ("chunk_gated_delta_rule fp32 [2, 256, 4, 128], fwd+bwd", None,
         [("fusedops", gdn_fused), ("eager", gdn_eager)]),
        ("chunk_gated_delta_rule fp32 [1, 64, 1, 16] (one chunk), fwd+bwd", None,
         [("fusedops", gdn_tiny)]),
    ]


def timed(fn, prepare, flush) -> float:
    """One call in ms; `flush` (a buffer) is written first when given."""
    if prepare:
        prepare()
    if flush is not None:
        flush.fill_(0x5A)
    t0 = time.perf_counter()
    out = fn()
    t1 = time.perf_counter()
    del out
    return (t1 - t0) * 1e3


def bf16_peak_gflops() -> tuple[float, str]:
    """The CPU's bf16 peak over all cores in GFLOP/s: bench/gemm/peak_bench.cpp built into
    build/peak_bench and run (the best of three runs of 0.3 s per measurement)."""
    exe = peak.build(ROOT / "build" / "peak_bench")
    best = 0.0
    for _ in range(3):
        out = subprocess.run([str(exe), "0.3"], check=True, capture_output=True, text=True).stdout
        bf16 = [r for r in peak.rows(out) if r[0] == "bf16 dpbf16"]
        if not bf16:
            raise SystemExit("peak_bench printed no bf16 line (no AVX512-BF16 here?); pass --peak-gflops\n" + out)
        best = max(best, bf16[0][5])
    return best, "bench/gemm/peak_bench.cpp, best of 3 runs"


def floor_lines(meta: dict, samples: dict, peak: float) -> list[str]:
    """The products' time at the peak beside what the target multiple of eager asks for."""
    floor_ms = meta["flops"] / (peak * 1e9) * 1e3
    lines = [f"  floor: {meta['flops'] / 1e9:.3f} GFLOP of bf16 products at {peak:.0f} GFLOP/s = {floor_ms:.3f} ms; "
             f"target {meta['target']}x eager"]
    for cold in (True, False):
        med = {name: sorted(v)[len(v) // 2] for (name, c), v in samples.items() if c == cold}
        need = med["eager"] / meta["target"]
        verdict = ("under the floor: no implementation of these products reaches it" if need < floor_ms else
                   f"{need - floor_ms:.3f} ms over the floor for all but the products at peak")
        lines.append(f"  {'cold' if cold else 'warm'}: eager {med['eager']:.3f} -> needs <= {need:.3f} ms "
                     f"(fusedops {med['fusedops']:.3f}, {med['eager'] / med['fusedops']:.2f}x); {verdict}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--cases", default="", help="only the cases whose label matches this regex")
    ap.add_argument("--peak-gflops", type=float,
                    help="the CPU's bf16 peak for the floors (default: run bench/gemm/peak_bench.cpp)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    flush = torch.empty(max(64 << 20, 2 * last_level_cache_bytes()), dtype=torch.uint8)
    commit = study_commit()
    lines = [f"cpu_cold_calls at {commit}: torch {torch.__version__}, {torch.get_num_threads()} threads, "
             f"flush {flush.numel() >> 20} MiB written before each cold call; median / p20 of "
             f"{args.calls} calls, ms"]
    selected = [c for c in cases() if re.search(args.cases, c[0])]
    peak = None
    if any(len(c) > 3 for c in selected):
        peak, source = (args.peak_gflops, "given") if args.peak_gflops else bf16_peak_gflops()
        lines.append(f"bf16 peak (all cores): {peak:.0f} GFLOP/s ({source})")
    for label, prepare, impls, *meta in selected:
        samples = {(name, cold): [] for name, _ in impls for cold in (True, False)}
        for _, fn in impls:  # first calls (primitive creation, lazy init) untimed
            if prepare:
                prepare()
            fn()
        for _ in range(args.calls):  # cold: the implementations interleaved call by call
            for name, fn in impls:
                samples[(name, True)].append(timed(fn, prepare, flush))
        for name, fn in impls:  # warm: back to back
            for _ in range(args.calls):
                samples[(name, False)].append(timed(fn, prepare, None))
        lines.append(label)
        for name, _ in impls:
            parts = []
            for cold in (True, False):
                s = sorted(samples[(name, cold)])
                parts.append(f"{'cold' if cold else 'warm'} {s[len(s) // 2]:.3f} / {s[len(s) // 5]:.3f}")
            lines.append(f"  {name:14s} " + "   ".join(parts))
        if meta:
            lines += floor_lines(meta[0], samples, peak)
    write_study(lines, args.out)


if __name__ == "__main__":
    main()
