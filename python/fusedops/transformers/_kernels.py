"""The fusedops code that goes into transformers models: kernel-slot functions, module forwards,
the experts implementation and the LM head + loss.

Every forward here follows the transformers forward it replaces in its dtype policy (what is
computed in float32 there is computed in float32 here), so a patched model differs from the
original only by the operators' own rounding.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

import fusedops
from fusedops.compat.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from fusedops.compat.fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from fusedops.compat.fla.ops.kda import chunk_kda, fused_recurrent_kda
from fusedops.ops.sort_chunks import sort_chunks_by_idx_with_map, sort_chunks_by_map

# ---------------------------------------------------------------------------------------------
# Packed sequences


def packed_cu_seqlens(position_ids: Optional[Tensor]) -> Optional[Tensor]:
    """int32 ``cu_seqlens`` of a packed batch ``[1, T]`` whose position ids restart (each
    sequence counts 0, 1, ...), None when there is one sequence."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    p = position_ids[0]
    starts = torch.nonzero(p[1:] != p[:-1] + 1).flatten() + 1
    if starts.numel() == 0:
        return None
    return torch.cat([starts.new_zeros(1), starts, starts.new_tensor([p.numel()])]).to(torch.int32)


def _seqlens(cu_seqlens: Optional[Tensor], kwargs: dict) -> Optional[Tensor]:
    """The packed-sequence offsets a transformers layer was given: ``cu_seqlens`` (what the
    gated-delta-rule layers pass) or the ``cu_seq_lens_q`` of its keyword arguments (HF's
    collators and :func:`packed_model_forward`)."""
    return cu_seqlens if cu_seqlens is not None else kwargs.get("cu_seq_lens_q")


def packed_model_forward(self, input_ids=None, attention_mask=None, position_ids=None,
                         past_key_values=None, inputs_embeds=None, use_cache=None, **kwargs):
    """The base model's forward with packed sequences made explicit: when position ids restart
    inside a ``[1, T]`` batch under the conditions in which transformers' own attention mask
    treats it as packed (no attention mask, no cache), ``cu_seq_lens_q/k`` and ``max_length_q/k``
    are added to the keyword arguments that reach every layer, so the linear-attention cores
    and short convolutions keep the sequences apart."""
    if kwargs.get("cu_seq_lens_q") is None and attention_mask is None and past_key_values is None:
        cache = self.config.use_cache if use_cache is None else use_cache
        if self.training and getattr(self, "gradient_checkpointing", False):
            cache = False
        cu = None if cache else packed_cu_seqlens(position_ids)
        if cu is not None:
            longest = int((cu[1:] - cu[:-1]).max())
            kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    return type(self)._fusedops_base.forward(
        self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)


# ---------------------------------------------------------------------------------------------
# Kernel slots: the module-level functions transformers' linear-attention layers call
# (`use_kernel_func_from_hub_with_fallback` fills them with FLA / causal_conv1d when installed).


def _state_for(q: Tensor, state: Optional[Tensor]) -> Optional[Tensor]:
    """KDA keeps its state in float32 (float64 for float64 inputs); transformers' Kimi-Linear
    cache stores it in float32."""
    if state is None:
        return None
    return state.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


