"""``KimiDeltaAttention``: flash-linear-attention 0.6.0's ``fla.layers.KimiDeltaAttention`` (Kimi
Linear's token mixer) on fusedops operators: the same constructor, parameters (names, shapes,
initialisation), forward and cache protocol, so FLA's state dicts and call sites carry over.

Per token: q, k, v projections, each through a causal short convolution with SiLU
(``ShortConvolution``); the per-channel gate ``g = -exp(A_log) softplus(f_proj(x) + dt_bias)``
(``lower_bound * sigmoid(exp(A_log) (f_proj(x) + dt_bias))`` with ``lower_bound``) and ``beta =
sigmoid(b_proj(x))`` (times 2 with ``allow_neg_eigval``), both computed inside the kernel;
``chunk_kda`` (training, prefill) or ``fused_recurrent_kda`` (inference on up to 64 tokens) with
q/k L2-normalised in the kernel; the output norm ``o_norm(o, g_proj(x))`` (RMSNorm then sigmoid
gate) and ``o_proj``.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn as nn
from torch import Tensor

from ..compat.fla.ops.kda import chunk_kda, fused_recurrent_kda
from ..nn import FusedRMSNormGated, ShortConvolution


def _unpad(x: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The valid rows of ``x [B, T, ...]`` packed into ``[1, N, ...]``, their flat indices and the
    ``cu_seqlens`` of the sequences (``attention_mask [B, T]``: 1 valid, 0 padding)."""
    flat = attention_mask.reshape(-1).bool()
    indices = torch.nonzero(flat).flatten()
    lengths = attention_mask.bool().sum(-1, dtype=torch.int32)
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    return x.flatten(0, 1).index_select(0, indices).unsqueeze(0), indices, cu_seqlens


def _repad(x: Tensor, indices: Tensor, batch: int, length: int) -> Tensor:
    out = x.new_zeros((batch * length,) + tuple(x.shape[2:]))
    return out.index_copy(0, indices, x[0]).unflatten(0, (batch, length))


