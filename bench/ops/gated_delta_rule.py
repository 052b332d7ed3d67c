"""chunk_gated_delta_rule (GDN, docs/specs/linear_attention.md section 1) in the operator report.

The op is bound by arithmetic (chunk products of 64 x 128 x 128), not bytes. FLOPs per
(sequence, head) chunk of C tokens with K = V = D (multiply-adds x 2):
  fwd      kkt C*C*D + w,u 2*C*C*D/2 + state 2*C*D*D + output C*C*D + C*D*D + C*C*D/2  ~ 2*(3.5 C^2 D + 3 C D^2)
  fwd+bwd  fwd + recompute (w,u, state) + dv_local + dhu + dqkwg + wy  ~ 4x the forward
Minimum bytes (s = element size): read q,k,v,g,beta, write o (fwd); fwd+bwd also reads dO and
writes dq,dk,dv,dg,dbeta: (2*H*K + 2*HV*V + 2*HV) * B*T*s for fwd, x2 for fwd+bwd.

Rows (case shape [B,T,HV,V]):
  fusedops   fusedops.chunk_gated_delta_rule (chunk_size 64)
  eager      the chunked algorithm written in plain PyTorch the way a user would: vectorised over
             batch, heads and chunks for the intra-chunk parts (kkt, a batched triangular solve,
             w/u), a Python loop over chunks for the state recurrence, backward by autograd
  recurrent  the naive per-token recurrence in PyTorch (loop over T), backward by autograd
             (activations checkpointed every 64 tokens so that memory stays bounded)
  fla        flash-linear-attention's chunk_gated_delta_rule (Triton, CUDA only) when installed
GPU cases (issue 7): B=8 T=4096 H=16 K=V=128 bf16; the same with HV=32 grouped values; varlen, 8
sequences of random lengths totalling 32768 tokens (B=1); B=1 T=32768; and one decoding step of
fused_recurrent_gated_delta_rule at B=64 H=16 with an fp32 state (fwd: o and the new state;
fwd+bwd: gradients of o, also into the state). flash-linear-attention's GDN backward refuses to run
on Hopper with Triton < 3.7.1; the report bypasses that guard for timing only and says so in the
row's note (its gradients are still checked against float64 like every other row).
CPU cases: issue 3's target [2, 2048, 4, 128] fp32 (fusedops vs eager: forward+backward must be
at least 3x faster), and [2, 256, 4, 128] with the naive recurrence as well (at T=2048 its
per-token Python loop alone takes tens of seconds per forward+backward).
The check compares o (fwd) and dq, dk, dv, dg, dbeta (fwd+bwd) with the eager chunked algorithm
in float64 (base of the precision policy: the same in the input dtype).
"""

from __future__ import annotations

import os

import fusedops
import torch
import torch.nn.functional as F

from .. import common
from ..common import Case, Impl, peer_status

OP = "chunk_gated_delta_rule"

# GPU cases of issue 7 (B, T, H, K=V, HV, varlen sequence count): the target shape, grouped values
# (HV = 32), varlen (8 sequences of random lengths, 32768 tokens, B = 1) and one long sequence.
GPU_SHAPES = [(8, 4096, 16, 128, 16, 0), (8, 4096, 16, 128, 32, 0), (1, 32768, 16, 128, 16, 8),
              (1, 32768, 16, 128, 16, 0)]
GPU_QUICK_SHAPES = [(2, 1024, 16, 128, 16, 0), (1, 2048, 4, 128, 8, 3)]
DECODE_SHAPE = (64, 16, 128)  # decoding with the recurrent form: B, H, K=V (fp32 state)
CPU_SHAPES = [(2, 2048, 4, 128), (2, 256, 4, 128)]  # issue 3's CPU target; the recurrence's case
CPU_QUICK_SHAPES = [(1, 256, 2, 64)]
RECURRENT_MAX_T = 512  # the naive recurrence runs only at T up to this
GPU_DTYPES = [torch.bfloat16]
CPU_DTYPES = [torch.float32]
BT = 64


