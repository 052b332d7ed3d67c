"""Gated delta rule with fusedops: a training step of a GDN attention block's core, a packed
(varlen) batch, and decoding with the recurrent form from the prefill's final state.

    python examples/python/gated_delta_rule.py
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
a = torch.randn(B, T, HV, device=device, requires_grad=True)     # gate pre-activation
b = torch.randn(B, T, HV, device=device, requires_grad=True)     # beta logits
A_log = torch.log(torch.empty(HV, device=device).uniform_(1, 16)).requires_grad_()
dt_bias = torch.zeros(HV, device=device, requires_grad=True)

# 1. Training: gate, beta sigmoid and the q/k l2norm fused into the operator.
o, final_state = fusedops.chunk_gated_delta_rule(
    q, k, v, a, b, initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True,
    use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
loss = o.square().mean() + 1e-3 * final_state.square().sum()
loss.backward()
print(f"o {tuple(o.shape)}, final_state {tuple(final_state.shape)} {final_state.dtype}, "
      f"|dq| {q.grad.norm():.2e}, dA_log {[round(x, 6) for x in A_log.grad.tolist()]}")

# 2. A packed batch of three sequences (lengths 100, 0 and 156) in one call.
cu_seqlens = torch.tensor([0, 100, 100, 256], dtype=torch.int32, device=device)
g = F.logsigmoid(torch.randn(1, T, HV, device=device))
beta = torch.rand(1, T, HV, device=device)
qn, kn = F.normalize(q[:1].detach(), dim=-1), F.normalize(k[:1].detach(), dim=-1)
o_packed, states = fusedops.chunk_gated_delta_rule(qn, kn, v[:1].detach(), g, beta,
                                                   output_final_state=True, cu_seqlens=cu_seqlens)
print(f"varlen: o {tuple(o_packed.shape)}, one state per sequence {tuple(states.shape)}")

# 3. Decoding: prefill with the chunk form, then one token at a time with the recurrent form.
o_prefill, state = fusedops.chunk_gated_delta_rule(qn[:, :200], kn[:, :200], v[:1, :200].detach(),
                                                   g[:, :200], beta[:, :200], output_final_state=True)
outs = []
for t in range(200, 210):
    o_t, state = fusedops.fused_recurrent_gated_delta_rule(
        qn[:, t:t + 1], kn[:, t:t + 1], v[:1, t:t + 1].detach(), g[:, t:t + 1],
        beta=beta[:, t:t + 1], initial_state=state, output_final_state=True)
    outs.append(o_t)
full, _ = fusedops.chunk_gated_delta_rule(qn[:, :210], kn[:, :210], v[:1, :210].detach(),
                                          g[:, :210], beta[:, :210])
err = (torch.cat(outs, 1) - full[:, 200:210]).abs().max().item()
print(f"decoding 10 tokens after a 200-token prefill matches the full chunked call: max diff {err:.2e}")