class StateCache:
    """The per-layer state store FLA's layers read and write (``fla.models.utils.Cache``'s protocol
    for recurrent and convolution states): ``cache[layer_idx]`` is a dict with
    ``"recurrent_state"`` and ``"conv_state"``; ``update(recurrent_state=, conv_state=,
    layer_idx=, offset=)`` stores them and counts the tokens seen. FLA's own Cache works too."""

    def __init__(self) -> None:
        self.states: list[dict[str, Any]] = []
        self.seen_tokens = 0

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, layer_idx: int) -> dict[str, Any]:
        return self.states[layer_idx]

    def update(self, recurrent_state=None, conv_state=None, layer_idx: int = 0, offset: Optional[int] = 1,
               **kwargs) -> dict[str, Any]:
        offset = 1 if offset is None else offset
        if len(self.states) <= layer_idx:
            if layer_idx != len(self.states):
                raise IndexError(f"fusedops: StateCache: layer {layer_idx} updated before layer {len(self.states)}")
            self.states.append({"recurrent_state": None, "conv_state": None})
        if layer_idx == 0:
            self.seen_tokens += offset
        state = self.states[layer_idx]
        if recurrent_state is not None:
            state["recurrent_state"] = recurrent_state
        if conv_state is not None:
            state["conv_state"] = conv_state
        return state

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention, with ``fla.layers.KimiDeltaAttention``'s arguments:

    Args:
        hidden_size: model width (default 2048).
        expand_v: value head dim / key head dim (default 1).
        head_dim: key head dim K (default 128).
        num_heads: q/k heads H (default 16).
        num_v_heads: value heads HV (grouped values when > num_heads, a multiple of it; default
            num_heads).
        mode: ``"chunk"`` or ``"fused_recurrent"``: the kernel for inference calls on more than
            64 tokens (training always uses ``chunk``).
        use_short_conv: q/k/v short convolutions (default True; SiLU alone otherwise).
        allow_neg_eigval: beta = 2 sigmoid(b) (default False).
        safe_gate, lower_bound: the bounded gate ``lower_bound * sigmoid(...)``; ``safe_gate``
            also starts ``A_log`` at 0 (FLA's initialisation; the fusedops kernels need no other
            change for it).
        conv_size, conv_bias: of the short convolutions (default 4, False).
        layer_idx: index of the layer in a cache (needed with ``past_key_values``).
        norm_eps: of the output norm (default 1e-5).

    ``forward(hidden_states, attention_mask=None, past_key_values=None, use_cache=False,
    output_attentions=False, cu_seqlens=None)`` returns ``(o, None, past_key_values)``.
    ``attention_mask [B, T]`` (1 valid, 0 padding) packs the valid tokens into one varlen call;
    ``cu_seqlens`` (a ``[1, T]`` batch of packed sequences) is used as given. With a cache (any
    object with FLA's protocol, e.g. :class:`StateCache`) the call continues from the stored
    recurrent state (``[N, HV, V, K]``, value-first as FLA stores it) and convolution windows.
    """

    def __init__(self, hidden_size: int = 2048, expand_v: float = 1, head_dim: int = 128,
                 num_heads: int = 16, num_v_heads: Optional[int] = None, mode: str = "chunk",
                 use_short_conv: bool = True, allow_neg_eigval: bool = False, safe_gate: bool = False,
                 lower_bound: Optional[float] = None, conv_size: int = 4, conv_bias: bool = False,
                 layer_idx: Optional[int] = None, norm_eps: float = 1e-5, **kwargs) -> None:
        super().__init__()
        self.mode = mode
        self.allow_neg_eigval = allow_neg_eigval
        self.safe_gate = safe_gate
        self.lower_bound = lower_bound
        self.hidden_size = hidden_size
        self.expand_v = expand_v
        self.use_short_conv = use_short_conv
        self.conv_size = conv_size
        self.conv_bias = conv_bias
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads if num_v_heads is not None else num_heads
        self.head_k_dim = head_dim
        self.head_v_dim = int(head_dim * expand_v)
        self.key_dim = int(num_heads * self.head_k_dim)
        self.value_dim = int(self.num_v_heads * self.head_v_dim)
        self.layer_idx = layer_idx

        if not math.isclose(self.num_v_heads * head_dim * expand_v, self.value_dim, rel_tol=1e-5) or \
                not math.isclose(head_dim * expand_v, self.head_v_dim, rel_tol=1e-5):
            raise ValueError(f"fusedops: KimiDeltaAttention: expand_v={expand_v} times head_dim={head_dim} "
                             f"must be an integer")
        if self.num_v_heads % num_heads:
            raise ValueError(f"fusedops: KimiDeltaAttention: num_v_heads={self.num_v_heads} must be a "
                             f"multiple of num_heads={num_heads}")
        if mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"fusedops: KimiDeltaAttention: mode must be 'chunk' or 'fused_recurrent', "
                             f"got {mode!r}")

        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        if use_short_conv:
            self.q_conv1d = ShortConvolution(self.key_dim, conv_size, bias=conv_bias, activation="silu")
            self.k_conv1d = ShortConvolution(self.key_dim, conv_size, bias=conv_bias, activation="silu")
            self.v_conv1d = ShortConvolution(self.value_dim, conv_size, bias=conv_bias, activation="silu")

        self.gate_dim = int(self.num_v_heads * self.head_k_dim)
        self.f_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, self.gate_dim, bias=False))
        self.b_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False)
        if safe_gate:
            self.A_log = nn.Parameter(torch.zeros(self.num_v_heads, dtype=torch.float32))
        else:
            self.A_log = nn.Parameter(torch.log(torch.empty(self.num_v_heads, dtype=torch.float32).uniform_(1, 16)))
        self.A_log._no_weight_decay = True
        dt = torch.exp(torch.rand(self.gate_dim, dtype=torch.float32) * (math.log(0.1) - math.log(0.001))
                       + math.log(0.001)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        self.dt_bias._no_weight_decay = True
        self.g_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, self.value_dim, bias=True))
        self.o_norm = FusedRMSNormGated(self.head_v_dim, activation="sigmoid", eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def _layer_cache(self, past_key_values):
        if past_key_values is None:
            return None
        if self.layer_idx is None:
            raise ValueError("fusedops: KimiDeltaAttention: a cache (past_key_values) needs the layer's "
                             "layer_idx")
        return past_key_values[self.layer_idx] if len(past_key_values) > self.layer_idx else None

    def forward(self, hidden_states: Tensor, attention_mask: Optional[Tensor] = None, past_key_values=None,
                use_cache: Optional[bool] = False, output_attentions: Optional[bool] = False,
                **kwargs) -> tuple[Tensor, None, Any]:
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(f"fusedops: KimiDeltaAttention: attention_mask must be a [B, T] 0/1 padding "
                             f"mask, got shape {list(attention_mask.shape)}")
        batch, q_len, _ = hidden_states.shape
        if torch.is_grad_enabled():
            mode = "chunk"
        elif q_len <= 64 and not self.training:
            mode = "fused_recurrent"
        else:
            mode = self.mode
        if self.training and mode != "chunk":
            raise ValueError("fusedops: KimiDeltaAttention: only the chunk mode trains")

        last_state = self._layer_cache(past_key_values)
        cu_seqlens = kwargs.get("cu_seqlens")
        indices = None
        if cu_seqlens is None and attention_mask is not None:
            mask = attention_mask[:, -q_len:]
            hidden_states, indices, cu_seqlens = _unpad(hidden_states, mask)

        if self.use_short_conv:
            conv_q = conv_k = conv_v = None
            if last_state is not None:
                conv_q, conv_k, conv_v = last_state["conv_state"]
            q, conv_q = self.q_conv1d(x=self.q_proj(hidden_states), cache=conv_q, output_final_state=use_cache,
                                      cu_seqlens=cu_seqlens)
            k, conv_k = self.k_conv1d(x=self.k_proj(hidden_states), cache=conv_k, output_final_state=use_cache,
                                      cu_seqlens=cu_seqlens)
            v, conv_v = self.v_conv1d(x=self.v_proj(hidden_states), cache=conv_v, output_final_state=use_cache,
                                      cu_seqlens=cu_seqlens)
        else:
            q = torch.nn.functional.silu(self.q_proj(hidden_states))
            k = torch.nn.functional.silu(self.k_proj(hidden_states))
            v = torch.nn.functional.silu(self.v_proj(hidden_states))

        g = self.f_proj(hidden_states).unflatten(-1, (-1, self.head_k_dim))
        beta = self.b_proj(hidden_states)
        q = q.unflatten(-1, (-1, self.head_k_dim))
        k = k.unflatten(-1, (-1, self.head_k_dim))
        v = v.unflatten(-1, (-1, self.head_v_dim))

        recurrent_state = last_state["recurrent_state"] if last_state is not None else None
        common = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=self.A_log, dt_bias=self.dt_bias,
                      initial_state=recurrent_state, output_final_state=use_cache, use_qk_l2norm_in_kernel=True,
                      use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                      allow_neg_eigval=self.allow_neg_eigval, lower_bound=self.lower_bound, state_v_first=True,
                      cu_seqlens=cu_seqlens)
        if mode == "chunk":
            o, recurrent_state = chunk_kda(**common, safe_gate=self.safe_gate)
        else:
            o, recurrent_state = fused_recurrent_kda(**common)

        if past_key_values is not None:
            past_key_values.update(recurrent_state=recurrent_state,
                                   conv_state=(conv_q, conv_k, conv_v) if self.use_short_conv else None,
                                   layer_idx=self.layer_idx, offset=q_len)

        o = self.o_norm(o, self.g_proj(hidden_states).unflatten(-1, (-1, self.head_v_dim)))
        o = self.o_proj(o.flatten(-2))
        if indices is not None:
            o = _repad(o, indices, batch, q_len)
        return o, None, past_key_values
