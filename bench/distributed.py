"""Context-parallel chunk_gated_delta_rule / chunk_kda per layer: the communicated bytes and the
time of the CP pieces (summary, exchange, fold; forward and backward) against the local chunk
computation, and the whole CP layer against one process running every token.

    python bench/distributed.py --world 2                        # CPU, gloo, spawned here
    python bench/distributed.py --world 2 --op kda --tokens 16384 --json out.json
    torchrun --nproc-per-node 2 bench/distributed.py --device cuda --tokens 65536 --heads 16 \\
        --head-dim 128 --dtype bf16                              # NCCL, one GPU per rank

One sequence of ``--tokens`` tokens split evenly over the ranks (the case where every rank but
the first has an incoming segment and every rank but the last an outgoing one). Each timing is
the median over ``--reps`` repetitions, every rank starting together (a barrier, then a device
synchronisation on CUDA); rank 0 prints its own times and the slowest rank's. The pieces:

* fwd summary: la_cp_fwd_summary of the outgoing segment (its forward preparation and two state
  recurrences); fwd exchange: the all-gather of the [HV*K*(K+V)] fp32 summaries; fwd fold:
  la_cp_fold_fwd; local fwd: the operator's forward over the rank's tokens with that state;
* bwd summary: la_cp_bwd_summary of the incoming segment; bwd exchange: the all-gather of the
  [HV*K*V] fp32 L; bwd fold: la_cp_fold_bwd; local bwd: the operator's backward on the rank;
* CP layer fwd / fwd+bwd: the operator with cp=plan (all of the above); one process fwd /
  fwd+bwd: the operator over all the tokens on one device (the time CP divides).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device, reps: int, warmup: int = 2, together: bool = True) -> float:
    """Median seconds of fn() over reps runs, every rank starting each run together (a barrier
    first) unless together is False."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if together:
            dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _inputs(args, T, device, seed=0):
    dtype = DTYPES[args.dtype]
    H, HV, K = args.heads, args.v_heads or args.heads, args.head_dim
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)

    q, k, v = r(1, T, H, K), r(1, T, H, K), r(1, T, HV, K)
    gate = r(1, T, HV, K) if args.op == "kda" else r(1, T, HV)
    beta = r(1, T, HV)
    A_log = (torch.rand(HV, generator=g) * 2).to(device)
    dt_bias = (torch.randn(HV * K if args.op == "kda" else HV, generator=g) * 0.5).to(device)
    return q, k, v, gate, beta, A_log, dt_bias


def _op_call(args, plan=None, cu=None):
    import fusedops
    op = fusedops.chunk_kda if args.op == "kda" else fusedops.chunk_gated_delta_rule
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)

    def call(q, k, v, g, beta, A_log, dt_bias, h0=None):
        return op(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, initial_state=h0, cp=plan, cu_seqlens=cu,
                  **kw)[0]
    return call


def _passes(call, inputs, dout):
    """(forward without autograd, forward + backward) of call on inputs."""
    leaves = [t.detach().clone().requires_grad_(t.dim() > 1) for t in inputs]

    def fwd():
        with torch.no_grad():
            call(*inputs)

    def fwd_bwd():
        call(*leaves).backward(dout)
    return fwd, fwd_bwd