def promoted(*ts):
    """The tensors (None allowed) in their common promoted dtype: the eager composites run mixed
    inputs (16-bit q/k/v with fp32 gates or state) as PyTorch's own type promotion would."""
    dt = None
    for x in ts:
        if x is not None:
            dt = x.dtype if dt is None else torch.promote_types(dt, x.dtype)
    return tuple(None if x is None else x.to(dt) for x in ts)


def unit_lower_inverse(L, eye):
    """(I + L)^-1 for strictly lower L. CUDA has no 16-bit triangular solve: 16-bit inputs are
    solved in fp32 and rounded back to their dtype."""
    if L.dtype in (torch.bfloat16, torch.float16):
        A = torch.linalg.solve_triangular((eye + L).float(), eye.float().expand_as(L), upper=False,
                                          unitriangular=True)
        return A.to(L.dtype)
    return torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)


def chunked_torch(q, k, v, g, beta, scale, initial_state=None, chunk_size=BT):
    """The gated delta rule chunk by chunk in plain PyTorch (the 'eager' baseline)."""
    out_dtype = q.dtype
    q, k, v, g, beta, initial_state = promoted(q, k, v, g, beta, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    pad = (chunk_size - T % chunk_size) % chunk_size
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    N = (T + pad) // chunk_size
    q, k, v = (x.reshape(B, N, chunk_size, H, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v))
    g, beta = (x.reshape(B, N, chunk_size, H).permute(0, 3, 1, 2) for x in (g, beta))
    g = g.cumsum(-1)
    mask = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    diff = g[..., :, None] - g[..., None, :]
    decay = torch.where(mask, diff, torch.full_like(diff, float("-inf"))).exp()
    kb = k * beta[..., None]
    L = ((kb @ k.transpose(-1, -2)) * decay).tril(-1)
    eye = torch.eye(chunk_size, dtype=q.dtype, device=q.device)
    A = unit_lower_inverse(L, eye)
    w = A @ (kb * g.exp()[..., None])
    u = A @ (v * beta[..., None])
    S = initial_state if initial_state is not None else q.new_zeros(B, H, K, V)
    qs = q * scale
    outs = []
    for i in range(N):
        qi, ki, ui, wi, gi, di = qs[:, :, i], k[:, :, i], u[:, :, i], w[:, :, i], g[:, :, i], decay[:, :, i]
        vn = ui - wi @ S
        outs.append((qi * gi.exp()[..., None]) @ S + ((qi @ ki.transpose(-1, -2)) * di) @ vn)
        gl = gi[..., -1:]
        S = S * gl[..., None].exp() + (ki * (gl - gi).exp()[..., None]).transpose(-1, -2) @ vn
    o = torch.stack(outs, 2).permute(0, 2, 3, 1, 4).reshape(B, N * chunk_size, H, V)[:, :T]
    return o.to(out_dtype), S


def _recurrent_segment(S, q, k, v, g, beta, scale):
    outs = []
    for t in range(q.shape[1]):
        # GDN's gate g [B, T, H] scales the whole state; KDA's g [B, T, H, K] scales its rows.
        S = S * (g[:, t, :, None, None] if g.dim() == 3 else g[:, t, :, :, None]).exp()
        delta = beta[:, t, :, None] * (v[:, t] - (S * k[:, t, :, :, None]).sum(-2))
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append(scale * (S * q[:, t, :, :, None]).sum(-2))
    return torch.stack(outs, 1), S


def recurrent_torch(q, k, v, g, beta, scale, initial_state=None, segment=64):
    """The naive per-token recurrence (section 1.1) in plain PyTorch; under autograd each segment
    of 64 tokens is checkpointed (recomputed in the backward) so that the saved states stay small."""
    from torch.utils.checkpoint import checkpoint

    B, T, H, K = q.shape
    V = v.shape[-1]
    S = initial_state if initial_state is not None else q.new_zeros(B, H, K, V)
    outs = []
    for t0 in range(0, T, segment):
        sl = slice(t0, t0 + segment)
        args = (S, q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], scale)
        if torch.is_grad_enabled() and q.requires_grad:
            o, S = checkpoint(_recurrent_segment, *args, use_reentrant=False)
        else:
            o, S = _recurrent_segment(*args)
        outs.append(o)
    return torch.cat(outs, 1), S


