"""Train a tiny Qwen3-Next (Hugging Face transformers, built from a config) with and without
fusedops, side by side from the same weights on the same batches.

The model is transformers' own ``Qwen3NextForCausalLM`` (hybrid: gated-delta-rule layers with
short convolutions and gated RMSNorm, gated full-attention layers, a top-k MoE with a shared
expert, the zero-centred RMSNorm); ``fusedops.transformers.apply_fusedops`` puts fusedops into a
copy of it (chunk_gated_delta_rule, causal_conv1d, rms_norm_gated, the experts through
sort_chunks_by_idx + clipped_swiglu, the LM head + loss through chunk_loss). The other copy runs
transformers' code as installed (its torch paths when flash-linear-attention and causal-conv1d
are absent, as in CI).

Data: the byte corpus of examples/train_hybrid.py (the Python standard library's sources, no
download), the same batches for both models. Printed: both losses and throughputs per logging
step; at the end the mean forward+backward throughput of each (tokens/s, after two warm-up
steps) and the peak memory of one forward+backward (the same measurement as train_hybrid.py).

    python examples/hf_finetune.py                           # CPU, fp32, about a minute
    python examples/hf_finetune.py --device cuda --dtype bf16 --hidden 1024 --layers 8 \\
        --seq-len 2048 --batch 8 --steps 200 --json hf_finetune.json

Needs transformers 5.23.x (pip install 'fusedops[transformers]').
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as train_hybrid.py: shared cores

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_hybrid import Batches, load_corpus, peak_memory  # noqa: E402


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4, help="every 4th layer is full attention")
    p.add_argument("--heads", type=int, default=4, help="linear-attention key heads (value heads: 2x)")
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--json", help="write a summary here")
    return p.parse_args(argv)


def make_config(args):
    from transformers import Qwen3NextConfig

    pattern = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    return Qwen3NextConfig(
        vocab_size=256, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, layer_types=[pattern[i % 4] for i in range(args.layers)],
        num_attention_heads=max(1, args.hidden // args.head_dim), num_key_value_heads=1,
        head_dim=args.head_dim, linear_num_key_heads=args.heads, linear_num_value_heads=2 * args.heads,
        linear_key_head_dim=args.head_dim, linear_value_head_dim=args.head_dim, linear_conv_kernel_dim=4,
        num_experts=args.experts, num_experts_per_tok=args.top_k, moe_intermediate_size=args.hidden,
        shared_expert_intermediate_size=args.hidden, decoder_sparse_step=1,
        max_position_embeddings=max(4096, args.seq_len), use_cache=False, pad_token_id=None,
        bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)


def build_models(args, dtype):
    """(fused, plain): transformers' model and a deep copy with fusedops, the same weights."""
    from fusedops.transformers import apply_fusedops
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    plain = AutoModelForCausalLM.from_config(make_config(args)).to(args.device, dtype)
    fused = apply_fusedops(copy.deepcopy(plain))
    return fused, plain


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def fwd_bwd(model, tokens):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    return float(loss.detach())


def main(argv=None):
    args = _parse(argv)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    try:
        import transformers
        from fusedops.transformers import SUPPORTED_RANGE  # noqa: F401  (checks the version)
    except ImportError as e:
        sys.exit(f"hf_finetune: {e}")
    fused, plain = build_models(args, dtype)
    models = {"fused": fused, "torch": plain}
    n_params = sum(p.numel() for p in plain.parameters())
    print(f"hf_finetune: transformers {transformers.__version__} Qwen3NextForCausalLM, "
          f"{n_params / 1e6:.2f}M parameters, {args.layers} layers ({plain.config.layer_types.count('linear_attention')} "
          f"gated delta rule), hidden {args.hidden}, {args.experts} experts top-{args.top_k}; {args.device} "
          f"{args.dtype}, batch {args.batch} x {args.seq_len} tokens, {args.steps} steps, "
          f"threads {torch.get_num_threads()}")
    opts = {n: torch.optim.AdamW(m.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
            for n, m in models.items()}
    for m in models.values():
        m.train()
    data = Batches(load_corpus(), args.batch, args.seq_len, args.seed)
    losses = {n: [] for n in models}
    times = {n: [] for n in models}
    tokens_per_step = args.batch * args.seq_len
    t_start = time.perf_counter()
    for step in range(args.steps):
        tokens = data.next()[0].to(args.device)
        for name, model in models.items():
            _sync(args.device)
            t0 = time.perf_counter()
            losses[name].append(fwd_bwd(model, tokens))
            _sync(args.device)
            times[name].append(time.perf_counter() - t0)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opts[name].step()
        if step % args.log_every == 0 or step == args.steps - 1:
            lf, lt = losses["fused"][-1], losses["torch"][-1]
            tf, tt = (tokens_per_step / times[n][-1] for n in ("fused", "torch"))
            print(f"step {step:4d}  loss fused {lf:.5f}  torch {lt:.5f}  rel.diff "
                  f"{abs(lf - lt) / abs(lt):.2e}  fwd+bwd tok/s fused {tf:8.0f}  torch {tt:8.0f}")
    train_s = time.perf_counter() - t_start
    tps = {n: tokens_per_step * len(t[2:]) / sum(t[2:]) if len(t) > 2 else tokens_per_step * len(t) / sum(t)
           for n, t in times.items()}
    tokens = data.next()[0].to(args.device)
    mem = {n: peak_memory(lambda m=m: fwd_bwd(m, tokens), args.device) for n, m in models.items()}
    lf, lt = losses["fused"], losses["torch"]
    rel = [abs(a - b) / abs(b) for a, b in zip(lf, lt)]
    print(f"\nfinal loss: fused {lf[-1]:.5f}, torch {lt[-1]:.5f} (first {lf[0]:.4f}); |rel. diff| max "
          f"{max(rel):.2e}")
    print(f"forward+backward tokens/s: fused {tps['fused']:.0f}, torch {tps['torch']:.0f} "
          f"({tps['fused'] / tps['torch']:.2f}x)")
    print(f"peak memory of a forward+backward: fused {mem['fused'] / 2**20:.1f} MiB, torch "
          f"{mem['torch'] / 2**20:.1f} MiB ({mem['fused'] / max(mem['torch'], 1):.2f}x)")
    print(f"training wall time {train_s:.1f} s")
    summary = {
        "model": "Qwen3NextForCausalLM", "transformers": transformers.__version__,
        "config": make_config(args).to_dict(), "device": args.device, "dtype": args.dtype,
        "steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "params": n_params,
        "fwd_bwd_tokens_per_s": tps, "peak_fwd_bwd_memory_bytes": mem,
        "final_loss": {"fused": lf[-1], "torch": lt[-1]}, "max_rel_loss_diff": max(rel),
        "losses": losses, "train_wall_s": train_s, "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str))
        print(f"wrote {args.json}")
    return summary


if __name__ == "__main__":
    main()
