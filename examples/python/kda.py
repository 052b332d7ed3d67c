"""Kimi delta attention with fusedops: a training step of a KDA block's core (per-channel gate,
q/k l2norm and beta sigmoid fused into the operator), a packed (varlen) batch, and decoding with
the recurrent form from the prefill's final state.

    python examples/python/kda.py
"""

import fusedops
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() and fusedops.built_with_cuda() else "cpu"
B, T, H, HV, K, V = 2, 256, 2, 4, 64, 64  # grouped values: 4 value heads read 2 q/k heads

q = torch.randn(B, T, H, K, device=device, requires_grad=True)
k = torch.randn(B, T, H, K, device=device, requires_grad=True)
v = torch.randn(B, T, HV, V, device=device, requires_grad=True)
a = torch.randn(B, T, HV, K, device=device, requires_grad=True)  # per-channel gate pre-activation
b = torch.randn(B, T, HV, device=device, requires_grad=True)     # beta logits
A_log = torch.log(torch.empty(HV, device=device).uniform_(1, 16)).requires_grad_()
dt_bias = torch.zeros(HV * K, device=device, requires_grad=True)

# 1. Training: the gate -exp(A_log) softplus(a + dt_bias), the beta sigmoid and the l2norm fused.
o, final_state = fusedops.chunk_kda(
    q, k, v, a, b, output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
    A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
loss = o.square().mean() + 1e-3 * final_state.square().sum()
loss.backward()
print(f"o {tuple(o.shape)}, final_state {tuple(final_state.shape)} {final_state.dtype}, "
      f"|dq| {q.grad.norm():.2e}, |ddt_bias| {dt_bias.grad.norm():.2e}")

# The bounded gate: lower_bound * sigmoid(exp(A_log) (a + dt_bias)), every step in [-5, 0).
o_lb, _ = fusedops.chunk_kda(q, k, v, a, b, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                             A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
                             safe_gate=True, lower_bound=-5.0)
print(f"lower-bound gate: o {tuple(o_lb.shape)}")

# 2. A packed batch of three sequences (lengths 100, 0 and 156) in one call.
cu_seqlens = torch.tensor([0, 100, 100, 256], dtype=torch.int32, device=device)
g = F.logsigmoid(torch.randn(1, T, HV, K, device=device))
beta = torch.rand(1, T, HV, device=device)
qn, kn = F.normalize(q[:1].detach(), dim=-1), F.normalize(k[:1].detach(), dim=-1)
o_packed, states = fusedops.chunk_kda(qn, kn, v[:1].detach(), g, beta, output_final_state=True,
                                      cu_seqlens=cu_seqlens)
print(f"varlen: o {tuple(o_packed.shape)}, one state per sequence {tuple(states.shape)}")

# 3. Decoding: prefill with the chunk form, then one token at a time with the recurrent form.
o_prefill, state = fusedops.chunk_kda(qn[:, :200], kn[:, :200], v[:1, :200].detach(), g[:, :200],
                                      beta[:, :200], output_final_state=True)
outs = []
for t in range(200, 210):
    o_t, state = fusedops.fused_recurrent_kda(
        qn[:, t:t + 1], kn[:, t:t + 1], v[:1, t:t + 1].detach(), g[:, t:t + 1], beta[:, t:t + 1],
        initial_state=state, output_final_state=True)
    outs.append(o_t)
full, _ = fusedops.chunk_kda(qn[:, :210], kn[:, :210], v[:1, :210].detach(), g[:, :210], beta[:, :210])
err = (torch.cat(outs, 1) - full[:, 200:210]).abs().max().item()
print(f"decoding 10 tokens after a 200-token prefill matches the full chunked call: max diff {err:.2e}")
