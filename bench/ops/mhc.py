"""mHC family (docs/specs/ops.md sections 3 and 9) in the operator report: mhc_pre_bmm, mhc_post and
hc_split_sinkhorn. ``--ops mhc`` runs all three.

Minimum bytes per pass (T tokens, n streams, C channels, s = element size of x; coefficients
fp32; w = (2+n)n):
  mhc_pre_bmm  fwd      read x, h_pre, write y (fp32)                 = T*n*C*s + 4*T*n + 4*T*C
               bwd      read x, h_pre, dy (fp32), write dx, dh_pre     = 2*T*n*C*s + 8*T*n + 4*T*C
  mhc_post     fwd      read x, h_res, h_out, h_post, write out       = 2*T*n*C*s + T*C*s + 4*T*(n*n + n)
               bwd      read x, coefficients, h_out, dy; write dx,
                        dh_res, dh_out, dh_post                        = 3*T*n*C*s + 2*T*C*s + 8*T*(n*n + n)
  hc_split_sinkhorn fwd read mixes, write pre, post, comb              = 8*T*w
               bwd      read mixes, the three gradients, write dmixes  = 12*T*w
(fwd+bwd = fwd + bwd; the parameters and the parameter gradients are a few hundred bytes.)

The report checks row-wise outputs against float64 on a sample of tokens, so every input of a
case is either x, dy, or derived from the token's own x values (h_pre, h_res, h_post, h_out
below): the reference recomputes them from the sampled rows. hc_split_sinkhorn's parameter
gradients (sums over all rows) are checked by the tests, not here.

For hc_split_sinkhorn the "copy" row is the target's yardstick (issue 6: under 2x the time of
copying its inputs and outputs): torch copies that move exactly the op's minimum bytes (a clone
of precomputed results of the op's output size, and for fwd+bwd one more read of dy), timed like
every implementation in the same run.
"""

from __future__ import annotations

import fusedops
import torch

from ..common import Case, Impl, peer_status

OP = "mhc"  # the family; each case names its op

N_STREAMS = 4
EPS = 1e-6
ITERS = 20

GPU_TOKENS, GPU_C = 32768, 4096          # issue 6's target shape
GPU_QUICK_TOKENS, GPU_QUICK_C = 4096, 4096
CPU_TOKENS, CPU_C = 512, 1024
CPU_QUICK_TOKENS, CPU_QUICK_C = 64, 512
GPU_SPLIT_ROWS, GPU_QUICK_SPLIT_ROWS = 32768, 32768
CPU_SPLIT_ROWS, CPU_QUICK_SPLIT_ROWS = 2048, 512


