"""chunk_loss with the caller's fp32 main_grad (grad_weight_buffer) at several chunk budgets on
CUDA: median fwd+bwd time (CUDA events, 10 calls after 3 warm-up, no L2 flush) and peak extra
memory, at N=8192 H=4096 V=128256 bf16.

    python bench/chunk_loss_budgets.py 1024 768 512     # budgets in MiB
"""

from __future__ import annotations

import sys

import fusedops
import torch


def main(budgets_mib: list[int]) -> None:
    dev = torch.device("cuda")
    n, h, v = 8192, 4096, 128256
    gen = torch.Generator(device=dev).manual_seed(0)
    hidden = torch.randn(n, h, generator=gen, device=dev).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(v, h, generator=gen, device=dev) * 0.02).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=gen, device=dev)
    main_grad = torch.zeros(v, h, device=dev)
    for mib in budgets_mib:
        def step(mib=mib):
            loss = fusedops.chunk_loss(hidden, weight, labels, reduction="mean",
                                       grad_weight_buffer=main_grad, memory_budget=mib << 20)
            return torch.autograd.grad(loss, [hidden])[0]

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        times = []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        print(f"budget {mib} MiB: fwd+bwd median {times[5]:.2f} ms min {times[0]:.2f} ms, "
              f"peak extra {peak / 2**30:.3f} GiB", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1024, 512])
