"""What is swapped in each supported model family (the ``ModelSpec`` of every
``apply_fusedops_to_*``)."""

from __future__ import annotations

import functools
import importlib

from . import _kernels as K
from ._patching import ModelSpec, with_kernels


def when(switch: str, **attrs):
    """A swap that replaces ``attrs`` (usually ``forward``) while ``switch`` is on."""
    return lambda base, on: attrs if switch in on else None


def when_any(switches: tuple, **attrs):
    return lambda base, on: attrs if on & set(switches) else None


@functools.cache
def _slotted_forward(base: type, core: tuple, conv: bool):
    """``base.forward`` (transformers' code) with its kernel slots bound to fusedops."""
    modeling = importlib.import_module(base.__module__)
    slots = dict(core)
    if conv:
        slots.update(_conv_slots(modeling))
    return with_kernels(base.forward, slots)


@functools.cache
def _conv_slots(modeling):
    return K.conv_slots(modeling)


def linear_attention_layer(**core):
    """A linear-attention layer whose forward stays transformers' own, with the recurrent core
    (``linear_attention``) and the short convolution (``conv``) kernel slots bound to fusedops."""
    core_items = tuple(sorted(core.items()))

    def build(base, on):
        use_core, use_conv = "linear_attention" in on, "conv" in on
        if not (use_core or use_conv):
            return None
        return {"forward": _slotted_forward(base, core_items if use_core else (), use_conv)}

    return build


@functools.cache
def _lm_forward(output_cls_path: str, router_logits: bool, aux_loss: bool):
    module, name = output_cls_path.rsplit(".", 1)
    return K.causal_lm_forward(getattr(importlib.import_module(module), name), router_logits, aux_loss)


def lm_head(output_cls: str, router_logits: bool = False, aux_loss: bool = False):
    """``XForCausalLM.forward`` with the LM head + loss through ``chunk_loss``."""
    path = f"transformers.modeling_outputs.{output_cls}"
    return lambda base, on: {"forward": _lm_forward(path, router_logits, aux_loss)} if "loss" in on else None


_GDN = dict(torch_chunk_gated_delta_rule=K.gdn_chunk, torch_recurrent_gated_delta_rule=K.gdn_recurrent)
_KDA = dict(chunk_kimi_delta_attention=K.kda_chunk, recurrent_kimi_delta_attention=K.kda_recurrent)
_LINEAR = ("linear_attention", "conv")

QWEN3_NEXT = ModelSpec(
    name="qwen3_next",
    model_types=("qwen3_next",),
    module="transformers.models.qwen3_next.modeling_qwen3_next",
    pretrained="Qwen3NextPreTrainedModel",
    switches=("linear_attention", "conv", "norm", "experts", "loss"),
    swaps={
        "Qwen3NextGatedDeltaNet": linear_attention_layer(**_GDN),
        "Qwen3NextModel": when_any(_LINEAR, forward=K.packed_model_forward),
        "Qwen3NextRMSNorm": when("norm", forward=K.zero_centered_rmsnorm_forward),
        "Qwen3NextRMSNormGated": when("norm", forward=K.gated_rmsnorm_forward),
        "Qwen3NextForCausalLM": lm_head("MoeCausalLMOutputWithPast", router_logits=True, aux_loss=True),
    },
    experts={"Qwen3NextExperts": K.silu_gate},
)

QWEN3_5 = ModelSpec(
    name="qwen3_5",
    model_types=("qwen3_5_text", "qwen3_5"),
    module="transformers.models.qwen3_5.modeling_qwen3_5",
    pretrained="Qwen3_5PreTrainedModel",
    switches=("linear_attention", "conv", "norm", "loss"),
    swaps={
        "Qwen3_5GatedDeltaNet": linear_attention_layer(**_GDN),
        "Qwen3_5TextModel": when_any(_LINEAR, forward=K.packed_model_forward),
        "Qwen3_5RMSNorm": when("norm", forward=K.zero_centered_rmsnorm_forward),
        "Qwen3_5RMSNormGated": when("norm", forward=K.gated_rmsnorm_forward),
        "Qwen3_5ForCausalLM": lm_head("CausalLMOutputWithPast"),
    },
)