def _grads(out, inp, names):
    leaves = [inp[n + "_req"] for n in names]
    gs = torch.autograd.grad(out, leaves, inp["dy"])
    return {"d" + n: g for n, g in zip(names, gs)}


NAMES = ("q", "k", "v", "g", "beta")


def make_impl(name, fn, note=""):
    """An Impl of a (q, k, v, g, beta) -> o function: the forward, and the forward and backward
    from the requires-grad inputs (shared with the KDA bench)."""
    def fwd(inp):
        return {"o": fn(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"])}

    def fwd_bwd(inp):
        o = fn(*(inp[n + "_req"] for n in NAMES))
        return _grads(o, inp, NAMES)

    return Impl(name, fwd, fwd_bwd, note=note)


def grouped(fn, q, k, v, *rest):
    """Runs a per-head implementation with grouped values (HV a multiple of H) the way a user
    would: q and k repeated to the value heads."""
    r = v.shape[2] // q.shape[2]
    if r > 1:
        q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
    return fn(q, k, v, *rest)


def per_sequence(fn, cu, q, k, v, g, beta, scale):
    """A varlen batch (B = 1, sequences at cu) run one sequence at a time, as a user of a
    per-batch implementation would."""
    outs = []
    for i in range(len(cu) - 1):
        sl = slice(cu[i], cu[i + 1])
        outs.append(grouped(fn, q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], scale)[0])
    return torch.cat(outs, 1)


def eager_o(q, k, v, g, b, scale, cu=None):
    if cu is None:
        return grouped(chunked_torch, q, k, v, g, b, scale)[0]
    return per_sequence(chunked_torch, cu, q, k, v, g, b, scale)


def _fla_guard_bypassed() -> bool:
    """flash-linear-attention refuses its GDN backward on Hopper with Triton 3.4.0 .. 3.7.0 (a
    miscompile it reports as its issue #640). For timing only, the report turns the guard off;
    the report's own check of fla's gradients against float64 still runs and is printed."""
    import fla.ops.common.chunk_o as chunk_o

    if getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        return False
    chunk_o.TRITON_ABOVE_3_7_1 = True
    return True


def _impls(device, K, T, cu=None):
    scale = K ** -0.5
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)
    # fla before the PyTorch composites: at the long and varlen shapes an eager fwd+bwd call takes
    # about a second, and a run cut short by the time limit keeps the peer's rows.
    out = [make_impl("fusedops", lambda q, k, v, g, b: fusedops.chunk_gated_delta_rule(
        q, k, v, g, b, scale, cu_seqlens=cu_t)[0])]
    qla_note = "FlashQLA chunk_gated_delta_rule (TileLang; what flash-linear-attention 0.6 dispatches to when installed)"
    status = peer_status("flash_qla", device)
    if status != "ok":
        out.append(Impl("flashqla", status=status, note=qla_note))
    else:
        peer = {}

        def qla_setup():
            import flash_qla  # imported after fusedops' first calls (it loads TileLang)

            peer["gdn"] = flash_qla.chunk_gated_delta_rule

        qla = make_impl("flashqla", lambda q, k, v, g, b: peer["gdn"](
            q, k, v, g, b, scale=scale, cu_seqlens=None if cu_t is None else cu_t.long())[0], note=qla_note)
        qla.setup = qla_setup
        out.append(qla)
    note = "flash-linear-attention chunk_gated_delta_rule (Triton)"
    status = peer_status("fla.ops.gated_delta_rule", device)
    if status != "ok":
        out.append(Impl("fla", status=status, note=note))
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

        def setup():
            if peer_status("flash_qla", device) == "ok":
                # fla 0.6 would dispatch to FlashQLA (the row above); FLA_FLASH_QLA=0, read at
                # fla's first dispatch, keeps this row on fla's own Triton kernels.
                os.environ["FLA_FLASH_QLA"] = "0"
                impl.workarounds.append("FLA_FLASH_QLA=0: its FlashQLA backend off (the flashqla row "
                                        "times FlashQLA itself)")
            if _fla_guard_bypassed():
                impl.workarounds.append("its Triton-version guard on the Hopper backward was "
                                        "bypassed for timing only (Triton < 3.7.1)")

        impl = make_impl("fla", lambda q, k, v, g, b: fla_gdn(q, k, v, g, b, scale=scale, cu_seqlens=cu_t)[0],
                     note=note)
        impl.setup = setup
        out.append(impl)
    out.append(make_impl("eager", lambda q, k, v, g, b: eager_o(q, k, v, g, b, scale, cu),
                     note="PyTorch eager chunked GDN (vectorised over batch/heads/chunks, loop over chunks "
                          "for the state, batched solve_triangular, backward by autograd; grouped values by "
                          "repeating q/k, varlen one sequence at a time)"))
    if T <= RECURRENT_MAX_T and cu is None:
        out.append(make_impl("recurrent", lambda q, k, v, g, b: grouped(recurrent_torch, q, k, v, g, b, scale)[0],
                         note="naive per-token recurrence in PyTorch (loop over T), backward by "
                              "autograd with 64-token checkpoints"))
    return out