def run(rank: int, world: int, args) -> dict:
    from fusedops import _C
    from fusedops._backend import context
    from fusedops.distributed import _linear_attention as la
    from fusedops.distributed import context_parallel
    from fusedops.distributed._comm import all_gather_rows

    device = torch.device("cuda", rank % max(1, torch.cuda.device_count())) if args.device == "cuda" \
        else torch.device("cpu")
    T = args.tokens
    plan = context_parallel([0, T], device=device)
    full = _inputs(args, T, device)
    local = [plan.shard(t) if t.dim() > 1 else t for t in full]
    HV, K, V = local[2].shape[2], local[0].shape[3], local[2].shape[3]
    kda = args.op == "kda"
    o = la._Opts(kda, K ** -0.5, False, True, True, True, False, 64, keep=device.type == "cpu" and not kda)
    res = {"rank": rank, "world": world, "tokens_per_rank": plan.num_tokens,
           "bytes_fwd_per_rank": HV * K * (K + V) * 4, "bytes_bwd_per_rank": HV * K * V * 4}
    q, k, v, g, beta, A_log, dt_bias = local

    # Forward pieces.
    summary = torch.empty(HV * K * (K + V), device=device)
    res["fwd_summary_s"] = _time(lambda: la._fwd_summary(o, plan, k, v, g, beta, A_log, dt_bias, summary),
                                 device, args.reps)
    gathered = all_gather_rows(summary, plan.group)
    res["fwd_exchange_s"] = _time(lambda: all_gather_rows(summary, plan.group), device, args.reps)
    state = torch.zeros(plan.num_local_seqs, HV, K, V, device=device)

    def fold():
        if plan.incoming is not None:
            _C.la_cp_fold_fwd(context(la._OP_FOLD, gathered), gathered, None, plan.fold_lo, plan.rank, state[0])
    res["fwd_fold_s"] = _time(fold, device, args.reps)
    fold()
    h0 = state if plan.incoming is not None else None
    res["local_fwd_s"] = _time(lambda: la._local_fwd(o, q, k, v, g, beta, h0, False, A_log, dt_bias, plan), device,
                               args.reps)
    # Backward pieces, from one forward's saved tensors.
    out = la._local_fwd(o, q, k, v, g, beta, h0, False, A_log, dt_bias, plan)
    saved = out[2:]
    do = torch.randn_like(out[0])
    L = torch.zeros(1, HV, K, V, device=device)

    def bwd_summary():
        if plan.incoming is not None:
            la._local_bwd_summary(o, q, k, v, beta, saved, do, None, plan.incoming_end, L)
    res["bwd_summary_s"] = _time(bwd_summary, device, args.reps)
    gL = all_gather_rows(L, plan.group)
    res["bwd_exchange_s"] = _time(lambda: all_gather_rows(L, plan.group), device, args.reps)
    dht = torch.zeros(plan.num_local_seqs, HV, K, V, device=device)
    later = gathered[plan.rank + 1: plan.fold_hi].clone()

    def fold_bwd():
        if plan.outgoing is not None:
            _C.la_cp_fold_bwd(context(la._OP_FOLD, gL), later, gL[plan.rank + 1: plan.fold_hi], 0,
                              later.shape[0], dht[-1])
    res["bwd_fold_s"] = _time(fold_bwd, device, args.reps)
    fold_bwd()
    res["local_bwd_s"] = _time(lambda: la._local_bwd(o, q, k, v, g, beta, h0, A_log, dt_bias, saved, do, dht, plan),
                               device, args.reps)

    # The whole CP layer, and one process over every token (rank 0 alone; the others wait at the
    # barrier below).
    cp_fwd, cp_fwd_bwd = _passes(_op_call(args, plan=plan), local, do)
    res["cp_fwd_s"] = _time(cp_fwd, device, args.reps)
    res["cp_fwd_bwd_s"] = _time(cp_fwd_bwd, device, args.reps)
    if rank == 0:
        one_fwd, one_fwd_bwd = _passes(_op_call(args), full, torch.randn(1, T, HV, V, dtype=do.dtype, device=device))
        res["one_process_fwd_s"] = _time(one_fwd, device, args.reps, together=False)
        res["one_process_fwd_bwd_s"] = _time(one_fwd_bwd, device, args.reps, together=False)
    dist.barrier()
    every = [None] * world
    dist.all_gather_object(every, res)
    return every


PIECES = [("fwd summary", "fwd_summary_s"), ("fwd exchange", "fwd_exchange_s"), ("fwd fold", "fwd_fold_s"),
          ("local fwd", "local_fwd_s"), ("bwd summary", "bwd_summary_s"), ("bwd exchange", "bwd_exchange_s"),
          ("bwd fold", "bwd_fold_s"), ("local bwd", "local_bwd_s"), ("CP layer fwd", "cp_fwd_s"),
          ("CP layer fwd+bwd", "cp_fwd_bwd_s")]


def report(every: list, args) -> dict:
    r0 = every[0]
    print(f"{args.op} CP, {args.world} ranks ({args.device}), one sequence of {args.tokens} tokens "
          f"({r0['tokens_per_rank']} per rank), H={args.heads} HV={args.v_heads or args.heads} "
          f"K=V={args.head_dim} {args.dtype}, median of {args.reps}")
    print(f"communicated per layer and rank: forward {r0['bytes_fwd_per_rank']} B "
          f"(HV*K*(K+V)*4), backward {r0['bytes_bwd_per_rank']} B (HV*K*V*4); each rank receives "
          f"world_size times that")
    print(f"  {'piece':<20} {'rank 0 ms':>10} {'slowest ms':>11}")
    for name, key in PIECES:
        print(f"  {name:<20} {1e3 * r0[key]:10.3f} {1e3 * max(r[key] for r in every):11.3f}")
    one_f, one_fb = r0["one_process_fwd_s"], r0["one_process_fwd_bwd_s"]
    cp_f = max(r["cp_fwd_s"] for r in every)
    cp_fb = max(r["cp_fwd_bwd_s"] for r in every)
    print(f"  {'one process fwd':<20} {1e3 * one_f:10.3f}   -> CP / one process {cp_f / one_f:.2f}x")
    print(f"  {'one process fwd+bwd':<20} {1e3 * one_fb:10.3f}   -> CP / one process {cp_fb / one_fb:.2f}x")
    return {"args": vars(args), "ranks": every, "torch": torch.__version__}


def _spawn_entry(rank, world, args, store, out):
    if args.device == "cpu":
        torch.set_num_threads(max(1, args.threads))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method=f"file://{store}",
                            rank=rank, world_size=world)
    every = run(rank, world, args)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(every, f)
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="gdn", choices=["gdn", "kda"])
    p.add_argument("--world", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--v-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    p.add_argument("--json", help="write every rank's numbers here")
    args = p.parse_args(argv)
    if "RANK" in os.environ:  # torchrun
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        args.world = dist.get_world_size()
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        every = run(dist.get_rank(), args.world, args)
        rank = dist.get_rank()
        dist.destroy_process_group()
        if rank != 0:
            return None
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            mp.start_processes(_spawn_entry, args=(args.world, args, os.path.join(tmp, "store"), out),
                               nprocs=args.world, start_method="spawn")
            with open(out) as f:
                every = json.load(f)
    summary = report(every, args)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
        print(f"wrote {args.json}")
    return summary


if __name__ == "__main__":
    main()