def _esize(dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _grad(out, inputs, g):
    return torch.autograd.grad(out, inputs, g)


# --------------------------------------------------------------------------------------------
# Inputs derived from the token's own values (so the reference can rebuild them from sampled rows)


def _h_pre(x):      # [T, n] fp32
    return torch.sigmoid(x[..., 0].float())


def _h_res(x, n):   # [T, n, n] fp32, from channels 0..n-1 of every stream
    return torch.softmax(x[..., :n].float(), dim=-1)


def _h_post(x, n):  # [T, n] fp32, from channel n of every stream
    return 2.0 * torch.sigmoid(x[..., n].float())


def _h_out(x):      # [T, C] in x's dtype: stream 0 rolled by one channel
    return torch.roll(x[:, 0, :], 1, dims=-1)


def _randn(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)


# --------------------------------------------------------------------------------------------
# mhc_pre_bmm


def _pre_eager(h, x):
    # DeepSeek-V4's hc_pre: y = sum(pre.unsqueeze(-1) * x, dim=-2) (fp32 out)
    return torch.sum(h.unsqueeze(-1) * x, dim=-2)


def _pre_case(shape, dtype, device) -> Case:
    T, C = shape
    n = N_STREAMS
    s = _esize(dtype)
    fwd_b = T * n * C * s + 4 * T * n + 4 * T * C
    bwd_b = 2 * T * n * C * s + 8 * T * n + 4 * T * C

    def make(dev, seed):
        gen = torch.Generator(device=dev).manual_seed(seed)
        x = _randn((T, n, C), dtype, dev, gen)
        inp = {"x": x, "dy": _randn((T, C), torch.float32, dev, gen), "h": _h_pre(x)}
        inp["x_req"] = x.detach().requires_grad_()
        inp["h_req"] = inp["h"].detach().requires_grad_()
        return inp

    def impl(name, fn, note=""):
        def fwd(inp):
            return {"y": fn(inp["h"], inp["x"])}

        def fwd_bwd(inp):
            y = fn(inp["h_req"], inp["x_req"])
            dh, dx = _grad(y, (inp["h_req"], inp["x_req"]), inp["dy"].to(y.dtype))
            return {"dx": dx, "dh_pre": dh}

        return Impl(name, fwd, fwd_bwd, note=note)

    impls = [impl("fusedops", fusedops.mhc_pre_bmm),
             impl("eager", _pre_eager, "PyTorch eager: DeepSeek-V4 hc_pre, sum(h.unsqueeze(-1) * x, -2)")]
    note = "Liger-Kernel LigerMHCPreFunction (Triton; returns x's dtype, cast inside)"
    status = peer_status("liger_kernel.ops.mhc", device)
    if status == "ok":
        from liger_kernel.ops.mhc import LigerMHCPreFunction
        impls.append(impl("liger", lambda h, x: LigerMHCPreFunction.apply(x, h), note))
    else:
        impls.append(Impl("liger", status=status, note=note))

    def reference(rows):
        x = rows["x"].reshape(-1, n, C)
        x64 = x.detach().to("cpu", torch.float64).requires_grad_()
        h64 = _h_pre(x).detach().to("cpu", torch.float64).requires_grad_()
        y = fusedops.reference.mhc_pre_bmm(h64, x64)
        dh, dx = _grad(y, (h64, x64), rows["dy"].detach().to("cpu", torch.float64))
        return {"fwd": {"y": y.detach()}, "fwd+bwd": {"dx": dx, "dh_pre": dh}}

    def base(rows):
        x = rows["x"].reshape(-1, n, C).detach().requires_grad_()
        h = _h_pre(x).detach().requires_grad_()
        y = _pre_eager(h, x)
        dh, dx = _grad(y, (h, x), rows["dy"])
        return {"fwd": {"y": y.detach()}, "fwd+bwd": {"dx": dx, "dh_pre": dh}}

    return Case(op="mhc_pre_bmm", shape=shape, dtype=dtype, params={"n": n, "out_dtype": "float32"},
                make_inputs=make, impls=impls, reference=reference, base=base,
                bytes_moved={"fwd": fwd_b, "fwd+bwd": fwd_b + bwd_b},
                bytes_note={"fwd": "read x, h_pre; write y (fp32)",
                            "fwd+bwd": "fwd + read x, h_pre, dy (fp32); write dx, dh_pre"})


# --------------------------------------------------------------------------------------------
# mhc_post


def _post_eager(x, h_res, h_out, h_post):
    # DeepSeek-V4's hc_post(x=h_out, residual=x, post, comb)
    y = h_post.unsqueeze(-1) * h_out.unsqueeze(-2) + torch.sum(h_res.unsqueeze(-1) * x.unsqueeze(-2), dim=-3)
    return y.type_as(x)


def _post_case(shape, dtype, device) -> Case:
    T, C = shape
    n = N_STREAMS
    s = _esize(dtype)
    coeff = 4 * T * (n * n + n)
    fwd_b = 2 * T * n * C * s + T * C * s + coeff
    bwd_b = 3 * T * n * C * s + 2 * T * C * s + 2 * coeff

    def derived(x):
        return {"h_res": _h_res(x, n), "h_out": _h_out(x), "h_post": _h_post(x, n)}

    def make(dev, seed):
        gen = torch.Generator(device=dev).manual_seed(seed)
        x = _randn((T, n, C), dtype, dev, gen)
        inp = {"x": x, "dy": _randn((T, n, C), dtype, dev, gen), **derived(x)}
        inp["h_res_t"] = inp["h_res"].transpose(-1, -2).contiguous()  # Liger's h_res layout
        for k in ("x", "h_res", "h_out", "h_post", "h_res_t"):
            inp[k + "_req"] = inp[k].detach().requires_grad_()
        return inp

    def impl(name, fn, note="", res_key="h_res"):
        def args(inp, suffix=""):
            return [inp["x" + suffix], inp[res_key + suffix], inp["h_out" + suffix], inp["h_post" + suffix]]

        def fwd(inp):
            return {"out": fn(*args(inp))}

        def fwd_bwd(inp):
            a = args(inp, "_req")
            dx, dhr, dho, dhp = _grad(fn(*a), a, inp["dy"])
            if res_key == "h_res_t":
                dhr = dhr.transpose(-1, -2)
            return {"dx": dx, "dh_res": dhr, "dh_out": dho, "dh_post": dhp}

        return Impl(name, fwd, fwd_bwd, note=note)

    impls = [impl("fusedops", fusedops.mhc_post),
             impl("eager", _post_eager, "PyTorch eager: DeepSeek-V4 hc_post (fp32 math, cast to x's dtype)")]
    note = ("Liger-Kernel LigerMHCPostResFunction (Triton; takes h_res transposed, computes an fp32 "
            "output and casts it)")
    status = peer_status("liger_kernel.ops.mhc", device)
    if status == "ok":
        from liger_kernel.ops.mhc import LigerMHCPostResFunction
        impls.append(impl("liger", lambda x, r, o, p: LigerMHCPostResFunction.apply(x, o, p, r), note,
                          res_key="h_res_t"))
    else:
        impls.append(Impl("liger", status=status, note=note))

    def reference(rows):
        x = rows["x"].reshape(-1, n, C)
        d = derived(x)
        ins = [t.detach().to("cpu", torch.float64).requires_grad_() for t in (x, d["h_res"], d["h_out"], d["h_post"])]
        out = fusedops.reference.mhc_post(*ins)
        g = _grad(out, ins, rows["dy"].reshape(-1, n, C).detach().to("cpu", torch.float64))
        return {"fwd": {"out": out.detach()},
                "fwd+bwd": dict(zip(("dx", "dh_res", "dh_out", "dh_post"), g))}

    def base(rows):
        x = rows["x"].reshape(-1, n, C)
        d = derived(x)
        ins = [t.detach().requires_grad_() for t in (x, d["h_res"], d["h_out"], d["h_post"])]
        out = _post_eager(*ins)
        g = _grad(out, ins, rows["dy"].reshape(-1, n, C))
        return {"fwd": {"out": out.detach()},
                "fwd+bwd": dict(zip(("dx", "dh_res", "dh_out", "dh_post"), g))}

    return Case(op="mhc_post", shape=shape, dtype=dtype, params={"n": n},
                make_inputs=make, impls=impls, reference=reference, base=base,
                bytes_moved={"fwd": fwd_b, "fwd+bwd": fwd_b + bwd_b},
                bytes_note={"fwd": "read x, h_res, h_out, h_post; write out",
                            "fwd+bwd": "fwd + read x, h_res, h_out, h_post, dy; write dx, dh_res, "
                                       "dh_out, dh_post"})


# --------------------------------------------------------------------------------------------
# hc_split_sinkhorn


def _split_eager(mixes, scale, base, n, variant):
    # The torch golden of MindSpeed (variant "mindspeed") / DeepSeek-V4 (variant "deepseek").
    pre = torch.sigmoid(scale[0] * mixes[..., :n] + base[:n]) + EPS
    post = 2 * torch.sigmoid(scale[1] * mixes[..., n:2 * n] + base[n:2 * n])
    L = (scale[2] * mixes[..., 2 * n:] + base[2 * n:]).unflatten(-1, (n, n))
    if variant == "mindspeed":
        K = torch.exp(L - L.amax(-1, keepdim=True).detach())
        steps = ITERS
    else:
        K = torch.softmax(L, dim=-1) + EPS
        K = K / (K.sum(-2, keepdim=True) + EPS)
        steps = ITERS - 1
    for _ in range(steps):
        K = K / (K.sum(-1, keepdim=True) + EPS)
        K = K / (K.sum(-2, keepdim=True) + EPS)
    return pre, post, K


def _liger_split(device):
    """Liger's split + Sinkhorn kernels (deepseek schedule) with the glue of Liger's
    LigerMHCCoeffsFunction backward for the pre / post / parameter gradients."""
    from liger_kernel.ops.mhc import mhc_sinkhorn_bwd, mhc_split_sinkhorn_fwd

    class LigerSplit(torch.autograd.Function):
        @staticmethod
        def forward(ctx, mix, scale, base):
            a = [scale[i:i + 1].contiguous() for i in range(3)]
            pre, post, res, hist = mhc_split_sinkhorn_fwd(
                mix, base, *a, tmax=ITERS, pre_eps=EPS, sinkhorn_eps=EPS, post_mult=2.0, return_hist=True)
            ctx.save_for_backward(mix, base, *a, hist)
            return pre, post, res

        @staticmethod
        def backward(ctx, g_pre, g_post, g_res):
            mix, base, a0, a1, a2, hist = ctx.saved_tensors
            n = g_pre.shape[-1]
            dres = mhc_sinkhorn_bwd(mix, base, a2, g_res.contiguous(), tmax=ITERS, sinkhorn_eps=EPS, hist=hist)
            sp = torch.sigmoid(mix[:, :n] * a0 + base[:n])
            dpre = g_pre * sp * (1 - sp)
            sq = torch.sigmoid(mix[:, n:2 * n] * a1 + base[n:2 * n])
            dpost = g_post * 2.0 * sq * (1 - sq)
            dres = dres.reshape(mix.shape[0], n * n)
            dmix = torch.empty_like(mix)
            dmix[:, :n] = dpre * a0
            dmix[:, n:2 * n] = dpost * a1
            dmix[:, 2 * n:] = dres * a2
            dbase = torch.cat([dpre.sum(0), dpost.sum(0), dres.sum(0)])
            dscale = torch.stack([(dpre * mix[:, :n]).sum(), (dpost * mix[:, n:2 * n]).sum(),
                                  (dres * mix[:, 2 * n:]).sum()])
            return dmix, dscale, dbase

    return lambda m, s, b, n, variant: LigerSplit.apply(m, s, b)


def _split_case(rows_n, variant, device) -> Case:
    n = N_STREAMS
    w = (2 + n) * n
    gen = torch.Generator().manual_seed(1234)
    scale = (torch.tensor([0.8, 1.1, 1.3]) + 0.1 * torch.randn(3, generator=gen)).to(device)
    base = (0.5 * torch.randn(w, generator=gen)).to(device)
    fwd_b = 8 * rows_n * w
    bwd_b = 12 * rows_n * w

    def ours(m, s, b, n_, v):
        return fusedops.hc_split_sinkhorn(m, s, b, n_, ITERS, EPS, variant=v)

    def outputs(pre, post, comb):
        return {"pre": pre, "post": post, "comb": comb.reshape(comb.shape[0], -1)}

    def make(dev, seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        m = torch.randn((rows_n, w), generator=g, device=dev)
        inp = {"x": m, "dy": torch.randn((rows_n, w), generator=g, device=dev)}
        inp["x_req"] = m.detach().requires_grad_()
        inp["s_req"] = scale.detach().clone().requires_grad_()
        inp["b_req"] = base.detach().clone().requires_grad_()
        # Results of the op, for the copy yardstick.
        with torch.no_grad():
            pre, post, comb = ours(m, scale, base, n, variant)
            inp["copy_src"] = torch.cat([pre, post, comb.reshape(rows_n, -1)], dim=-1).contiguous()
        ins = [m.detach().requires_grad_(), scale.detach().clone().requires_grad_(),
               base.detach().clone().requires_grad_()]
        outs = ours(*ins, n, variant)
        dy = inp["dy"]
        (inp["copy_dmix"],) = torch.autograd.grad(outs, ins[:1], [dy[:, :n], dy[:, n:2 * n],
                                                                  dy[:, 2 * n:].reshape(rows_n, n, n)])
        return inp

    def impl(name, fn, note=""):
        def fwd(inp):
            return outputs(*fn(inp["x"], scale, base, n, variant))

        def fwd_bwd(inp):
            ins = (inp["x_req"], inp["s_req"], inp["b_req"])
            outs = fn(*ins, n, variant)
            dy = inp["dy"]
            (dm,) = torch.autograd.grad(outs, ins[:1], [dy[:, :n], dy[:, n:2 * n], dy[:, 2 * n:].reshape(-1, n, n)])
            return {"dmixes": dm}

        return Impl(name, fwd, fwd_bwd, note=note)

    def copy_fwd(inp):
        c = inp["copy_src"].clone()
        return {"pre": c[:, :n], "post": c[:, n:2 * n], "comb": c[:, 2 * n:]}

    def copy_fwd_bwd(inp):
        c = inp["copy_src"].clone()                          # the forward's read + write
        dm = torch.add(inp["copy_dmix"], inp["dy"], alpha=0.0)  # read mixes-sized + dy, write dmixes
        return {"dmixes": dm, "_fwd": c}

    impls = [impl("fusedops", ours),
             impl("eager", _split_eager, f"PyTorch eager: the {variant} composite in fp32, {ITERS} iterations"),
             Impl("copy", copy_fwd, copy_fwd_bwd,
                  note="torch copies moving exactly the op's minimum bytes (precomputed results): the "
                       "yardstick of the target 'under 2x the time of copying its inputs and outputs'")]
    if variant == "deepseek":
        note = ("Liger-Kernel mhc_split_sinkhorn_fwd / mhc_sinkhorn_bwd (Triton, history kept) with the "
                "torch glue of LigerMHCCoeffsFunction.backward for pre/post and the parameters")
        status = peer_status("liger_kernel.ops.mhc", device)
        impls.append(impl("liger", _liger_split(device), note) if status == "ok"
                     else Impl("liger", status=status, note=note))

    def reference(rows):
        m = rows["x"].detach().to("cpu", torch.float64).requires_grad_()
        s64, b64 = scale.cpu().double(), base.cpu().double()
        outs = fusedops.reference.hc_split_sinkhorn(m, s64, b64, n, ITERS, EPS, variant=variant)
        dy = rows["dy"].detach().to("cpu", torch.float64)
        (dm,) = torch.autograd.grad(outs, (m,), [dy[:, :n], dy[:, n:2 * n], dy[:, 2 * n:].reshape(-1, n, n)])
        return {"fwd": outputs(*[o.detach() for o in outs]), "fwd+bwd": {"dmixes": dm}}

    def base_fn(rows):
        m = rows["x"].detach().requires_grad_()
        outs = _split_eager(m, scale, base, n, variant)
        dy = rows["dy"]
        (dm,) = torch.autograd.grad(outs, (m,), [dy[:, :n], dy[:, n:2 * n], dy[:, 2 * n:].reshape(-1, n, n)])
        return {"fwd": outputs(*[o.detach() for o in outs]), "fwd+bwd": {"dmixes": dm}}

    return Case(op="hc_split_sinkhorn", shape=(rows_n, w), dtype=torch.float32,
                params={"n": n, "sinkhorn_iters": ITERS, "eps": EPS, "variant": variant},
                make_inputs=make, impls=impls, reference=reference, base=base_fn,
                bytes_moved={"fwd": fwd_b, "fwd+bwd": fwd_b + bwd_b},
                bytes_note={"fwd": "read mixes; write pre, post, comb",
                            "fwd+bwd": "fwd + read mixes, dpre, dpost, dcomb; write dmixes"})


def cases(device: torch.device, quick: bool, dtypes=None) -> list[Case]:
    if device.type == "cuda":
        T, C = (GPU_QUICK_TOKENS, GPU_QUICK_C) if quick else (GPU_TOKENS, GPU_C)
        split_rows = GPU_QUICK_SPLIT_ROWS if quick else GPU_SPLIT_ROWS
        variants = ["mindspeed", "deepseek"]
    else:
        T, C = (CPU_QUICK_TOKENS, CPU_QUICK_C) if quick else (CPU_TOKENS, CPU_C)
        split_rows = CPU_QUICK_SPLIT_ROWS if quick else CPU_SPLIT_ROWS
        variants = ["mindspeed"]
    out = []
    for dtype in dtypes or [torch.bfloat16]:
        out.append(_pre_case((T, C), dtype, device))
        out.append(_post_case((T, C), dtype, device))
    for v in variants:
        out.append(_split_case(split_rows, v, device))
    return out