DEEPSEEK_V4 = ModelSpec(
    name="deepseek_v4",
    model_types=("deepseek_v4",),
    module="transformers.models.deepseek_v4.modeling_deepseek_v4",
    pretrained="DeepseekV4PreTrainedModel",
    switches=("hyper_connections", "norm", "experts", "loss"),
    swaps={
        "DeepseekV4HyperConnection": when("hyper_connections", forward=K.hyper_connection_forward),
        "DeepseekV4HyperHead": when("hyper_connections", forward=K.hyper_head_forward),
        "DeepseekV4DecoderLayer": when("hyper_connections", forward=K.deepseek_v4_decoder_forward),
        "DeepseekV4RMSNorm": when("norm", forward=K.rmsnorm_forward),
        "DeepseekV4UnweightedRMSNorm": when("norm", forward=K.unweighted_rmsnorm_forward),
        "DeepseekV4ForCausalLM": lm_head("MoeCausalLMOutputWithPast", router_logits=True, aux_loss=True),
    },
    experts={"DeepseekV4Experts": K.clamped_silu_gate},
)

GPT_OSS = ModelSpec(
    name="gpt_oss",
    model_types=("gpt_oss",),
    module="transformers.models.gpt_oss.modeling_gpt_oss",
    pretrained="GptOssPreTrainedModel",
    switches=("norm", "experts", "loss"),
    swaps={
        "GptOssRMSNorm": when("norm", forward=K.rmsnorm_forward),
        "GptOssForCausalLM": lm_head("MoeCausalLMOutputWithPast", router_logits=True, aux_loss=True),
    },
    experts={"GptOssExperts": K.gpt_oss_gate},
)

LLAMA = ModelSpec(
    name="llama",
    model_types=("llama",),
    module="transformers.models.llama.modeling_llama",
    pretrained="LlamaPreTrainedModel",
    switches=("norm", "loss"),
    swaps={
        "LlamaRMSNorm": when("norm", forward=K.rmsnorm_forward),
        "LlamaForCausalLM": lm_head("CausalLMOutputWithPast"),
    },
)

QWEN3 = ModelSpec(
    name="qwen3",
    model_types=("qwen3",),
    module="transformers.models.qwen3.modeling_qwen3",
    pretrained="Qwen3PreTrainedModel",
    switches=("norm", "loss"),
    swaps={
        "Qwen3RMSNorm": when("norm", forward=K.rmsnorm_forward),
        "Qwen3ForCausalLM": lm_head("CausalLMOutputWithPast"),
    },
)

KIMI_LINEAR = ModelSpec(
    name="kimi_linear",
    model_types=("kimi_linear",),
    module="transformers.models.kimi_linear.modeling_kimi_linear",
    pretrained="KimiLinearPreTrainedModel",
    switches=("linear_attention", "conv", "norm", "experts", "loss"),
    swaps={
        "KimiLinearDeltaAttention": linear_attention_layer(**_KDA),
        "KimiLinearModel": when_any(_LINEAR, forward=K.packed_model_forward),
        "KimiLinearRMSNorm": when("norm", forward=K.rmsnorm_forward),
        "KimiLinearRMSNormGated": when("norm", forward=K.gated_rmsnorm_forward),
        "KimiLinearForCausalLM": lm_head("MoeCausalLMOutputWithPast", router_logits=True),
    },
    experts={"KimiLinearExperts": K.silu_gate},
)

SPECS = {s.name: s for s in (QWEN3_NEXT, QWEN3_5, DEEPSEEK_V4, GPT_OSS, LLAMA, QWEN3, KIMI_LINEAR)}
BY_MODEL_TYPE = {t: s for s in SPECS.values() for t in s.model_types}
