"""chunk_kda (Kimi delta attention, docs/specs/linear_attention.md section 9) in the operator report.

The op is bound by arithmetic: per (sequence, head) chunk of C tokens with K = V = D the chunk
products are those of GDN (kkt, w/u, state, output: ~2*(3.5 C^2 D + 3 C D^2) FLOPs forward) plus
the per-channel decays of the intra-chunk scores (element-wise exponentials on the 16-row diagonal
sub-blocks, two extra C x C x D products for the off-diagonal ones); fwd+bwd is ~4x the forward.
Minimum bytes (s = element size): read q, k, v, g [B,T,H,D], beta; write o (fwd); fwd+bwd also
reads dO and writes dq, dk, dv, dg, dbeta.

Rows (case shape [B,T,HV,V]):
  fusedops   fusedops.chunk_kda (chunk_size 64)
  eager      the chunked algorithm written in plain PyTorch the way a user would: vectorised over
             batch and heads, a Python loop over chunks (per-channel decay tensor [B,H,C,C,K]
             masked before the exp, batched solve_triangular, w/u, state update), backward by
             autograd
  fla        flash-linear-attention's chunk_kda (Triton, CUDA only) when installed
GPU cases also time one decoding step of fused_recurrent_kda (gated_delta_rule.py's decode case in
KDA's gate form).
CPU case: issue 4's target [2, 2048, 4, 128] fp32 (fusedops vs eager: forward+backward must be at
least 3x faster). The check compares o (fwd) and dq, dk, dv, dg, dbeta (fwd+bwd) with the eager
chunked algorithm in float64 (base of the precision policy: the same in the input dtype).
"""

from __future__ import annotations

import fusedops
import torch
import torch.nn.functional as F

from .. import common
from ..common import Case, Impl, peer_status, shapes_and_dtypes
from .gated_delta_rule import DECODE_SHAPE, NAMES, _decode_case, make_impl, promoted, unit_lower_inverse

OP = "chunk_kda"

GPU_SHAPES = [(8, 4096, 16, 128)]
GPU_QUICK_SHAPES = [(2, 1024, 16, 128)]
CPU_SHAPES = [(2, 2048, 4, 128)]  # issue 4's CPU target
CPU_QUICK_SHAPES = [(1, 256, 2, 64)]
GPU_DTYPES = [torch.bfloat16]
CPU_DTYPES = [torch.float32]
BT = 64


def chunked_kda_torch(q, k, v, g, beta, scale, initial_state=None, chunk_size=BT):
    """KDA chunk by chunk in plain PyTorch (the 'eager' baseline): vectorised over batch and
    heads, one Python iteration per chunk."""
    out_dtype = q.dtype
    q, k, v, g, beta, initial_state = promoted(q, k, v, g, beta, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    pad = (C - T % C) % C
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    N = (T + pad) // C
    q, k, v, g = (x.reshape(B, N, C, H, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v, g))  # [B,H,N,C,D]
    beta = beta.reshape(B, N, C, H).permute(0, 3, 1, 2)  # [B,H,N,C]
    g = g.cumsum(-2)  # chunk-local cumsum
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    S = initial_state if initial_state is not None else q.new_zeros(B, H, K, V)
    outs = []
    for i in range(N):
        qi, ki, vi, gi, bi = q[:, :, i], k[:, :, i], v[:, :, i], g[:, :, i], beta[:, :, i]
        diff = gi[:, :, :, None, :] - gi[:, :, None, :, :]  # [B,H,C,C,K]
        E = torch.where(incl[:, :, None], diff, torch.full_like(diff, float("-inf"))).exp()
        KE = E * ki[:, :, None, :, :]
        Aqk = torch.einsum("bhik,bhijk->bhij", qi, KE) * scale
        L = (torch.einsum("bhik,bhijk->bhij", ki, KE) * bi[..., None]).tril(-1)
        A = unit_lower_inverse(L, eye)
        w = A @ (ki * gi.exp() * bi[..., None])
        u = A @ (vi * bi[..., None])
        vn = u - w @ S
        outs.append(scale * (qi * gi.exp()) @ S + Aqk @ vn)
        gl = gi[:, :, -1]
        S = S * gl.exp()[..., None] + (ki * (gl[:, :, None, :] - gi).exp()).transpose(-1, -2) @ vn
    o = torch.stack(outs, 2).permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]
    return o.to(out_dtype), S


