"""Smoke test of an installed fusedops (run by tools/test_wheel.sh in a fresh venv, away from the
source tree): every operator forward and backward on the CPU, each output checked against the same
call on the float64 reference backend, and every registered op dispatched at least once."""

import math
import sys

import fusedops
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def leaf(*shape, dtype=torch.float32, fn=None):
    t = torch.randn(*shape, dtype=dtype)
    if fn is not None:
        t = fn(t)
    return t.detach().requires_grad_()


def norm(t):
    return F.normalize(t, dim=-1)


def cases():
    """{name: (inputs, call)}; call(*inputs) returns a tensor or a tuple whose first element is
    differentiated."""
    B, T, H, K = 1, 80, 2, 16
    gdn = lambda: (leaf(B, T, H, K, fn=norm), leaf(B, T, H, K, fn=norm), leaf(B, T, H, K),  # noqa: E731
                   leaf(B, T, H, fn=F.logsigmoid), leaf(B, T, H, fn=torch.sigmoid))
    kda = lambda: (leaf(B, T, H, K, fn=norm), leaf(B, T, H, K, fn=norm), leaf(B, T, H, K),  # noqa: E731
                   leaf(B, T, H, K, fn=lambda t: F.logsigmoid(t) / 4), leaf(B, T, H, fn=torch.sigmoid))
    labels = torch.randint(0, 50, (16,))
    return {
        "rmsnorm_without_weight": ((leaf(8, 64),), lambda x: fusedops.rmsnorm_without_weight(x)),
        "l2norm": ((leaf(8, 64),), fusedops.l2norm),
        "rms_norm_gated": ((leaf(8, 64), leaf(8, 64), leaf(64)),
                           lambda x, z, w: fusedops.rms_norm_gated(x, z, w, group_size=32)),
        "causal_conv1d": ((leaf(2, 24, 32), leaf(4, 32)),
                          lambda x, w: fusedops.causal_conv1d(x, w, activation="silu")[0]),
        "clipped_swiglu": ((leaf(8, 64, fn=lambda t: 4 * t),), fusedops.clipped_swiglu),
        "sort_chunks_by_idx": ((leaf(12, 16),),
                               lambda x: fusedops.sort_chunks_by_idx(
                                   x, torch.tensor([3, 4, 5]), torch.tensor([2, 0, 1]))[0]),
        "matmul_add": ((leaf(16, 8), leaf(16, 12)),
                       lambda g, x: fusedops.matmul_add(g.detach(), x.detach(), torch.zeros(8, 12))),
        "fused_cross_entropy_loss": ((leaf(16, 50),),
                                     lambda z: fusedops.fused_cross_entropy_loss(z, labels)),
        "chunk_loss": ((leaf(16, 32), leaf(50, 32)),
                       lambda h, w: fusedops.chunk_loss(h, w, labels, chunk_size=5)),
        "sinkhorn": ((leaf(6, 4, 4),), fusedops.sinkhorn),
        "hc_split_sinkhorn": ((leaf(6, 24), leaf(3), leaf(24)),
                              lambda m, s, b: fusedops.hc_split_sinkhorn(m, s, b)[2]),
        "mhc_pre_bmm": ((leaf(2, 3, 4, fn=torch.sigmoid), leaf(2, 3, 4, 16)), fusedops.mhc_pre_bmm),
        "mhc_post": ((leaf(2, 3, 4, 16), leaf(2, 3, 4, 4), leaf(2, 3, 16), leaf(2, 3, 4)),
                     fusedops.mhc_post),
        "chunk_gated_delta_rule": (gdn(), lambda q, k, v, g, b: fusedops.chunk_gated_delta_rule(
            q, k, v, g, b, use_qk_l2norm_in_kernel=True)[0]),
        "chunk_gated_delta_rule (gate, sigmoid)": (gdn(), lambda q, k, v, g, b: fusedops.chunk_gated_delta_rule(
            q, k, v, g, b, use_gate_in_kernel=True, A_log=torch.zeros(H), use_beta_sigmoid_in_kernel=True)[0]),
        "fused_recurrent_gated_delta_rule": (gdn(), lambda q, k, v, g, b:
                                             fusedops.fused_recurrent_gated_delta_rule(q, k, v, g, beta=b)[0]),
        "chunk_kda": (kda(), lambda q, k, v, g, b: fusedops.chunk_kda(q, k, v, g, b)[0]),
        "chunk_kda (gate)": (kda(), lambda q, k, v, g, b: fusedops.chunk_kda(
            q, k, v, g, b, use_gate_in_kernel=True, A_log=torch.zeros(H), dt_bias=torch.zeros(H * K))[0]),
        "fused_recurrent_kda": (kda(), lambda q, k, v, g, b: fusedops.fused_recurrent_kda(q, k, v, g, b)[0]),
    }


