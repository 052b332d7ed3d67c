"""End to end: train a small hybrid LM built from fusedops operators against the same model in
plain PyTorch, from the same initial weights on the same batches.

The model (a decoder over bytes, vocab 256) is the kind that is trained with these operators:

* token embedding, expanded to ``n`` mHC residual streams ``X [B,T,n,D]`` (DeepSeek-V4);
* per layer two sub-layers, each wrapped in mHC: ``r = rmsnorm_without_weight(X)``,
  ``mixes = (X @ hc_fn^T) * r``, ``pre, post, comb = hc_split_sinkhorn(mixes, ...)``,
  ``h = mhc_pre_bmm(pre, X)``, ``f = sublayer(rmsnorm(h))``, ``X = mhc_post(X, comb, f, post)``;
* token mixer: a gated-delta-rule layer (Qwen3-Next / flash-linear-attention ``GatedDeltaNet``):
  one q|k|v projection, one causal short convolution with SiLU over the three
  (``causal_conv1d`` through ``fusedops.nn.ShortConvolution``), ``chunk_gated_delta_rule`` with
  the q/k L2 norm, the gate ``-exp(A_log) * softplus(a + dt_bias)`` and the beta sigmoid in the
  kernel, the output norm ``rms_norm_gated(o, z)`` and the output projection; ``--mixer kda``
  swaps in Kimi Delta Attention (per-channel gate) once ``fusedops.chunk_kda`` exists;
* channel mixer: a top-k MoE: router softmax + top-k, ``sort_chunks_by_idx`` groups the
  (token, slot) rows by expert (one row per chunk, chunks in expert order, the routing weights
  travelling along as ``probs``), one GEMM per expert, one ``clipped_swiglu`` over all experts'
  rows, one GEMM per expert, the inverse permutation (``sort_chunks_by_map``, a gather through the
  saved row map) and the weighted sum over the k slots;
* head: the mHC head mix (``rmsnorm_without_weight``, ``hc_head_split``, ``mhc_pre_bmm``), a
  final RMSNorm and ``chunk_loss`` (LM head GEMM + cross-entropy without materialised logits);
* every bias-free linear layer of the blocks accumulates its weight gradient with
  ``matmul_add`` into an fp32 ``main_grad`` (Megatron's gradient-accumulation fusion).

The plain model is the same module tree and the same state dict, with every fusedops call
replaced by plain torch math written in this file (no fusedops call on that path). Inside the
fused model, ``--torch-ops OP,...`` runs chosen operators in their plain form instead (by
default those without a runnable backend on the device, e.g. an operator whose CUDA backend
does not exist yet), so that the rest can still be measured.

    python examples/train_hybrid.py                          # CPU, fp32, a few minutes
    python examples/train_hybrid.py --device cuda --dtype bf16 --dim 1024 --layers 8 --heads 8 \\
        --seq-len 2048 --batch 8 --steps 300 --json out.json --plot loss.png
    python examples/train_hybrid.py --control                # + a plain model from weights
                                                             #   perturbed by 1e-7 (drift yardstick)
    torchrun --nproc-per-node 2 examples/train_hybrid.py --cp 2          # context parallel
    torchrun --nproc-per-node 4 examples/train_hybrid.py --cp 2 --tp 2   # + vocabulary-parallel head

With ``--cp N`` / ``--tp M`` (under ``torchrun``, N*M processes; gloo on the CPU, NCCL on CUDA)
the fused model runs distributed: each group of M ranks holds 1/N of the packed batch's tokens
(the short convolutions and the gated-delta-rule layers with ``cp=plan``, the MoE load-balancing
statistics summed over the CP group) and the LM head's vocabulary is split over the M ranks
(``chunk_loss(..., process_group=tp)``); every rank also trains the same fused model on the whole
batch in one process, and rank 0 prints both losses per step (see docs/distributed.md).

Data: the Python standard library's own ``.py`` files (no download), as bytes; windows drawn
with a fixed seed, the same batches for both models.

Measurements: per logging step both losses and both throughputs; at the end the peak memory of
a forward+backward pass of each model (CUDA: ``torch.cuda.max_memory_allocated`` minus the memory
allocated when the step starts; CPU: the running sum of the allocator events that
``torch.profiler(profile_memory=True)`` records over one pass, its maximum; only allocations
made through PyTorch count, so the CPU gated-delta-rule operator's per-thread scratch buffer,
allocated once and reused, is not in it) and a per-operator time breakdown of the fusedops model
(``torch.profiler`` over a few forward+backward passes: the forward of each fusedops call is a
``record_function`` range, the backward is the autograd node the op creates; CUDA: device time).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

# OpenMP threads that spin while waiting make every CPU op (torch's and fusedops') many times
# slower when the cores are shared with other work; passive waiting changes no result. Set
# before torch loads its OpenMP runtime; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import fusedops
    import fusedops.nn as fnn
    from fusedops.ops.sort_chunks import sort_chunks_by_idx_with_map, sort_chunks_by_map
except ImportError:  # the plain model still runs
    fusedops = None
    fnn = None

# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass
class Config:
    vocab: int = 256
    dim: int = 192               # D
    layers: int = 3
    heads: int = 3               # H (q/k heads = value heads)
    head_dim: int = 64           # K = V
    conv_size: int = 4
    hc_mult: int = 4             # n mHC residual streams
    sinkhorn_iters: int = 20
    experts: int = 8
    top_k: int = 2
    expert_dim: int = 192        # F (each expert: D -> 2F -> F -> D)
    mixer: str = "gdn"           # "gdn" or "kda"
    chunk_size: int = 64
    norm_eps: float = 1e-6
    hc_eps: float = 1e-6
    aux_loss_coef: float = 1e-2  # Switch-style load balancing
    swiglu_limit: float = 7.0
    grad_accum_fusion: bool = True   # fused model: weight gradients through matmul_add


def _require_fusedops():
    if fusedops is None:
        raise RuntimeError("train_hybrid: the fused model needs the fusedops package (see README)")


def has_kda() -> bool:
    return fusedops is not None and hasattr(fusedops, "chunk_kda")


# ---------------------------------------------------------------------------------------------
# The two sets of kernels. Every fusable computation of the model is one method; `Fused` calls
# fusedops (each call inside a record_function range for the profile), `Torch` is plain math.


class FusedLinearFn(torch.autograd.Function):
    """``y = x @ w^T`` whose weight gradient is added into ``main_grad`` (fp32) by
    ``fusedops.matmul_add`` instead of going through autograd."""

    @staticmethod
    def forward(ctx, x, w, main_grad):
        ctx.save_for_backward(x, w)
        ctx.main_grad = main_grad
        return F.linear(x, w)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = dy @ w if ctx.needs_input_grad[0] else None
        if x.numel():
            with torch.profiler.record_function("fo:matmul_add"):
                fusedops.matmul_add(dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1]),
                                    ctx.main_grad)
        return dx, None, None


@dataclass
class Distributed:
    """The distributed run's state (--cp / --tp), active while the distributed model runs."""
    active: bool = False
    plan: object = None          # fusedops.distributed.ContextParallel of the current batch
    cp_group: object = None
    tp_group: object = None
    cp_size: int = 1
    tokens: int = 0              # tokens of the whole batch (the loss is their mean)
    vocab_start: int = 0


