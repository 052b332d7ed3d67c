"""CUDA-graph capture of a forward + backward step (tests of the GPU operators)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
         torch.float16: torch.int16}


def assert_replay_matches_eager(fresh, n_leaves, step):
    """Captures `step(static)` (a forward and its autograd backward; returns tensors) into a CUDA
    graph after two warm-up steps on a side stream, copies new inputs `fresh()` into the captured
    ones, replays, and asserts that every output is bitwise the eager step's on the new inputs.
    `fresh()` returns the inputs (the first `n_leaves` are the differentiable leaves)."""
    static = [t.clone().requires_grad_(i < n_leaves) for i, t in enumerate(fresh())]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(static)
    with torch.no_grad():
        for s, n in zip(static, fresh()):
            s.copy_(n)
    graph.replay()
    eager = step(static)
    torch.cuda.synchronize()
    assert len(captured) == len(eager)
    for i, (a, b) in enumerate(zip(captured, eager)):
        assert torch.equal(a.view(_BITS[a.dtype]), b.view(_BITS[b.dtype])), f"output {i}"


def assert_linear_attention_replay_matches_eager(op, per_channel_gate, seed, B=8, T=160, H=16, D=128,
                                                 cu_seqlens=None):
    """assert_replay_matches_eager for a chunked linear-attention op `op(q, k, v, g, beta, scale=)`
    returning (o, final_state): bf16 q, k (unit rows), v and dO, fp32 log-sigmoid gates (per head,
    or per channel when per_channel_gate) and betas; the step is o and the gradients of the five.
    With cu_seqlens (a list; B must be 1, T its last entry) the sequences are packed: the op's
    host-side tables of them are built by the warm-up steps, before the capture."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32, device="cuda")

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    def fresh():
        gate = (B, T, H, D) if per_channel_gate else (B, T, H)
        return [rnd(B, T, H, D).bfloat16(), F.normalize(rnd(B, T, H, D), dim=-1).bfloat16(),
                rnd(B, T, H, D).bfloat16(), F.logsigmoid(rnd(*gate) + 2), torch.sigmoid(rnd(B, T, H)),
                rnd(B, T, H, D).bfloat16()]

    def step(x):
        o, _ = op(*x[:5], scale=D ** -0.5, cu_seqlens=cu)
        return (o, *torch.autograd.grad(o, x[:5], x[5]))

    assert_replay_matches_eager(fresh, 5, step)