def first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def run(call, inputs):
    out = first(call(*inputs))
    grads = []
    if out.requires_grad:
        # Random weights: a sum, or weights additive over rows and columns, would give mHC's
        # doubly stochastic matrices a zero gradient.
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        (out.double() * w.double()).sum().backward()
        grads = [x.grad.clone() if x.grad is not None else None for x in inputs]
        for x in inputs:
            x.grad = None
    return out.detach(), grads


def rel(a, b):
    return (a.double() - b.double()).norm().item() / max(b.double().norm().item(), 1e-30)


def main() -> int:
    print(f"fusedops {fusedops.__version__} from {fusedops.__file__}; torch {torch.__version__}; "
          f"built with CUDA: {fusedops.built_with_cuda()}")
    failures, ran = [], set()
    for name, (inputs, call) in cases().items():
        with fusedops.dispatch_trace() as trace:
            out, grads = run(call, inputs)
        ran |= {e["op"] for e in trace.dispatches() if e["backend"] == "cpu"}
        with fusedops.use_backend("ref"):
            ref_out, ref_grads = run(call, [x.detach().double().requires_grad_() for x in inputs])
        errs = [rel(out, ref_out)] + [rel(g, r) for g, r in zip(grads, ref_grads) if g is not None]
        worst = max(errs)
        ok = math.isfinite(worst) and worst < 1e-3 and bool(grads or not out.requires_grad)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max rel err vs float64 {worst:.1e} over "
              f"{len(errs)} outputs")
        if not ok:
            failures.append(name)
    # The map form of the permutation (TransformerEngine's helpers) is its own entry point.
    x = torch.randn(12, 16)
    with fusedops.dispatch_trace() as trace:
        row_map = fusedops.sort_chunks.make_chunk_sort_map(torch.tensor([3, 4, 5]), torch.tensor([2, 0, 1]), 12, 3)
        out = fusedops.sort_chunks.sort_chunks_by_map(x, row_map, None, 12, 16, True)
    ran |= {e["op"] for e in trace.dispatches() if e["backend"] == "cpu"}
    expect = torch.cat([x[7:12], x[0:3], x[3:7]])
    ok = torch.equal(first(out), expect)
    print(f"{'ok  ' if ok else 'FAIL'} sort_chunks_by_map: {'equal to' if ok else 'differs from'} "
          "the concatenated chunks")
    if not ok:
        failures.append("sort_chunks_by_map")
    # The pieces of the distributed forms (a vocabulary shard's cross-entropy statistics, the
    # context-parallel fold and fill) need a process group: tests/python/distributed covers them.
    distributed_only = {"cross_entropy_shard", "la_cp_fill", "la_cp_fold"}
    missing = sorted(set(fusedops._C.ops()) - ran - distributed_only)
    print(f"ops dispatched on the cpu backend: {len(ran)} of {len(fusedops._C.ops())} "
          f"({', '.join(sorted(distributed_only & set(fusedops._C.ops()))) or 'none'} need a process group)"
          + (f"; never: {', '.join(missing)}" if missing else ""))
    if failures:
        print(f"FAILED: {', '.join(failures)}")
    return 1 if failures or missing else 0


if __name__ == "__main__":
    sys.exit(main())