DIST = Distributed()


class GroupSum(torch.autograd.Function):
    """all_reduce(SUM) over a group whose backward is the same sum of the gradients."""

    @staticmethod
    def forward(ctx, x, group):
        import torch.distributed as tdist
        ctx.group = group
        x = x.clone()
        tdist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        import torch.distributed as tdist
        g = g.clone()
        tdist.all_reduce(g, group=ctx.group)
        return g, None


def _cp():
    return DIST.plan if DIST.active else None


# Operators that run as their plain PyTorch form inside the fused model (--torch-ops; "auto" adds
# those with no backend for the device). The MoE permutation and its inverse go together.
FALLBACK: set = set()


def _fused(op: str, group: Optional[str] = None):
    """Run the decorated fusedops call inside a ``fo:<op>`` profiler range, or the plain
    PyTorch method of the same name when ``group or op`` is in FALLBACK."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if (group or op) in FALLBACK:
                return getattr(Torch, fn.__name__)(*args, **kwargs)
            with torch.profiler.record_function(f"fo:{op}"):
                return fn(*args, **kwargs)
        return staticmethod(wrapper)
    return deco


class Fused:
    name = "fused"

    @staticmethod
    def linear(x, w, main_grad=None):
        if main_grad is None:
            return F.linear(x, w)
        return FusedLinearFn.apply(x, w, main_grad)

    @_fused("rmsnorm_gated")
    def rmsnorm(x, weight, eps):
        return fusedops.rms_norm_gated(x, None, weight, eps=eps)

    @_fused("causal_conv1d")
    def short_conv(conv, x):
        return conv(x, cp=_cp())[0]

    @_fused("rmsnorm_gated")
    def gated_norm(norm, x, z):
        return norm(x, z)

    @_fused("chunk_gated_delta_rule")
    def gdn(q, k, v, a, b, A_log, dt_bias, chunk_size):
        o, _ = fusedops.chunk_gated_delta_rule(
            q, k, v, a, b, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log,
            dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, chunk_size=chunk_size, cp=_cp())
        return o

    @_fused("chunk_kda")
    def kda(q, k, v, f, b, A_log, dt_bias, chunk_size):
        if not has_kda():
            raise NotImplementedError(
                "train_hybrid: --mixer kda needs fusedops.chunk_kda, which this fusedops build does "
                "not have yet; use --mixer gdn")
        o, _ = fusedops.chunk_kda(q, k, v, f, b, use_qk_l2norm_in_kernel=True,
                                  use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                                  use_beta_sigmoid_in_kernel=True, chunk_size=chunk_size, cp=_cp())
        return o

    @_fused("rmsnorm_without_weight")
    def rms_factor(x, eps):
        return fusedops.rmsnorm_without_weight(x, eps)

    @_fused("hc_split_sinkhorn")
    def hc_split(mixes, scale, base, n, iters, eps):
        return fusedops.hc_split_sinkhorn(mixes, scale, base, n, iters, eps)

    @staticmethod
    def hc_head(mixes, scale, base, eps):
        return fusedops.hc_head_split(mixes, scale, base, eps)  # a plain composite in fusedops

    @_fused("mhc_pre_bmm")
    def pre_mix(h_pre, X):
        return fusedops.mhc_pre_bmm(h_pre, X)

    @_fused("mhc_post")
    def post_mix(X, comb, f, post):
        return fusedops.mhc_post(X, comb, f, post)

    @_fused("sort_chunks_by_idx")
    def permute(x, probs, expert_of_row, counts):
        """Rows grouped by expert: one chunk per row, chunk order = stable sort by expert; the
        routing weights travel with their rows."""
        order = torch.argsort(expert_of_row, stable=True)
        return sort_chunks_by_idx_with_map(x, torch.ones_like(order), order, probs)

    @_fused("sort_chunks_by_map", group="sort_chunks_by_idx")
    def unpermute(ys, row_map):
        """The inverse permutation: a gather through the map the forward permutation saved."""
        return sort_chunks_by_map(ys, row_map, None, ys.shape[0], ys.shape[1], False)[0]

    @_fused("clipped_swiglu")
    def swiglu(h, limit):
        return fusedops.clipped_swiglu(h, limit=limit)

    @_fused("chunk_loss")
    def lm_loss(h, weight, labels):
        if DIST.active:  # this rank's tokens and vocabulary slice; the mean over the whole batch
            return fusedops.chunk_loss(h, weight, labels, reduction="sum", process_group=DIST.tp_group,
                                       vocab_start=DIST.vocab_start) / DIST.tokens
        return fusedops.chunk_loss(h, weight, labels, reduction="mean")


def _acc(x):
    """fp32 math for 16/32-bit tensors; float64 stays float64 (the tests' oracle model)."""
    return x if x.dtype == torch.float64 else x.float()


def _gdn_gate(a, A_log, dt_bias):
    return -_acc(A_log).exp() * F.softplus(_acc(a) + _acc(dt_bias))


def _l2n(x, eps=1e-6):
    x = _acc(x)
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)