def _impls(device, K, T):
    scale = K ** -0.5
    out = [
        make_impl("fusedops", lambda q, k, v, g, b: fusedops.chunk_kda(q, k, v, g, b, scale)[0]),
        make_impl("eager", lambda q, k, v, g, b: chunked_kda_torch(q, k, v, g, b, scale)[0],
              note="PyTorch eager chunked KDA (vectorised over batch/heads, loop over chunks, "
                   "[B,H,C,C,K] decays masked before exp, batched solve_triangular, backward by "
                   "autograd)"),
    ]
    note = "flash-linear-attention chunk_kda (Triton)"
    status = peer_status("fla.ops.kda", device)
    if status != "ok":
        out.append(Impl("fla", status=status, note=note))
    else:
        from fla.ops.kda import chunk_kda as fla_kda
        out.append(make_impl("fla", lambda q, k, v, g, b: fla_kda(q, k, v, g, b, scale=scale)[0], note=note))
    return out


def bytes_moved(B, T, H, D, dtype) -> dict[str, int]:
    s = torch.empty(0, dtype=dtype).element_size()
    fwd = (4 * H * D + H) * B * T * s + H * D * B * T * s
    return {"fwd": fwd, "fwd+bwd": 2 * fwd}


BYTES_NOTE = {"fwd": "read q, k, v, g, beta; write o",
              "fwd+bwd": "fwd + read dO; write dq, dk, dv, dg, dbeta"}


def _case(device, B, T, H, D, dtype) -> Case:
    held: dict = {}

    def make(dev, seed):
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def randn(*shape):
            return torch.randn(shape, generator=gen, dtype=torch.float32)

        inp = {
            "q": F.normalize(randn(B, T, H, D), dim=-1),
            "k": F.normalize(randn(B, T, H, D), dim=-1),
            "v": randn(B, T, H, D),
            "g": F.logsigmoid(torch.rand(B, T, H, D, generator=gen)) / 8,
            "beta": torch.rand(B, T, H, generator=gen).sigmoid(),
            "dy": randn(B, T, H, D),
        }
        inp = {n: t.to(dev, dtype if n in ("q", "k", "v", "dy") else torch.float32) for n, t in inp.items()}
        for n in NAMES:
            inp[n + "_req"] = inp[n].detach().requires_grad_()
        inp["x"] = inp["v"]
        held["inputs"] = inp
        return inp

    def run(inp, dt):
        ts = [inp[n].detach().to(dt).requires_grad_() for n in NAMES]
        o, _ = chunked_kda_torch(*ts, D ** -0.5)
        gs = torch.autograd.grad(o, ts, inp["dy"].to(dt))
        return o.detach(), {"d" + n: g for n, g in zip(NAMES, gs)}

    def pick(t, rows, n_rows=None):
        return t.detach().reshape(n_rows or case.rows, -1)[rows.to(t.device)]

    def reference(_sliced):
        inp = held["inputs"]
        rows = common.row_sample(case.rows, D, case.ref_row_budget_elems)
        # The float64 composite runs on the CPU and dominates this case's time; sequences are
        # independent, so it runs only on the batch rows the sample touches (the first and the
        # last), and the sampled rows are renumbered into that sub-batch.
        per_b = case.rows // B
        bsel = torch.unique(rows // per_b)
        local = torch.searchsorted(bsel, rows // per_b) * per_b + rows % per_b
        o64, g64 = run({n: inp[n][bsel.to(inp[n].device)].cpu() for n in (*NAMES, "dy")}, torch.float64)
        ob, gb = run(inp, dtype)
        held["base"] = {"fwd": {"o": pick(ob, rows)}, "fwd+bwd": {n: pick(t, rows) for n, t in gb.items()}}
        n64 = bsel.numel() * per_b
        return {"fwd": {"o": pick(o64, local, n64)},
                "fwd+bwd": {n: pick(t, local, n64) for n, t in g64.items()}}

    def base(_sliced):
        out = held.pop("base")
        held.clear()
        return out

    case = Case(op=OP, shape=(B, T, H, D), dtype=dtype,
                params={"K=V": D, "chunk_size": BT, "gflop_fwd": round(
                    2 * B * H * (T / BT) * (5.5 * BT * BT * D + 3 * BT * D * D) / 1e9, 2)},
                make_inputs=make, impls=_impls(device, D, T), reference=reference, base=base,
                bytes_moved=bytes_moved(B, T, H, D, dtype), bytes_note=BYTES_NOTE)
    return case


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    shapes, dtypes = shapes_and_dtypes(globals(), device, quick, dtypes)
    out = [_case(device, *s, dt) for s in shapes for dt in dtypes]
    if device.type != "cuda":
        return out
    B, H, D = DECODE_SHAPE  # decoding with fused_recurrent_kda, as GDN's report does
    return out + [_decode_case(device, 8 if quick else B, H, D, dt, kda=True) for dt in dtypes]