def _core_slot(slot: str, op, state_to_op_dtype: bool = False):
    """transformers' ``slot`` (the linear-attention core a layer calls) -> the fusedops function
    ``op()`` returns (its flash-linear-attention call form; looked up at each call), with
    transformers' packed-sequence keyword arguments turned into ``cu_seqlens``."""

    def core(query, key, value, g, beta, initial_state=None, output_final_state=False,
             use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
        if state_to_op_dtype:
            initial_state = _state_for(query, initial_state)
        return op()(query, key, value, g=g, beta=beta, initial_state=initial_state,
                    output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                    cu_seqlens=_seqlens(cu_seqlens, kwargs))

    core.__name__ = core.__qualname__ = f"fusedops_{slot}"
    core.__doc__ = f"``{slot}`` -> ``{op().__name__}``."
    return core


gdn_chunk = _core_slot("torch_chunk_gated_delta_rule", lambda: chunk_gated_delta_rule)
gdn_recurrent = _core_slot("torch_recurrent_gated_delta_rule", lambda: fused_recurrent_gated_delta_rule)
kda_chunk = _core_slot("chunk_kimi_delta_attention", lambda: chunk_kda, state_to_op_dtype=True)
kda_recurrent = _core_slot("recurrent_kimi_delta_attention", lambda: fused_recurrent_kda, state_to_op_dtype=True)


_CONV_ACTIVATIONS = (None, "silu", "swish")


def conv_slots(modeling) -> dict:
    """``causal_conv1d_fn`` / ``causal_conv1d_update`` of a modeling module -> fusedops (the
    causal_conv1d package's call forms). transformers' own functions stay in use for an
    activation the operator does not have."""
    torch_fn, torch_update = modeling.causal_conv1d_fn, modeling.causal_conv1d_update

    def conv_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        if activation not in _CONV_ACTIVATIONS:
            return torch_fn(hidden_states, weight, bias, activation=activation, **kwargs)
        seq_idx = kwargs.get("seq_idx")
        cu = kwargs.get("cu_seq_lens_q")
        if seq_idx is None and cu is not None:
            B, _, T = hidden_states.shape
            extra = T - int(cu[-1])
            if B != 1 or extra < 0:
                raise ValueError(f"fusedops: causal_conv1d_fn: packed sequences (cu_seq_lens_q) need "
                                 f"x of shape [1, D, T >= {int(cu[-1])}], got {list(hidden_states.shape)}")
            # Tokens in front of the packed ones (a cached conv state transformers prepends) are
            # the left context of the first sequence.
            lengths = torch.diff(cu.to(torch.int64))
            lengths[0] += extra
            seq_idx = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device,
                                                           dtype=torch.int32), lengths)[None]
        return causal_conv1d_fn(hidden_states, weight, bias, seq_idx=seq_idx, activation=activation)

    def conv_update(hidden_states, conv_state, weight, bias=None, activation=None, **kwargs):
        if activation not in _CONV_ACTIVATIONS:
            return torch_update(hidden_states, conv_state, weight, bias, activation)
        return causal_conv1d_update(hidden_states, conv_state, weight, bias, activation)

    return {"causal_conv1d_fn": conv_fn, "causal_conv1d_update": conv_update}


# ---------------------------------------------------------------------------------------------
# Norms


def rmsnorm_forward(self, hidden_states: Tensor) -> Tensor:
    """``x * r * weight`` (Llama, Qwen3, GPT-OSS, DeepSeek-V4, Kimi-Linear RMSNorm)."""
    return fusedops.rms_norm_gated(hidden_states, None, self.weight, None, eps=self.variance_epsilon)


def zero_centered_rmsnorm_forward(self, x: Tensor) -> Tensor:
    """``x * r * (1 + weight)`` in float32 (Qwen3-Next / Qwen3.5 RMSNorm)."""
    return fusedops.rms_norm_gated(x, None, 1.0 + self.weight.float(), None, eps=self.eps)


def gated_rmsnorm_forward(self, hidden_states: Tensor, gate: Tensor = None) -> Tensor:
    """``x * r * weight * act(gate)``, norm before gate (Qwen3-Next / Qwen3.5 silu,
    Kimi-Linear sigmoid)."""
    return fusedops.rms_norm_gated(hidden_states, gate, self.weight, None, eps=self.variance_epsilon,
                                   norm_before_gate=True, activation=self.activation)


def unweighted_rmsnorm_forward(self, x: Tensor) -> Tensor:
    """``x * r`` with r in float32 cast to x's dtype (DeepSeek-V4 ``UnweightedRMSNorm``)."""
    return x * fusedops.rmsnorm_without_weight(x, self.eps)


# ---------------------------------------------------------------------------------------------
# DeepSeek-V4 manifold-constrained hyper-connections


def hyper_connection_forward(self, hidden_streams: Tensor):
    """(post, comb, collapsed) of ``DeepseekV4HyperConnection``: the norm factor of the flattened
    streams (``rmsnorm_without_weight``, applied after the projection, where it commutes), the
    fused pre/post/Sinkhorn split (``hc_split_sinkhorn``, DeepSeek's Sinkhorn schedule) and the
    pre-mix (``mhc_pre_bmm``)."""
    B, S = hidden_streams.shape[:2]
    flat = hidden_streams.view(B, S, -1).float()
    mixes = F.linear(flat, self.fn.float()) * fusedops.rmsnorm_without_weight(flat, self.input_norm.eps)
    pre, post, comb = fusedops.hc_split_sinkhorn(mixes, self.scale, self.base, self.hc_mult,
                                                 self.hc_sinkhorn_iters, self.hc_eps, variant="deepseek")
    collapsed = fusedops.mhc_pre_bmm(pre, hidden_streams, out_dtype=hidden_streams.dtype)
    return post, comb, collapsed