def _chunked_delta_rule(q, k, v, g, beta, chunk_size, per_channel):
    """Plain-torch chunked (gated / KDA) delta rule. q, k [B,T,H,K] (L2-normalised), v [B,T,H,V],
    g log decays [B,T,H] (GDN) or [B,T,H,K] (KDA), beta [B,T,H]; fp32; returns o [B,T,H,V].

    Within a chunk with entry state S and chunk-local cumulative gates G:
    ``(I + L) U = beta*v``, ``(I + L) W = beta*k*exp(G)`` with ``L_ij = beta_i <k_i, k_j>_{G_i-G_j}``
    (i > j), ``delta = U - W S``, ``o = (q*exp(G)) S + tril(<q_i, k_j>_{G_i-G_j}) delta``,
    ``S' = exp(G_C) S + (k*exp(G_C - G))^T delta``.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    N = -(-T // C)
    pad = N * C - T
    scale = K ** -0.5

    def prep(t):
        t = _acc(t).transpose(1, 2)  # [B,H,T,...]
        if pad:
            t = F.pad(t, (0, 0, 0, pad) if t.dim() == 4 else (0, pad))
        return t.reshape(B, H, N, C, *t.shape[3:])

    q, k, v, beta = prep(q) * scale, prep(k), prep(v), prep(beta)
    G = prep(g).cumsum(3)                                    # [B,H,N,C(,K)]
    idx = torch.arange(C, device=q.device)
    strict = idx[:, None] > idx[None, :]
    incl = idx[:, None] >= idx[None, :]
    eye = torch.eye(C, device=q.device, dtype=q.dtype)
    if per_channel:
        diff = G.unsqueeze(-2) - G.unsqueeze(-3)             # [B,H,N,C,C,K]  G_i - G_j
        dec_s = torch.exp(torch.where(strict[..., None], diff, float("-inf")))
        dec_i = torch.exp(torch.where(incl[..., None], diff, float("-inf")))
        L = torch.einsum("bhnic,bhnjc,bhnijc->bhnij", k, k, dec_s) * beta[..., None]
        attn = torch.einsum("bhnic,bhnjc,bhnijc->bhnij", q, k, dec_i)
        kg, qg = k * G.exp(), q * G.exp()
        k_end = k * torch.exp(G[..., -1:, :] - G)
        last = G[..., -1, :].exp()                           # [B,H,N,K]
    else:
        diff = G.unsqueeze(-1) - G.unsqueeze(-2)             # [B,H,N,C,C]
        dec_s = torch.exp(torch.where(strict, diff, float("-inf")))
        dec_i = torch.exp(torch.where(incl, diff, float("-inf")))
        L = (k @ k.transpose(-1, -2)) * dec_s * beta[..., None]
        attn = (q @ k.transpose(-1, -2)) * dec_i
        kg, qg = k * G.exp()[..., None], q * G.exp()[..., None]
        k_end = k * torch.exp(G[..., -1:] - G)[..., None]
        last = G[..., -1].exp()[..., None]                   # [B,H,N,1]
    Tinv = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False)
    U = Tinv @ (v * beta[..., None])
    W = Tinv @ (kg * beta[..., None])
    S = q.new_zeros(B, H, K, V)
    outs = []
    for n in range(N):
        delta = U[:, :, n] - W[:, :, n] @ S
        outs.append(qg[:, :, n] @ S + attn[:, :, n] @ delta)
        S = S * last[:, :, n, :, None] + k_end[:, :, n].transpose(-1, -2) @ delta
    o = torch.stack(outs, 2).reshape(B, H, N * C, V)[:, :, :T]
    return o.transpose(1, 2)


class Torch:
    name = "torch"

    @staticmethod
    def linear(x, w, main_grad=None):
        return F.linear(x, w)

    @staticmethod
    def rmsnorm(x, weight, eps):
        xf = _acc(x)
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * _acc(weight)).to(x.dtype)

    @staticmethod
    def short_conv(conv, x):
        T, W = x.shape[1], conv.weight.shape[-1]
        y = F.conv1d(x.transpose(1, 2), conv.weight, conv.bias, padding=W - 1, groups=x.shape[-1])
        return F.silu(y[..., :T]).transpose(1, 2)

    @staticmethod
    def gated_norm(norm, x, z):
        xf = _acc(x)
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + norm.eps) * _acc(norm.weight)
        gate = torch.sigmoid(_acc(z)) if norm.activation == "sigmoid" else F.silu(_acc(z))
        return (y * gate).to(x.dtype)

    @staticmethod
    def gdn(q, k, v, a, b, A_log, dt_bias, chunk_size):
        g = _gdn_gate(a, A_log, dt_bias)
        o = _chunked_delta_rule(_l2n(q), _l2n(k), v, g, _acc(b).sigmoid(), chunk_size, False)
        return o.to(q.dtype)

    @staticmethod
    def kda(q, k, v, f, b, A_log, dt_bias, chunk_size):
        H, K = f.shape[-2], f.shape[-1]
        g = -_acc(A_log).exp()[:, None] * F.softplus(_acc(f) + _acc(dt_bias).view(H, K))
        o = _chunked_delta_rule(_l2n(q), _l2n(k), v, g, _acc(b).sigmoid(), chunk_size, True)
        return o.to(q.dtype)

    @staticmethod
    def rms_factor(x, eps):
        return torch.rsqrt(_acc(x).square().mean(-1, keepdim=True) + eps).to(x.dtype)

    @staticmethod
    def hc_split(mixes, scale, base, n, iters, eps):
        u = mixes * scale.repeat_interleave(torch.tensor([n, n, n * n], device=mixes.device)) + base
        pre = torch.sigmoid(u[..., :n]) + eps
        post = 2 * torch.sigmoid(u[..., n:2 * n])
        logits = u[..., 2 * n:].unflatten(-1, (n, n))
        Km = torch.exp(logits - logits.amax(-1, keepdim=True).detach())
        for _ in range(iters):
            Km = Km / (Km.sum(-1, keepdim=True) + eps)
            Km = Km / (Km.sum(-2, keepdim=True) + eps)
        return pre, post, Km

    @staticmethod
    def hc_head(mixes, scale, base, eps):
        return torch.sigmoid(scale * mixes + base) + eps

    @staticmethod
    def pre_mix(h_pre, X):
        return (_acc(h_pre).unsqueeze(-1) * _acc(X)).sum(-2)

    @staticmethod
    def post_mix(X, comb, f, post):
        out = _acc(post).unsqueeze(-1) * _acc(f).unsqueeze(-2) + \
            torch.einsum("...jk,...jc->...kc", _acc(comb), _acc(X))
        return out.to(X.dtype)

    @staticmethod
    def permute(x, probs, expert_of_row, counts):
        order = torch.argsort(expert_of_row, stable=True)
        return x[order], probs[order], order

    @staticmethod
    def unpermute(ys, order):
        return torch.zeros_like(ys).index_copy(0, order, ys)

    @staticmethod
    def swiglu(h, limit, alpha=1.702, bias=1.0):
        a = h[..., 0::2].clamp(max=limit)
        b = h[..., 1::2].clamp(-limit, limit)
        return a * torch.sigmoid(alpha * a) * (b + bias)

    @staticmethod
    def lm_loss(h, weight, labels):
        logits = _acc(h @ weight.t())
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


KERNELS = {"fused": Fused, "torch": Torch}

# ---------------------------------------------------------------------------------------------
# Modules. `impl` picks the kernels; the parameters (and so the state dict) do not depend on it.


class PlainShortConv(nn.Conv1d):
    """A depthwise causal conv holding the same parameters as fusedops.nn.ShortConvolution."""

    def __init__(self, hidden_size, kernel_size, activation="silu"):
        super().__init__(hidden_size, hidden_size, kernel_size, padding=kernel_size - 1,
                         groups=hidden_size, bias=False)
        self.activation = activation


class PlainRMSNormGated(nn.Module):
    def __init__(self, hidden_size, eps, activation):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.activation = activation


class Linear(nn.Module):
    """Bias-free linear layer; in the fused model its weight gradient goes through matmul_add."""

    def __init__(self, fan_in, fan_out, impl, std=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fan_out, fan_in))
        nn.init.normal_(self.weight, std=std if std is not None else fan_in ** -0.5)
        self.impl = impl

    def forward(self, x):
        return KERNELS[self.impl].linear(x, self.weight, getattr(self.weight, "main_grad", None))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, impl):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.impl = impl

    def forward(self, x):
        return KERNELS[self.impl].rmsnorm(x, self.weight, self.eps)


def _make_conv(impl, channels, width):
    if impl == "fused":
        _require_fusedops()
        return fnn.ShortConvolution(channels, width, bias=False, activation="silu")
    return PlainShortConv(channels, width)


def _make_gated_norm(impl, dim, eps, activation):
    if impl == "fused":
        _require_fusedops()
        return fnn.RMSNormGated(dim, eps=eps, norm_before_gate=True, activation=activation)
    return PlainRMSNormGated(dim, eps, activation)


class DeltaMixer(nn.Module):
    """GatedDeltaNet (cfg.mixer == "gdn") or Kimi Delta Attention ("kda") token mixer."""

    def __init__(self, cfg: Config, impl: str):
        super().__init__()
        D, H, K = cfg.dim, cfg.heads, cfg.head_dim
        self.cfg, self.impl, self.kda = cfg, impl, cfg.mixer == "kda"
        self.qkv_proj = Linear(D, 3 * H * K, impl)
        self.conv = _make_conv(impl, 3 * H * K, cfg.conv_size)
        self.b_proj = Linear(D, H, impl)
        if self.kda:
            # KDA: a low-rank per-channel gate and a low-rank output gate (FLA KimiDeltaAttention).
            self.f_proj = nn.Sequential(Linear(D, K, impl), Linear(K, H * K, impl))
            self.g_proj = nn.Sequential(Linear(D, K, impl), Linear(K, H * K, impl))
            dt_shape = (H * K,)
        else:
            self.a_proj = Linear(D, H, impl)
            self.g_proj = Linear(D, H * K, impl)
            dt_shape = (H,)
        # FLA's gate initialisation: A ~ U(1, 16), dt ~ logU(1e-3, 1e-1), dt_bias = softplus^-1(dt)
        self.A_log = nn.Parameter(torch.empty(H).uniform_(1, 16).log())
        dt = torch.exp(torch.rand(dt_shape) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.o_norm = _make_gated_norm(impl, K, 1e-5, "sigmoid" if self.kda else "silu")
        self.o_proj = Linear(H * K, D, impl, std=(H * K) ** -0.5 / math.sqrt(2 * cfg.layers))

    def forward(self, x):
        kern = KERNELS[self.impl]
        B, T, _ = x.shape
        H, K = self.cfg.heads, self.cfg.head_dim
        qkv = kern.short_conv(self.conv, self.qkv_proj(x))
        q, k, v = (t.unflatten(-1, (H, K)) for t in qkv.split(H * K, -1))
        b = self.b_proj(x)
        if self.kda:
            f = self.f_proj(x).unflatten(-1, (H, K))
            o = kern.kda(q, k, v, f, b, self.A_log, self.dt_bias, self.cfg.chunk_size)
        else:
            o = kern.gdn(q, k, v, self.a_proj(x), b, self.A_log, self.dt_bias, self.cfg.chunk_size)
        z = self.g_proj(x).unflatten(-1, (H, K))
        o = kern.gated_norm(self.o_norm, o, z)
        return self.o_proj(o.flatten(-2))


class MoE(nn.Module):
    """Top-k MoE with clipped-SwiGLU experts (GPT-OSS activation, interleaved gate/up rows)."""

    def __init__(self, cfg: Config, impl: str):
        super().__init__()
        D, E, Fd = cfg.dim, cfg.experts, cfg.expert_dim
        self.cfg, self.impl = cfg, impl
        self.router = Linear(D, E, impl, std=0.02)
        self.w1 = nn.Parameter(torch.randn(E, 2 * Fd, D) * D ** -0.5)
        self.w2 = nn.Parameter(torch.randn(E, D, Fd) * Fd ** -0.5 / math.sqrt(2 * cfg.layers))
        self.aux_loss = None

    def forward(self, x):
        kern = KERNELS[self.impl]
        cfg = self.cfg
        B, T, D = x.shape
        E, k = cfg.experts, cfg.top_k
        xf = x.reshape(-1, D)
        N = xf.shape[0]
        probs = torch.softmax(_acc(self.router(xf)), -1)                 # [N, E]
        top_p, top_e = probs.topk(k, -1)
        top_p = top_p / top_p.sum(-1, keepdim=True)
        counts = torch.bincount(top_e.reshape(-1), minlength=E)
        if DIST.active:  # the statistics of the whole batch, summed over the CP group
            import torch.distributed as tdist
            counts_all = counts.clone()
            tdist.all_reduce(counts_all, group=DIST.cp_group)
            p_all = GroupSum.apply(probs.sum(0), DIST.cp_group)
            n_all = DIST.tokens
            # Each rank adds its 1/cp share: the gradients summed over the group are the whole one.
            self.aux_loss = E * ((counts_all.to(probs.dtype) / (n_all * k)) * (p_all / n_all)).sum() / DIST.cp_size
        else:
            self.aux_loss = E * ((counts.to(probs.dtype) / (N * k)) * probs.mean(0)).sum()
        rows = xf.repeat_interleave(k, 0)                                   # row r = token r // k
        xs, ps, perm = kern.permute(rows, top_p.reshape(-1).to(x.dtype), top_e.reshape(-1), counts)
        sizes = counts.tolist()
        g1 = getattr(self.w1, "main_grad", None)
        g2 = getattr(self.w2, "main_grad", None)
        hs = [kern.linear(xe, self.w1[e], None if g1 is None else g1[e])
              for e, xe in enumerate(xs.split(sizes)) if sizes[e]]
        act = kern.swiglu(torch.cat(hs), cfg.swiglu_limit)
        ys, live = [], [e for e in range(E) if sizes[e]]
        for e, ae in zip(live, act.split([sizes[e] for e in live])):
            ys.append(kern.linear(ae, self.w2[e], None if g2 is None else g2[e]))
        y = torch.cat(ys) * ps.unsqueeze(-1)
        y = kern.unpermute(y, perm)
        return y.view(N, k, D).sum(1).view(B, T, D)


class HCSublayer(nn.Module):
    """One sub-layer on the mHC residual streams (DeepSeek-V4 hc_pre / hc_post)."""

    def __init__(self, cfg: Config, impl: str, inner: nn.Module):
        super().__init__()
        n, D = cfg.hc_mult, cfg.dim
        self.cfg, self.impl, self.inner = cfg, impl, inner
        mix = (2 + n) * n
        self.hc_fn = Linear(n * D, mix, impl, std=0.1 * (n * D) ** -0.5)
        self.hc_scale = nn.Parameter(torch.ones(3))
        base = torch.zeros(mix)
        base[2 * n:] = (2.0 * torch.eye(n)).flatten()    # comb starts near the identity
        self.hc_base = nn.Parameter(base)
        self.norm = RMSNorm(D, cfg.norm_eps, impl)

    def forward(self, X):
        kern = KERNELS[self.impl]
        cfg = self.cfg
        xf = _acc(X.flatten(2))
        mixes = self.hc_fn(xf) * kern.rms_factor(xf, cfg.norm_eps)
        pre, post, comb = kern.hc_split(mixes, self.hc_scale, self.hc_base, cfg.hc_mult,
                                        cfg.sinkhorn_iters, cfg.hc_eps)
        h = kern.pre_mix(pre, X).to(X.dtype)
        f = self.inner(self.norm(h))
        return kern.post_mix(X, comb, f, post)


class HybridLM(nn.Module):
    def __init__(self, cfg: Config, impl: str):
        super().__init__()
        if impl not in KERNELS:
            raise ValueError(f"train_hybrid: impl must be one of {sorted(KERNELS)}, got {impl!r}")
        if cfg.mixer not in ("gdn", "kda"):
            raise ValueError(f"train_hybrid: mixer must be 'gdn' or 'kda', got {cfg.mixer!r}")
        if impl == "fused":
            _require_fusedops()
            if cfg.mixer == "kda" and not has_kda():
                raise NotImplementedError(
                    "train_hybrid: --mixer kda needs fusedops.chunk_kda, which this fusedops build "
                    "does not have yet; use --mixer gdn")
        self.cfg, self.impl = cfg, impl
        n, D = cfg.hc_mult, cfg.dim
        self.embed = nn.Embedding(cfg.vocab, D)
        nn.init.normal_(self.embed.weight, std=1.0)
        self.blocks = nn.ModuleList()
        for _ in range(cfg.layers):
            self.blocks.append(nn.ModuleList([HCSublayer(cfg, impl, DeltaMixer(cfg, impl)),
                                              HCSublayer(cfg, impl, MoE(cfg, impl))]))
        self.hc_head_fn = Linear(n * D, n, impl, std=0.1 * (n * D) ** -0.5)
        self.hc_head_scale = nn.Parameter(torch.ones(1))
        self.hc_head_base = nn.Parameter(torch.zeros(n))
        self.final_norm = RMSNorm(D, cfg.norm_eps, impl)
        self.lm_head = nn.Parameter(torch.randn(cfg.vocab, D) * D ** -0.5)

    def forward(self, tokens, labels):
        """Returns (lm loss, lm loss + aux loss)."""
        kern = KERNELS[self.impl]
        cfg = self.cfg
        x = self.embed(tokens)
        X = x.unsqueeze(2).expand(-1, -1, cfg.hc_mult, -1).contiguous()
        aux = x.new_zeros((), dtype=_acc(x).dtype)
        for mixer, moe in self.blocks:
            X = moe(mixer(X))
            aux = aux + moe.inner.aux_loss
        xf = _acc(X.flatten(2))
        mixes = self.hc_head_fn(xf) * kern.rms_factor(xf, cfg.norm_eps)
        pre = kern.hc_head(mixes, self.hc_head_scale, self.hc_head_base, cfg.hc_eps)
        h = self.final_norm(kern.pre_mix(pre, X).to(X.dtype))
        loss = kern.lm_loss(h, self.lm_head, labels)
        return loss, loss + cfg.aux_loss_coef * aux / cfg.layers


# ---------------------------------------------------------------------------------------------
# Building, data, training


_FP32_PARAMS = ("A_log", "dt_bias", "hc_scale", "hc_base", "hc_head_scale", "hc_head_base")


def _fp32_param(name: str) -> bool:
    return name.split(".")[-1] in _FP32_PARAMS or ".hc_fn." in name or name.startswith("hc_head_fn")


def build_models(cfg: Config, device="cpu", dtype=torch.float32, seed: int = 0):
    """(fused model, plain model): the same module tree, the plain one loaded with the fused
    one's state dict. Parameters are in `dtype` except the gate and mHC coefficients (fp32)."""
    torch.manual_seed(seed)
    fused = HybridLM(cfg, "fused")
    plain = HybridLM(cfg, "torch")
    plain.load_state_dict(fused.state_dict())
    for m in (fused, plain):
        m.to(device)
        for name, p in m.named_parameters():
            if not _fp32_param(name):
                p.data = p.data.to(dtype)
    if cfg.grad_accum_fusion:
        attach_main_grads(fused)
    return fused, plain