def bytes_moved(B, T, H, D, dtype, HV=None) -> dict[str, int]:
    s = torch.empty(0, dtype=dtype).element_size()
    HV = HV or H
    fwd = (2 * H * D + 2 * HV * D + 2 * HV) * B * T * s
    return {"fwd": fwd, "fwd+bwd": 2 * fwd}


def varlen_lengths(n: int, total: int, seed: int = 0) -> list[int]:
    """n random sequence lengths summing to total (each at least 1), fixed by seed."""
    gen = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(total - 1, generator=gen)[: n - 1].add(1).tolist())
    edges = [0, *cuts, total]
    return [edges[i + 1] - edges[i] for i in range(n)]


BYTES_NOTE = {"fwd": "read q, k, v, g, beta; write o",
              "fwd+bwd": "fwd + read dO; write dq, dk, dv, dg, dbeta"}


def _case(device, B, T, H, D, dtype, HV=None, nseq=0) -> Case:
    held: dict = {}
    HV = HV or H
    cu = None
    if nseq:
        lens = varlen_lengths(nseq, T)
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)

    def make(dev, seed):
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def randn(*shape):
            return torch.randn(shape, generator=gen, dtype=torch.float32)

        inp = {
            "q": F.normalize(randn(B, T, H, D), dim=-1),
            "k": F.normalize(randn(B, T, H, D), dim=-1),
            "v": randn(B, T, HV, D),
            "g": F.logsigmoid(torch.rand(B, T, HV, generator=gen)),
            "beta": torch.rand(B, T, HV, generator=gen).sigmoid(),
            "dy": randn(B, T, HV, D),
        }
        inp = {n: t.to(dev, dtype if n in ("q", "k", "v", "dy") else torch.float32) for n, t in inp.items()}
        for n in NAMES:
            inp[n + "_req"] = inp[n].detach().requires_grad_()
        inp["x"] = inp["v"]  # the report slices rows of x and dy; the checks below use the whole
        held["inputs"] = inp
        return inp

    def run(inp, dt):
        ts = [inp[n].detach().to(dt).requires_grad_() for n in NAMES]
        o = eager_o(*ts, D ** -0.5, cu)
        gs = torch.autograd.grad(o, ts, inp["dy"].to(dt))
        return o.detach(), {"d" + n: g for n, g in zip(NAMES, gs)}

    def pick(t, rows):
        return t.detach().reshape(case.rows, -1)[rows.to(t.device)]

    def reference(_sliced):
        inp = held["inputs"]
        rows = common.row_sample(case.rows, D, case.ref_row_budget_elems)
        # float64 where the inputs are: on the H200's CPU cores the T = 32768 cases took minutes
        # (a loop of 512 chunks), on the GPU seconds; the sampled rows come back to the host.
        o64, g64 = run({n: inp[n] for n in (*NAMES, "dy")}, torch.float64)
        ref = {"fwd": {"o": pick(o64, rows).cpu()}, "fwd+bwd": {n: pick(t, rows).cpu() for n, t in g64.items()}}
        del o64, g64
        ob, gb = run(inp, dtype)
        held["base"] = {"fwd": {"o": pick(ob, rows)}, "fwd+bwd": {n: pick(t, rows) for n, t in gb.items()}}
        return ref

    def base(_sliced):
        out = held.pop("base")
        held.clear()
        return out

    params = {"H": H, "HV": HV, "K=V": D, "chunk_size": BT, "gflop_fwd": round(
        2 * B * HV * (T / BT) * (3.5 * BT * BT * D + 3 * BT * D * D) / 1e9, 2)}
    if cu is not None:
        params["cu_seqlens"] = cu
    case = Case(op=OP, shape=(B, T, HV, D), dtype=dtype, params=params,
                make_inputs=make, impls=_impls(device, D, T, cu), reference=reference, base=base,
                bytes_moved=bytes_moved(B, T, H, D, dtype, HV), bytes_note=BYTES_NOTE,
                variant=f"varlen({nseq} sequences)" if nseq else "",
                # dynamo unrolls the composite's loop over chunks (and sequences): 64 chunks compile
                # in about a minute, the 512 of T = 32768 would take many
                compile=T // BT <= 64 and not nseq)
    return case


DECODE_NAMES = ("q", "k", "v", "g", "beta", "h0")


def _decode_case(device, B, H, D, dtype, kda=False) -> Case:
    """One decoding step of the recurrent form: state [B, H, K, V] fp32 in, o and the new state
    out. fwd+bwd: gradients of o (and, through the state, of every input and h0). kda: KDA's form
    (fused_recurrent_kda, the gate g [B, 1, H, K] per key channel)."""
    held: dict = {}
    scale = D ** -0.5

    def make(dev, seed):
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def randn(*shape):
            return torch.randn(shape, generator=gen, dtype=torch.float32)

        inp = {
            "q": F.normalize(randn(B, 1, H, D), dim=-1),
            "k": F.normalize(randn(B, 1, H, D), dim=-1),
            "v": randn(B, 1, H, D),
            "g": F.logsigmoid(torch.rand(B, 1, H, *((D,) if kda else ()), generator=gen)),
            "beta": torch.rand(B, 1, H, generator=gen).sigmoid(),
            "h0": randn(B, H, D, D) * 0.1,
            "dy": randn(B, 1, H, D),
        }
        inp = {n: t.to(dev, dtype if n in ("q", "k", "v", "dy") else torch.float32) for n, t in inp.items()}
        for n in DECODE_NAMES:
            inp[n + "_req"] = inp[n].detach().requires_grad_()
        inp["x"] = inp["v"]
        held["inputs"] = inp
        return inp

    def step_torch(q, k, v, g, beta, h0):
        return recurrent_torch(q, k, v, g, beta, scale, h0)

    def impl(name, fn, note=""):
        def fwd(inp):
            o, ht = fn(*(inp[n] for n in DECODE_NAMES))
            return {"o": o, "ht": ht}

        def fwd_bwd(inp):
            leaves = [inp[n + "_req"] for n in DECODE_NAMES]
            o, _ = fn(*leaves)
            gs = torch.autograd.grad(o, leaves, inp["dy"])
            return {"d" + n: g for n, g in zip(DECODE_NAMES, gs)}

        return Impl(name, fwd, fwd_bwd, note=note)

    op = "fused_recurrent_kda" if kda else "fused_recurrent_gated_delta_rule"
    ours = fusedops.fused_recurrent_kda if kda else fusedops.fused_recurrent_gated_delta_rule
    impls = [
        impl("fusedops", lambda q, k, v, g, b, h0: ours(
            q, k, v, g, beta=b, scale=scale, initial_state=h0, output_final_state=True)),
        impl("eager", step_torch, note="the recurrence's step in plain PyTorch, backward by autograd"),
    ]
    # fla's fused_recurrent_kda calls its GDN kernel with the gate as gk.
    note = (f"flash-linear-attention {op} (Triton; it has no backward: its fwd+bwd raises "
            "NotImplementedError)")
    status = peer_status("fla.ops.kda" if kda else "fla.ops.gated_delta_rule", device)
    if status != "ok":
        impls.append(Impl("fla", status=status, note=note))
    elif kda:
        from fla.ops.kda import fused_recurrent_kda as fla_kda_rec
        impls.append(impl("fla", lambda q, k, v, g, b, h0: fla_kda_rec(
            q, k, v, g, beta=b, scale=scale, initial_state=h0, output_final_state=True), note=note))
    else:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_rec
        # By keyword: fla's fifth positional parameter is gk (a per-channel gate), not beta.
        impls.append(impl("fla", lambda q, k, v, g, b, h0: fla_rec(
            q, k, v, g=g, beta=b, scale=scale, initial_state=h0, output_final_state=True), note=note))

    def run(inp, dt):
        ts = [inp[n].detach().to(dt if n != "h0" or dt == torch.float64 else torch.float32)
              .requires_grad_() for n in DECODE_NAMES]
        o, ht = step_torch(*ts)
        gs = torch.autograd.grad(o, ts, inp["dy"].to(dt))
        return {"o": o.detach(), "ht": ht.detach()}, {"d" + n: g for n, g in zip(DECODE_NAMES, gs)}

    def pick(t, rows):
        return t.detach().reshape(case.rows, -1)[rows.to(t.device)]

    def reference(_sliced):
        inp = held["inputs"]
        rows = torch.arange(case.rows)
        f64, g64 = run({n: inp[n].cpu() for n in (*DECODE_NAMES, "dy")}, torch.float64)
        fb, gb = run(inp, dtype)
        held["base"] = {"fwd": {n: pick(t, rows) for n, t in fb.items()},
                        "fwd+bwd": {n: pick(t, rows) for n, t in gb.items()}}
        return {"fwd": {n: pick(t, rows) for n, t in f64.items()},
                "fwd+bwd": {n: pick(t, rows) for n, t in g64.items()}}

    def base(_sliced):
        out = held.pop("base")
        held.clear()
        return out

    s = torch.empty(0, dtype=dtype).element_size()
    state = B * H * D * D * 4
    fwd = (3 * B * H * D + B * H * D) * s + (B * H * D if kda else B * H) * 4 + B * H * 4 + 2 * state
    case = Case(op=op, shape=(B, 1, H, D), dtype=dtype,
                params={"K=V": D, "state": "fp32 [B,H,K,V] in and out", "decode": True},
                make_inputs=make, impls=impls, reference=reference, base=base,
                bytes_moved={"fwd": fwd, "fwd+bwd": 2 * fwd + state},
                bytes_note={"fwd": "read q, k, v, g, beta, h0 (fp32); write o, ht (fp32)",
                            "fwd+bwd": "read q, k, v, g, beta, h0, dO; write dq, dk, dv, dg, dbeta, dh0"},
                ref_row_budget_elems=1 << 30)
    return case


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    if device.type == "cuda":
        shapes = GPU_QUICK_SHAPES if quick else GPU_SHAPES
        dtypes = dtypes or GPU_DTYPES
        out = [_case(device, B, T, H, D, dt, HV, nseq) for (B, T, H, D, HV, nseq) in shapes for dt in dtypes]
        B, H, D = DECODE_SHAPE
        return out + [_decode_case(device, 8 if quick else B, H, D, dt) for dt in dtypes]
    shapes = CPU_QUICK_SHAPES if quick else CPU_SHAPES
    dtypes = dtypes or CPU_DTYPES
    return [_case(device, *s, dt) for s in shapes for dt in dtypes]