def hyper_head_forward(self, x: Tensor) -> Tensor:
    """``DeepseekV4HyperHead``: the final collapse of the streams (``hc_head_split``,
    ``mhc_pre_bmm``)."""
    flat = x.flatten(2).float()
    mixes = F.linear(flat, self.hc_fn.float()) * fusedops.rmsnorm_without_weight(flat, self.input_norm.eps)
    pre = fusedops.hc_head_split(mixes, self.hc_scale, self.hc_base, self.eps)
    return fusedops.mhc_pre_bmm(pre, x, out_dtype=x.dtype)


def deepseek_v4_decoder_forward(self, hidden_states: Tensor, input_ids: Optional[Tensor] = None,
                                **kwargs) -> Tensor:
    """``DeepseekV4DecoderLayer`` with the post-mix ``X' = post f^T + comb^T X`` through
    ``mhc_post`` (fp32 accumulation)."""
    post, comb, collapsed = self.attn_hc(hidden_states)
    attn_output, _ = self.self_attn(self.input_layernorm(collapsed), **kwargs)
    hidden_states = fusedops.mhc_post(hidden_states, comb, attn_output, post)
    post, comb, collapsed = self.ffn_hc(hidden_states)
    mlp_output = self.mlp(self.post_attention_layernorm(collapsed), input_ids=input_ids)
    return fusedops.mhc_post(hidden_states, comb, mlp_output, post)


# ---------------------------------------------------------------------------------------------
# MoE experts: transformers' experts registry entry "fusedops"

# experts class -> gate(experts module) -> clipped_swiglu keyword arguments, or None when the
# module's gate has no clipped_swiglu form (transformers' grouped_mm path then runs it).
EXPERT_GATES: dict = {}
_FLT_MAX = float(torch.finfo(torch.float32).max)


def silu_gate(experts) -> Optional[dict]:
    """``act(gate) * up`` on concatenated halves with act = silu: clipped_swiglu with alpha 1,
    bias 0 and no clipping."""
    act = getattr(getattr(experts, "config", None), "hidden_act", None)
    if act not in ("silu", "swish"):
        return None
    return dict(alpha=1.0, limit=_FLT_MAX, bias=0.0, interleaved=False)


def clamped_silu_gate(experts) -> Optional[dict]:
    """DeepSeek-V4: ``silu(gate.clamp(max=l)) * up.clamp(-l, l)``."""
    gate = silu_gate(experts)
    return None if gate is None else dict(gate, limit=float(experts.limit))


def gpt_oss_gate(experts) -> dict:
    """GPT-OSS: interleaved halves, ``g * sigmoid(alpha g) * (u + 1)`` after the clamps."""
    return dict(alpha=float(experts.alpha), limit=float(experts.limit), bias=1.0, interleaved=True)


def _grouped(x: Tensor, weight: Tensor, offsets: Tensor, bias: Optional[Tensor], transposed: bool):
    """One GEMM per expert over its rows: transformers' ``_grouped_linear`` (torch grouped_mm
    where it exists), or its per-expert loop for the dtypes grouped_mm lacks (float64)."""
    from transformers.integrations.moe import _grouped_linear

    if x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return _grouped_linear(x, weight, offsets, bias=bias, is_transposed=transposed)
    w = weight if transposed else weight.transpose(-2, -1)
    out = torch.ops.transformers.grouped_mm_fallback(x, w, offsets)
    return out if bias is None else out + bias