def attach_main_grads(model: nn.Module) -> None:
    """fp32 ``main_grad`` buffers for the weights whose gradient goes through matmul_add."""
    for mod in model.modules():
        if isinstance(mod, Linear):
            mod.weight.main_grad = torch.zeros_like(mod.weight, dtype=torch.float32)
        elif isinstance(mod, MoE):
            for p in (mod.w1, mod.w2):
                p.main_grad = torch.zeros_like(p, dtype=torch.float32)


def zero_grads(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None
        if hasattr(p, "main_grad"):
            p.main_grad.zero_()


def collect_grads(model: nn.Module) -> None:
    """After backward: the matmul_add accumulators become the parameters' .grad."""
    for p in model.parameters():
        if hasattr(p, "main_grad"):
            p.grad = p.main_grad if p.dtype == torch.float32 else p.main_grad.to(p.dtype)


def grads(model: nn.Module) -> dict:
    """name -> gradient (after collect_grads)."""
    return {n: p.grad for n, p in model.named_parameters()}


def load_corpus(max_bytes: int = 4 << 20) -> torch.Tensor:
    """The standard library's top-level .py files, sorted by name, concatenated as bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    data = bytearray()
    for path in sorted(root.glob("*.py")):
        data += path.read_bytes()
        if len(data) >= max_bytes:
            break
    if len(data) < 1 << 16:
        raise RuntimeError(f"train_hybrid: found only {len(data)} bytes of .py sources in {root}")
    return torch.frombuffer(data[:max_bytes], dtype=torch.uint8).long()


class Batches:
    """Random windows of the corpus from a seeded generator: the same sequence every run."""

    def __init__(self, corpus: torch.Tensor, batch: int, seq_len: int, seed: int = 0):
        self.corpus, self.batch, self.seq_len = corpus, batch, seq_len
        self.gen = torch.Generator().manual_seed(seed)

    def next(self):
        starts = torch.randint(0, self.corpus.numel() - self.seq_len - 1, (self.batch,),
                               generator=self.gen)
        win = torch.stack([self.corpus[s:s + self.seq_len + 1] for s in starts.tolist()])
        return win[:, :-1], win[:, 1:]


def make_optimizer(model: nn.Module, lr: float):
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)


def train_step(model, opt, tokens, labels, clip: float = 1.0):
    zero_grads(model)
    loss, total = model(tokens, labels)
    total.backward()
    collect_grads(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return float(loss.detach())


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _lr_at(step, steps, lr, warmup):
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def train(cfg: Config, steps: int = 200, batch: int = 8, seq_len: int = 128, lr: float = 3e-3,
          device="cpu", dtype=torch.float32, seed: int = 0, log_every: int = 10, warmup: int = 20,
          log=print, control: bool = False):
    """Train both models on the same batches. Returns a dict with per-step losses ('fused',
    'torch'), mean tokens/s of each (after the first two steps) and the models.

    ``control=True`` also trains a third model, 'control': the plain model with every weight
    multiplied by ``1 + 1e-7 * N(0, 1)`` (about one fp32 rounding). How fast its loss curve leaves
    the plain model's is how fast these training dynamics amplify rounding-sized differences:
    the yardstick for the drift between the fused and the plain model."""
    fused, plain = build_models(cfg, device, dtype, seed)
    models = {"fused": fused, "torch": plain}
    if control:
        ctl = HybridLM(cfg, "torch").to(device)
        ctl.load_state_dict(plain.state_dict())
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in ctl.parameters():
                p.mul_(1 + 1e-7 * torch.randn(p.shape, generator=gen).to(p))
        models["control"] = ctl
    opts = {n: make_optimizer(m, lr) for n, m in models.items()}
    data = Batches(load_corpus(), batch, seq_len, seed)
    losses = {n: [] for n in models}
    times = {n: [] for n in models}
    tokens_per_step = batch * seq_len
    last_log = -1
    for step in range(steps):
        tokens, labels = (t.to(device) for t in data.next())
        for name in models:
            for group in opts[name].param_groups:
                group["lr"] = _lr_at(step, steps, lr, warmup)
            _sync(device)
            t0 = time.perf_counter()
            losses[name].append(train_step(models[name], opts[name], tokens, labels))
            _sync(device)
            times[name].append(time.perf_counter() - t0)
        if log and (step % log_every == 0 or step == steps - 1):
            lf, lt = losses["fused"][-1], losses["torch"][-1]
            span = step - last_log
            tf, tt = (tokens_per_step * span / sum(times[n][-span:]) for n in ("fused", "torch"))
            last_log = step
            extra = ""
            if control:
                extra = f"  control rel.diff {abs(losses['control'][-1] - lt) / abs(lt):.2e}"
            log(f"step {step:4d}  loss fused {lf:.5f}  torch {lt:.5f}  rel.diff "
                f"{abs(lf - lt) / abs(lt):.2e}  tok/s fused {tf:8.0f}  torch {tt:8.0f}{extra}")
    tps = {}
    for n, t in times.items():
        ts = t[2:] if len(t) > 2 else t
        tps[n] = tokens_per_step * len(ts) / sum(ts)
    return {"losses": losses, "tokens_per_s": tps, "step_times": times, "models": models,
            "optimizers": opts, "data": data}


# ---------------------------------------------------------------------------------------------
# Measurements after training: step peak memory and the per-operator profile.


def _fwd_bwd(model, tokens, labels):
    zero_grads(model)
    _, total = model(tokens, labels)
    total.backward()
    collect_grads(model)


def peak_step_memory(model, tokens, labels, device) -> int:
    """Bytes allocated at the peak of one forward+backward, above what was allocated before."""
    return peak_memory(lambda: _fwd_bwd(model, tokens, labels), device)


def peak_memory(fn, device) -> int:
    """Bytes allocated at the peak of ``fn()``, above what was allocated before (also used by
    examples/hf_finetune.py)."""
    if torch.device(device).type == "cuda":
        _sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        _sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    cur = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak


# The fusedops ops of the model and the substrings naming their autograd nodes.
OPS = ("causal_conv1d", "chunk_gated_delta_rule", "chunk_kda", "rmsnorm_gated",
       "rmsnorm_without_weight", "hc_split_sinkhorn", "mhc_pre_bmm", "mhc_post",
       "sort_chunks_by_idx", "sort_chunks_by_map", "clipped_swiglu", "chunk_loss", "matmul_add")
_NODE_KEYS = {"chunk_kda": "kda"}


def resolve_torch_ops(spec: str, device) -> set:
    """The operators named in ``spec`` (comma-separated; ``auto`` = every operator of the model
    with no runnable fusedops backend on ``device``'s type), which then run as plain PyTorch
    inside the fused model."""
    ops = set()
    dev = torch.device(device).type
    for item in (x.strip() for x in spec.split(",")):
        if not item or item == "none":
            continue
        if item == "auto":
            for op in OPS:
                if op == "chunk_kda" and not has_kda():
                    continue
                try:
                    entries = fusedops.backends(op)
                except Exception:  # an operator this build does not know
                    entries = []
                if not any(e["device"] == dev and e["runnable_here"] for e in entries):
                    ops.add(op)
        elif item in OPS:
            ops.add(item)
        else:
            raise ValueError(f"train_hybrid: --torch-ops: unknown operator {item!r}; known: "
                             f"{', '.join(OPS)}, auto, none")
    if "sort_chunks_by_map" in ops:  # the permutation and its inverse go together
        ops.add("sort_chunks_by_idx")
    return ops


def op_profile(model, tokens, labels, device, passes: int = 3) -> dict:
    """{op: {"fwd_ms": per pass, "bwd_ms": per pass}} plus "total_ms" of a forward+backward."""
    from torch.profiler import ProfilerActivity, profile
    cuda = torch.device(device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _fwd_bwd(model, tokens, labels)
    _sync(device)
    with profile(activities=acts) as prof:
        for _ in range(passes):
            with torch.profiler.record_function("fo:__pass__"):
                _fwd_bwd(model, tokens, labels)
            _sync(device)

    def us(ev):
        return ev.device_time_total if cuda else ev.cpu_time_total

    out = {op: {"fwd_ms": 0.0, "bwd_ms": 0.0} for op in OPS}
    total = 0.0
    for ev in prof.key_averages():
        name = ev.key
        if name == "fo:__pass__":
            total = us(ev) if not cuda else 0.0
        elif name.startswith("fo:") and name[3:] in out:
            key = "bwd_ms" if name[3:] == "matmul_add" else "fwd_ms"
            out[name[3:]][key] += us(ev) / 1e3 / passes
        elif name.startswith("autograd::engine::evaluate_function:"):
            node = name.split(":", 4)[-1]
            for op in OPS:
                if _NODE_KEYS.get(op, op) in node and op != "matmul_add":
                    out[op]["bwd_ms"] += us(ev) / 1e3 / passes
                    break
    if cuda:
        total = sum(ev.self_device_time_total for ev in prof.key_averages()) / 1e3 / passes
    else:
        total = total / 1e3 / passes
    res = {op: v for op, v in out.items() if v["fwd_ms"] or v["bwd_ms"]}
    res["total_ms"] = total
    return res


# ---------------------------------------------------------------------------------------------
# Distributed: --cp N (context parallel) and --tp M (vocabulary-parallel LM head) under torchrun


def _dist_groups(cp: int, tp: int):
    """(cp group, tp group, cp index, tp index) of this rank: rank = cp index * tp + tp index."""
    import torch.distributed as tdist
    rank, world = tdist.get_rank(), tdist.get_world_size()
    if world != cp * tp:
        raise SystemExit(f"train_hybrid: --cp {cp} --tp {tp} needs {cp * tp} processes, torchrun started {world}")
    cp_groups = [tdist.new_group([c * tp + t for c in range(cp)]) for t in range(tp)]
    tp_groups = [tdist.new_group([c * tp + t for t in range(tp)]) for c in range(cp)]
    ci, ti = divmod(rank, tp)
    return cp_groups[ti], tp_groups[ci], ci, ti


def _dist_clip(model, clip: float, tp_group) -> None:
    """clip_grad_norm_ over the whole model: the LM head's norm summed over its vocabulary shards."""
    import torch.distributed as tdist
    head = model.lm_head.grad.double().square().sum()
    tdist.all_reduce(head, group=tp_group)
    rest = sum(float(p.grad.double().square().sum()) for n, p in model.named_parameters()
               if p.grad is not None and n != "lm_head")
    coef = min(1.0, clip / (math.sqrt(float(head) + rest) + 1e-6))
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(coef)


def run_distributed(args, cfg: Config, dtype, log=print) -> list:
    """Train the fused model distributed (--cp N tokens groups x --tp M vocabulary shards) next to
    the same fused model on the whole batch in one process; rank 0 prints both losses. Returns
    the relative differences of the two losses per step. Joins the default process group
    (torchrun's environment) unless one exists already."""
    import torch.distributed as tdist
    from fusedops.distributed import context_parallel
    own_group = not tdist.is_initialized()
    device = torch.device(args.device)
    if device.type == "cuda":  # torchrun's LOCAL_RANK, or the device a caller's group already set
        index = int(os.environ.get("LOCAL_RANK", 0)) if own_group else torch.cuda.current_device()
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    if own_group:
        tdist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    cp_group, tp_group, ci, ti = _dist_groups(args.cp, args.tp)
    rank = tdist.get_rank()
    single, _ = build_models(cfg, device, dtype, args.seed)
    model, _ = build_models(cfg, device, dtype, args.seed)
    V = cfg.vocab
    shards = [V // args.tp + (1 if t < V % args.tp else 0) for t in range(args.tp)]
    v0 = sum(shards[:ti])
    model.lm_head = nn.Parameter(model.lm_head.detach()[v0:v0 + shards[ti]].clone())
    opts = {"single": make_optimizer(single, args.lr), "dist": make_optimizer(model, args.lr)}
    data = Batches(load_corpus(), args.batch, args.seq_len, args.seed)
    B, L = args.batch, args.seq_len
    cu = torch.arange(0, B * L + 1, L, dtype=torch.int32)
    rel = []
    log = log if rank == 0 else (lambda *a, **k: None)
    log(f"train_hybrid: distributed, {args.cp} context-parallel x {args.tp} vocabulary-parallel ranks "
        f"({tdist.get_backend()}); {B} sequences x {L} tokens per step, packed")
    for step in range(args.steps):
        tokens, labels = (t.to(device) for t in data.next())
        for opt in opts.values():
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, args.steps, args.lr, 20)
        l_single = train_step(single, opts["single"], tokens, labels)
        # The distributed step: this rank's tokens of the packed batch, its vocabulary slice.
        plan = context_parallel(cu, cp_group, conv_width=cfg.conv_size, device=device)
        DIST.plan, DIST.cp_group, DIST.tp_group, DIST.cp_size = plan, cp_group, tp_group, args.cp
        DIST.tokens, DIST.vocab_start, DIST.active = B * L, v0, True
        try:
            zero_grads(model)
            loss, total = model(plan.shard(tokens.reshape(1, -1)), plan.shard(labels.reshape(1, -1)))
            total.backward()
        finally:
            DIST.active = False
        collect_grads(model)
        for p in model.parameters():  # every rank's tokens: the gradients sum over the CP group
            if p.grad is not None:
                tdist.all_reduce(p.grad, group=cp_group)
        _dist_clip(model, 1.0, tp_group)
        opts["dist"].step()
        l_dist = loss.detach().clone()
        tdist.all_reduce(l_dist, group=cp_group)
        l_dist = float(l_dist)
        rel.append(abs(l_dist - l_single) / abs(l_single))
        if step % args.log_every == 0 or step == args.steps - 1:
            log(f"step {step:4d}  loss distributed {l_dist:.6f}  one process {l_single:.6f}  "
                f"rel.diff {rel[-1]:.2e}")
    log(f"\n|rel. diff| of the losses: first step {rel[0]:.2e}, max over the first 10 steps "
        f"{max(rel[:10]):.2e}, max {max(rel):.2e}")
    if own_group:
        tdist.destroy_process_group()
    return rel


# ---------------------------------------------------------------------------------------------
# Command line


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--mixer", default="gdn", choices=["gdn", "kda"])
    p.add_argument("--dim", type=int, default=Config.dim)
    p.add_argument("--layers", type=int, default=Config.layers)
    p.add_argument("--heads", type=int, default=Config.heads)
    p.add_argument("--head-dim", type=int, default=Config.head_dim)
    p.add_argument("--experts", type=int, default=Config.experts)
    p.add_argument("--top-k", type=int, default=Config.top_k)
    p.add_argument("--expert-dim", type=int, default=None, help="default: --dim")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--no-grad-accum-fusion", action="store_true",
                   help="fused model: weight gradients through autograd instead of matmul_add")
    p.add_argument("--torch-ops", default="auto",
                   help="comma-separated fusedops operators to run as plain PyTorch inside the "
                        "fused model (e.g. an operator without a backend for the device); 'auto' "
                        "(default) picks those with no runnable backend, 'none' forces all")
    p.add_argument("--control", action="store_true",
                   help="also train the plain model from weights perturbed by 1e-7 relative: the "
                        "yardstick for how fast rounding-sized differences grow in training")
    p.add_argument("--cp", type=int, default=1,
                   help="context-parallel ranks (run under torchrun with cp*tp processes)")
    p.add_argument("--tp", type=int, default=1,
                   help="vocabulary-parallel ranks for the LM head (under torchrun)")
    p.add_argument("--profile-passes", type=int, default=3)
    p.add_argument("--json", help="write a summary here")
    p.add_argument("--plot", help="write a PNG of the two loss curves here (needs matplotlib)")
    return p.parse_args(argv)


def _fmt_bytes(n):
    return f"{n / 2**20:.1f} MiB"


def main(argv=None):
    args = _parse(argv)
    if args.mixer == "kda" and not has_kda():
        sys.exit("train_hybrid: --mixer kda needs fusedops.chunk_kda, which this fusedops build "
                 "does not have yet; use --mixer gdn")
    _require_fusedops()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    FALLBACK.clear()
    FALLBACK.update(resolve_torch_ops(args.torch_ops, args.device))
    cfg = replace(Config(), dim=args.dim, layers=args.layers, heads=args.heads,
                  head_dim=args.head_dim, experts=args.experts, top_k=args.top_k,
                  expert_dim=args.expert_dim or args.dim, mixer=args.mixer,
                  grad_accum_fusion=not args.no_grad_accum_fusion and "matmul_add" not in FALLBACK)
    if args.cp > 1 or args.tp > 1:
        run_distributed(args, cfg, dtype)
        return None
    n_params = sum(p.numel() for p in HybridLM(cfg, "torch").parameters())
    print(f"train_hybrid: {n_params / 1e6:.2f}M parameters, {cfg.layers} layers, dim {cfg.dim}, "
          f"{cfg.mixer} mixer, {cfg.experts} experts top-{cfg.top_k}, mHC n={cfg.hc_mult}; "
          f"{args.device} {args.dtype}, batch {args.batch} x {args.seq_len} tokens, "
          f"{args.steps} steps, threads {torch.get_num_threads()}")
    if FALLBACK:
        print(f"train_hybrid: run as plain PyTorch inside the fused model: {', '.join(sorted(FALLBACK))}")
    t0 = time.perf_counter()
    res = train(cfg, args.steps, args.batch, args.seq_len, args.lr, args.device, dtype, args.seed,
                args.log_every, control=args.control)
    train_s = time.perf_counter() - t0
    lf, lt = res["losses"]["fused"], res["losses"]["torch"]
    rel = [abs(a - b) / abs(b) for a, b in zip(lf, lt)]
    tokens, labels = (t.to(args.device) for t in res["data"].next())
    mem = {n: peak_step_memory(res["models"][n], tokens, labels, args.device)
           for n in ("fused", "torch")}
    prof = op_profile(res["models"]["fused"], tokens, labels, args.device, args.profile_passes)
    tps = res["tokens_per_s"]
    above = next((i for i, r in enumerate(rel) if r > 1e-4), None)
    print(f"\nfinal loss: fused {lf[-1]:.5f}, torch {lt[-1]:.5f} (first {lf[0]:.4f}); |rel. diff| "
          f"max {max(rel):.2e}, first 10 steps {max(rel[:10]):.2e}, first step above 1e-4: {above}")
    ctl = None
    if args.control:
        lc = res["losses"]["control"]
        crel = [abs(a - b) / abs(b) for a, b in zip(lc, lt)]
        ctl = {"max_rel_loss_diff": max(crel), "max_rel_loss_diff_first_10_steps": max(crel[:10]),
               "first_step_rel_loss_diff_above_1e-4": next((i for i, r in enumerate(crel)
                                                            if r > 1e-4), None)}
        print(f"control (plain model, weights x (1 + 1e-7 N(0,1))) vs plain: |rel. diff| max "
              f"{ctl['max_rel_loss_diff']:.2e}, first 10 steps "
              f"{ctl['max_rel_loss_diff_first_10_steps']:.2e}, first step above 1e-4: "
              f"{ctl['first_step_rel_loss_diff_above_1e-4']}")
    print(f"tokens/s: fused {tps['fused']:.0f}, torch {tps['torch']:.0f} "
          f"({tps['fused'] / tps['torch']:.2f}x)")
    print(f"peak memory of a forward+backward (above the resident state): fused "
          f"{_fmt_bytes(mem['fused'])}, torch {_fmt_bytes(mem['torch'])}")
    unit = "device" if torch.device(args.device).type == "cuda" else "CPU"
    print(f"\nfusedops model, per operator ({unit} time per forward+backward, "
          f"{args.profile_passes} passes; total {prof['total_ms']:.1f} ms):")
    print(f"  {'operator':<24} {'fwd ms':>9} {'bwd ms':>9} {'share':>7}")
    ops = sorted(((k, v) for k, v in prof.items() if k != "total_ms"),
                 key=lambda kv: -(kv[1]["fwd_ms"] + kv[1]["bwd_ms"]))
    for op, v in ops:
        share = (v["fwd_ms"] + v["bwd_ms"]) / prof["total_ms"] if prof["total_ms"] else 0.0
        print(f"  {op:<24} {v['fwd_ms']:9.2f} {v['bwd_ms']:9.2f} {100 * share:6.1f}%")
    rest = prof["total_ms"] - sum(v["fwd_ms"] + v["bwd_ms"] for _, v in ops)
    print(f"  {'(everything else)':<24} {'':>9} {'':>9} {100 * rest / max(prof['total_ms'], 1e-9):6.1f}%")
    print(f"\ntraining wall time {train_s:.1f} s")
    summary = {
        "config": asdict(cfg), "device": args.device, "dtype": args.dtype, "steps": args.steps,
        "batch": args.batch, "seq_len": args.seq_len, "params": n_params,
        "tokens_per_s": tps, "peak_step_memory_bytes": mem,
        "final_loss": {"fused": lf[-1], "torch": lt[-1]},
        "max_rel_loss_diff": max(rel), "max_abs_loss_diff": max(abs(a - b) for a, b in zip(lf, lt)),
        "max_rel_loss_diff_first_10_steps": max(rel[:10]),
        "first_step_rel_loss_diff_above_1e-4": above, "control": ctl,
        "losses": res["losses"], "op_profile_ms": prof, "train_wall_s": train_s,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "torch_ops_in_fused_model": sorted(FALLBACK),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
        print(f"wrote {args.json}")
    if args.plot:
        plot_losses(res["losses"], args.plot, f"{cfg.mixer}, {args.device} {args.dtype}")
    return summary


def plot_losses(losses: dict, path: str, title: str = "") -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("train_hybrid: --plot needs matplotlib (pip install matplotlib)")
        return
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    for name, label in (("fused", "fusedops"), ("torch", "plain PyTorch")):
        ax.plot(losses[name], label=label, lw=1.2, ls="-" if name == "fused" else "--")
    ax.set_ylabel("LM loss (nats/byte)")
    ax.set_title(f"hybrid LM: fusedops vs plain PyTorch ({title})")
    ax.legend()
    rel = [max(abs(a - b) / abs(b), 1e-9) for a, b in zip(losses["fused"], losses["torch"])]
    ax2.semilogy(rel, lw=1.0, color="k", label="fusedops vs plain")
    if "control" in losses:
        crel = [max(abs(a - b) / abs(b), 1e-9) for a, b in zip(losses["control"], losses["torch"])]
        ax2.semilogy(crel, lw=1.0, color="tab:red", alpha=0.7,
                     label="plain, weights x (1 + 1e-7 N(0,1)), vs plain")
        ax2.legend(fontsize=8)
    ax2.set_ylabel("|rel. difference|")
    ax2.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
