"""Small calls of cuda_sm90's per-token backward (the thread-block-cluster kernel of
src/ops/linear_attention/linear_attention_recurrent_bwd_sm90.cu), sized for compute-sanitizer's
racecheck and synccheck, which are too slow for the test suite's shapes:

* GDN, a five-tile cluster (V = 130) with two value heads per q/k head, K = 100 and T = 70: past
  several 16-token checkpoint segments, so the workspace is written and read;
* KDA (per-channel gate), three tiles (V = 72), K = 128, T = 70;
* a GDN decoding step (T = 1), four sequences.

Each call has an initial state (so dh0 is written) and every gradient; the script prints whether
each gradient is finite. On an sm_90 GPU, from a tree whose extension is built:

    compute-sanitizer --tool racecheck --error-exitcode 99 python3 tools/debug/recurrent_cluster_calls.py
    compute-sanitizer --tool synccheck --error-exitcode 99 python3 tools/debug/recurrent_cluster_calls.py

tools/gpu_timeboxed.sh runs both in its stage "cluster_sanitize".
"""

import fusedops
import torch

CALLS = (  # op, per-channel gate, (B, T, H, HV, K, V)
    ("fused_recurrent_gated_delta_rule", False, (1, 70, 1, 2, 100, 130)),
    ("fused_recurrent_kda", True, (1, 70, 1, 1, 128, 72)),
    ("fused_recurrent_gated_delta_rule", False, (4, 1, 2, 2, 128, 128)),
)


def main() -> None:
    torch.manual_seed(0)
    d = "cuda"
    for op, per_channel, (B, T, H, HV, K, V) in CALLS:
        q = (torch.randn(B, T, H, K, device=d) * 0.3).requires_grad_()
        k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=d), dim=-1).requires_grad_()
        v = torch.randn(B, T, HV, V, device=d).requires_grad_()
        g = (-0.1 * torch.rand(*((B, T, HV, K) if per_channel else (B, T, HV)), device=d)).requires_grad_()
        beta = torch.rand(B, T, HV, device=d).requires_grad_()
        h0 = torch.randn(B, HV, K, V, device=d).requires_grad_()
        with fusedops.use_backend(**{op: "cuda_sm90"}):
            o, ht = getattr(fusedops, op)(q, k, v, g, beta=beta, scale=0.3, initial_state=h0,
                                          output_final_state=True)
            grads = torch.autograd.grad(o.sum() + ht.sum(), [q, k, v, g, beta, h0])
        torch.cuda.synchronize()
        print(op, (B, T, H, HV, K, V), "finite gradients:", [bool(torch.isfinite(x).all()) for x in grads])


if __name__ == "__main__":
    main()
