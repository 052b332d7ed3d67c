#!/usr/bin/env python
"""Quick GPU timing of fusedops's chunk_gated_delta_rule and chunk_kda at issue 7's shapes, and of
the GDN sub-operators, without peers or float64 checks (bench/report.py does those; its Triton
peers need minutes of autotuning, which a short GPU session cannot afford). Correctness is the
test suite's job; this only answers "how long, and where does the time go".

    python bench/la_timing.py [--json PATH] [--reps N]
    python bench/la_timing.py --recurrent [--json PATH] [--reps N]

--recurrent times the per-token forms instead (fused_recurrent_gated_delta_rule and
fused_recurrent_kda, forward and forward+backward, K = V = 128 bf16, fp32 states in and out) on
each CUDA backend that takes them, from one token per sequence (decoding) to T = 1024.

Times are CUDA-event medians over --reps calls after two warm-up calls (no L2 flush: every
input here is far larger than L2). First call: wall time of the first call in the process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import fusedops
import torch


def _events_ms(fn, reps):
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _inputs(B, T, H, HV, K, V, dtype, kda, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"

    def rn(*s, dt=dtype):
        return torch.randn(*s, device=dev, dtype=torch.float32, generator=g).to(dt)

    q = rn(B, T, H, K)
    k = torch.nn.functional.normalize(rn(B, T, H, K, dt=torch.float32), dim=-1).to(dtype)
    v = rn(B, T, HV, V)
    if kda:
        gate = -torch.rand(B, T, HV, K, device=dev, generator=g) * 0.1
    else:
        gate = -torch.rand(B, T, HV, device=dev, generator=g) * 0.5
    beta = torch.rand(B, T, HV, device=dev, generator=g).to(dtype)
    return q, k, v, gate, beta


def time_top(name, fn, inputs, reps):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    o = fn(*leaves)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    do = torch.randn_like(o)

    def fwd():
        with torch.no_grad():
            fn(*inputs)

    def fwd_bwd():
        out = fn(*leaves)
        torch.autograd.grad(out, leaves, do)

    for f in (fwd, fwd_bwd):
        f()
        f()
    return {"op": name, "fwd_ms": _events_ms(fwd, reps), "fwd_bwd_ms": _events_ms(fwd_bwd, reps),
            "first_call_s": first}


def gdn_subops(B, T, H, K, V, dtype, reps):
    """Times of the sub-operators of chunk_gated_delta_rule (forward, then backward), each called
    on its own with the operands the top level would give it."""
    la = fusedops.gated_delta_rule
    q, k, v, g, beta = _inputs(B, T, H, H, K, V, dtype, kda=False)
    scale = K ** -0.5
    gc = la.chunk_local_cumsum(g, 64)
    A = la.chunk_scaled_dot_kkt_fwd(k, g=gc, beta=beta, chunk_size=64)
    Ai = la.solve_tril(A, output_dtype=k.dtype)  # the top level keeps A in k's dtype
    w, u = la.recompute_w_u_fwd(k, v, beta, Ai, gc)
    h, vn, _ = la.chunk_gated_delta_rule_fwd_h(k, w, u, g=gc, chunk_size=64)
    do = torch.randn_like(v)
    dv = la.chunk_bwd_dv_local(q, k, do, g=gc, scale=scale)
    dh, _, dv2 = la.chunk_gated_delta_rule_bwd_dhu(q, k, w, do, dv, g=gc, scale=scale)
    dw_, du_ = torch.randn_like(w), torch.randn_like(u)
    steps = {
        "chunk_local_cumsum": lambda: la.chunk_local_cumsum(g, 64),
        "chunk_scaled_dot_kkt_fwd": lambda: la.chunk_scaled_dot_kkt_fwd(k, g=gc, beta=beta, chunk_size=64),
        "solve_tril": lambda: la.solve_tril(A),
        "recompute_w_u_fwd": lambda: la.recompute_w_u_fwd(k, v, beta, Ai, gc),
        "chunk_gated_delta_rule_fwd_h": lambda: la.chunk_gated_delta_rule_fwd_h(k, w, u, g=gc, chunk_size=64),
        "chunk_fwd_o": lambda: la.chunk_fwd_o(q, k, vn, h, g=gc, scale=scale),
        "chunk_bwd_dv_local": lambda: la.chunk_bwd_dv_local(q, k, do, g=gc, scale=scale),
        "chunk_gated_delta_rule_bwd_dhu": lambda: la.chunk_gated_delta_rule_bwd_dhu(q, k, w, do, dv, g=gc,
                                                                                    scale=scale),
        "chunk_bwd_dqkwg": lambda: la.chunk_bwd_dqkwg(q, k, vn, do, h, dh, w=w, g=gc, dv=dv2, scale=scale),
        "prepare_wy_repr_bwd": lambda: la.prepare_wy_repr_bwd(k, v, beta, Ai, dw_, du_, g=gc),
    }
    out = {}
    for name, f in steps.items():
        try:
            f()
            out[name] = _events_ms(f, reps)
        except Exception as e:  # a signature mismatch is reported, the rest still runs
            out[name] = f"error: {type(e).__name__}: {str(e)[:160]}"
    return out


# (B, T, H) of the per-token forms: decoding at B = 64, then longer sequences.
RECURRENT_SHAPES = [(64, 1, 16), (16, 16, 16), (8, 64, 16), (2, 256, 16), (1, 1024, 16)]


def recurrent(reps):
    """fwd / fwd+bwd medians (ms) of both per-token forms at RECURRENT_SHAPES on every CUDA
    backend registered for them (cuda_sm80, and cuda_sm90 on Hopper)."""
    out = []
    K = 128
    for B, T, H in RECURRENT_SHAPES:
        for op, kda in (("fused_recurrent_gated_delta_rule", False), ("fused_recurrent_kda", True)):
            q, k, v, gate, beta = _inputs(B, T, H, H, K, K, torch.bfloat16, kda)
            h0 = torch.randn(B, H, K, K, device="cuda") * 0.1
            fn = getattr(fusedops, op)

            def call(q, k, v, gate, beta, h0, fn=fn):
                o, ht = fn(q, k, v, gate, beta=beta, scale=K ** -0.5, initial_state=h0, output_final_state=True)
                return o.float().sum() + ht.sum()

            backends = {e["backend"] for e in fusedops.backends(op) if e["device"] == "cuda" and e["runnable_here"]}
            for backend in sorted(backends):
                with fusedops.use_backend(**{op: backend}):
                    r = time_top(op, call, (q, k, v, gate, beta, h0), reps)
                r.update(shape=[B, T, H, K], backend=backend)
                print(json.dumps(r), flush=True)
                out.append(r)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--recurrent", action="store_true", help="time the per-token forms (see above)")
    args = p.parse_args(argv)
    if args.recurrent:
        res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bf16",
               "commit": os.environ.get("FUSEDOPS_COMMIT"), "results": recurrent(args.reps)}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        return
    dt = torch.bfloat16
    B, T, H, K = 8, 4096, 16, 128
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": [B, T, H, K],
           "dtype": "bf16", "results": []}

    def gdn(q, k, v, g, b):
        return fusedops.chunk_gated_delta_rule(q, k, v, g, b, K ** -0.5)[0]

    def gdn_keep(q, k, v, g, b):
        return fusedops.chunk_gated_delta_rule(q, k, v, g, b, K ** -0.5, keep_intermediates=True)[0]

    def kda(q, k, v, g, b):
        return fusedops.chunk_kda(q, k, v, g, b, K ** -0.5)[0]

    for name, fn, HV, is_kda in (("chunk_gated_delta_rule", gdn, H, False),
                                 ("chunk_gated_delta_rule keep_intermediates", gdn_keep, H, False),
                                 ("chunk_gated_delta_rule HV=32", gdn, 2 * H, False),
                                 ("chunk_kda", kda, H, True)):
        inputs = _inputs(B, T, H, HV, K, K, dt, is_kda)
        try:
            r = time_top(name, fn, inputs, args.reps)
        except Exception as e:
            r = {"op": name, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(json.dumps(r), flush=True)
        res["results"].append(r)
        torch.cuda.empty_cache()
    sub = gdn_subops(B, T, H, K, K, dt, args.reps)
    print(json.dumps({"gdn_subops_ms": sub}), flush=True)
    res["gdn_subops_ms"] = sub
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