def experts_forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
    """transformers' ``grouped_mm`` experts path with the (token, slot) rows grouped by expert
    through ``sort_chunks_by_idx`` (one row per chunk, stable expert order; its row map brings
    them back) and the gated activation through ``clipped_swiglu`` over all experts' rows."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    base = getattr(type(self), "_fusedops_base", type(self))
    gate_of = EXPERT_GATES.get(base)
    gate = gate_of(self) if gate_of is not None else None
    if gate is None or not self.has_gate or self._is_expert_parallel or self.has_post_expert_norm:
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    N, k = top_k_index.shape
    H = hidden_states.shape[-1]
    expert_ids = top_k_index.reshape(-1)
    order = torch.argsort(expert_ids, stable=True)
    rows = hidden_states.repeat_interleave(k, dim=0)
    grouped, _, row_map = sort_chunks_by_idx_with_map(rows, torch.ones_like(order), order)
    ids_sorted = expert_ids[order]
    # histc, as transformers: no device synchronisation (float on the CPU, int on CUDA).
    counts_in = ids_sorted.float() if ids_sorted.device.type in ("cpu", "mps") else ids_sorted.int()
    counts = torch.histc(counts_in, bins=self.num_experts, min=0, max=self.num_experts - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    bias_up = self.gate_up_proj_bias[ids_sorted] if self.has_bias else None
    h = _grouped(grouped, self.gate_up_proj, offsets, bias_up, self.is_transposed)
    h = fusedops.clipped_swiglu(h, **gate)
    bias_down = self.down_proj_bias[ids_sorted] if self.has_bias else None
    y = _grouped(h, self.down_proj, offsets, bias_down, self.is_transposed)
    y = sort_chunks_by_map(y, row_map, None, y.shape[0], H, False)[0]
    y = y.view(N, k, H) * top_k_weights.unsqueeze(-1)
    return y.sum(dim=1).to(hidden_states.dtype)


def register_experts() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if ALL_EXPERTS_FUNCTIONS.get("fusedops") is not experts_forward:
        ALL_EXPERTS_FUNCTIONS.register("fusedops", experts_forward)


# ---------------------------------------------------------------------------------------------
# LM head + loss


def lm_loss(hidden: Tensor, weight: Tensor, labels: Optional[Tensor], shift_labels: Optional[Tensor],
            ignore_index: int = -100, num_items_in_batch=None) -> Tensor:
    """transformers' ``ForCausalLMLoss`` without logits: labels shifted left (unless
    ``shift_labels`` are given), mean over the non-ignored tokens, or their sum divided by
    ``num_items_in_batch`` (gradient accumulation)."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    h = hidden.reshape(-1, hidden.shape[-1])
    if h.dtype != weight.dtype:
        h = h.to(weight.dtype)
    lab = shift_labels.reshape(-1).to(h.device)
    if num_items_in_batch is None:
        return fusedops.chunk_loss(h, weight, lab, reduction="mean", ignore_index=ignore_index)
    loss = fusedops.chunk_loss(h, weight, lab, reduction="sum", ignore_index=ignore_index)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def causal_lm_forward(output_cls, router_logits: bool, aux_loss: bool):
    """The ``XForCausalLM.forward`` of a model family with the LM head and loss through
    ``chunk_loss``: no ``[tokens, vocab]`` logits exist when a training step computes its loss.

    ``labels`` / ``shift_labels`` / ``ignore_index`` / ``num_items_in_batch`` as in
    transformers' ``ForCausalLMLoss``; the loss covers every position whatever
    ``logits_to_keep``. Logits (of the ``logits_to_keep`` positions) are returned when no loss
    is computed, in eval mode, or when ``return_logits=True`` is passed; ``return_logits=False``
    never computes them. ``router_logits`` / ``aux_loss``: the MoE outputs and the
    load-balancing term of the family (added to the loss as transformers does).
    """
    from transformers.modeling_utils import slice_logits_to_keep
    from transformers.utils import can_return_tuple

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        return_logits = kwargs.pop("return_logits", None)
        output_router = None
        if aux_loss:
            output_router = kwargs.pop("output_router_logits", None)
            if output_router is None:
                output_router = self.config.output_router_logits
            kwargs["output_router_logits"] = output_router
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, past_key_values=past_key_values,
                             inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        hidden = outputs.last_hidden_state
        shift_labels = kwargs.get("shift_labels")
        loss = None
        if labels is not None or shift_labels is not None:
            loss = lm_loss(hidden, self.lm_head.weight, labels, shift_labels,
                           kwargs.get("ignore_index", -100), kwargs.get("num_items_in_batch"))
        if return_logits is None:
            return_logits = loss is None or not self.training
        logits = self.lm_head(slice_logits_to_keep(hidden, logits_to_keep)) if return_logits else None
        extra = {}
        if router_logits:
            extra["router_logits"] = outputs.router_logits
        if aux_loss:
            aux = None
            if output_router:
                modeling = importlib.import_module(type(self).__module__)
                aux = modeling.load_balancing_loss_func(outputs.router_logits, self.num_experts,
                                                        self.num_experts_per_tok, attention_mask)
                if loss is not None:
                    loss = loss + self.router_aux_loss_coef * aux.to(loss.device)
            extra["aux_loss"] = aux
        return output_cls(loss=loss, logits=logits, past_key_values=outputs.past_key_values,
                          hidden_states=outputs.hidden_states, attentions=outputs.attentions, **extra)

    return can_return_tuple(forward)
