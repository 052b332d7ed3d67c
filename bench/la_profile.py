#!/usr/bin/env python
"""One forward+backward of fusedops's chunk_gated_delta_rule and chunk_kda at issue 7's shape
(B=8 T=4096 H=16 K=V=128 bf16) inside a CUDA profiler range, after warm-up calls, for Nsight
Compute's per-kernel counters:

    ncu --profile-from-start off --clock-control none --metrics ... python bench/la_profile.py [gdn|kda]
"""

from __future__ import annotations

import sys

import fusedops
import torch
from la_timing import _inputs


def main(which="gdn"):
    B, T, H, K = 8, 4096, 16, 128
    kda = which == "kda"
    inputs = _inputs(B, T, H, H, K, K, torch.bfloat16, kda)
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    fn = fusedops.chunk_kda if kda else fusedops.chunk_gated_delta_rule

    def step():
        o = fn(*leaves, K ** -0.5)[0]
        torch.autograd.grad(o, leaves, do)

    do = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16)
    step()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
