"""fusedops inside Hugging Face transformers models, in one call.

    from transformers import AutoModelForCausalLM
    from fusedops.transformers import apply_fusedops

    model = AutoModelForCausalLM.from_config(config)
    apply_fusedops(model)                       # picks the family from config.model_type

or ``apply_fusedops_to_qwen3_next(model=model, conv=False)`` for chosen switches, or
``apply_fusedops_to_qwen3_next()`` before any model is built (every model of the family built
afterwards gets it), or ``AutoFusedopsModelForCausalLM.from_pretrained(...)``.
:func:`revert_fusedops` undoes it. docs/integration.md lists what is swapped in each family and
through which transformers extension point.

Needs transformers 5.23.x (``pip install 'fusedops[transformers]'``).
"""

from __future__ import annotations

import inspect
from typing import Optional

from ._version import SUPPORTED_RANGE, check_transformers

check_transformers()

from . import _patching  # noqa: E402
from ._models import BY_MODEL_TYPE, SPECS  # noqa: E402

__all__ = [
    "SUPPORTED_RANGE",
    "SUPPORTED_MODEL_TYPES",
    "apply_fusedops",
    "apply_fusedops_to_qwen3_next",
    "apply_fusedops_to_qwen3_5",
    "apply_fusedops_to_deepseek_v4",
    "apply_fusedops_to_gpt_oss",
    "apply_fusedops_to_llama",
    "apply_fusedops_to_qwen3",
    "apply_fusedops_to_kimi_linear",
    "revert_fusedops",
    "AutoFusedopsModelForCausalLM",
]

SUPPORTED_MODEL_TYPES = tuple(sorted(BY_MODEL_TYPE))


def apply_fusedops_to_qwen3_next(linear_attention: bool = True, conv: bool = True, norm: bool = True,
                                 experts: bool = True, loss: bool = True, model=None):
    """Qwen3-Next: the gated-delta-rule core (``chunk_gated_delta_rule`` for training and
    prefill, ``fused_recurrent_gated_delta_rule`` for one-token decoding, q/k l2norm in the
    kernel), the short convolution (``causal_conv1d``, one-step update when decoding), packed
    sequences kept apart, the zero-centred ``(1 + w)`` RMSNorm and the gated RMSNorm
    (``rms_norm_gated``), the experts (``sort_chunks_by_idx`` + ``clipped_swiglu``) and the LM head
    + loss (``chunk_loss``). Returns ``model`` (None when patching the classes)."""
    return _patching.apply(SPECS["qwen3_next"], dict(linear_attention=linear_attention, conv=conv,
                                                     norm=norm, experts=experts, loss=loss), model)


def apply_fusedops_to_qwen3_5(linear_attention: bool = True, conv: bool = True, norm: bool = True,
                              loss: bool = True, model=None):
    """Qwen3.5 (``qwen3_5_text``; the language model of ``qwen3_5``): as Qwen3-Next without
    experts (the dense MLP stays). The LM head + loss applies to ``Qwen3_5ForCausalLM``."""
    return _patching.apply(SPECS["qwen3_5"], dict(linear_attention=linear_attention, conv=conv,
                                                  norm=norm, loss=loss), model)


def apply_fusedops_to_deepseek_v4(hyper_connections: bool = True, norm: bool = True,
                                  experts: bool = True, loss: bool = True, model=None):
    """DeepSeek-V4: the manifold-constrained hyper-connections (``rmsnorm_without_weight``,
    ``hc_split_sinkhorn`` with DeepSeek's Sinkhorn schedule, ``mhc_pre_bmm``, ``mhc_post``, the
    head's ``hc_head_split``), the unweighted and weighted RMSNorms, the clamped-SwiGLU
    experts (``sort_chunks_by_idx`` + ``clipped_swiglu``) and the LM head + loss."""
    return _patching.apply(SPECS["deepseek_v4"], dict(hyper_connections=hyper_connections, norm=norm,
                                                      experts=experts, loss=loss), model)


def apply_fusedops_to_gpt_oss(norm: bool = True, experts: bool = True, loss: bool = True, model=None):
    """GPT-OSS: RMSNorm, the experts (interleaved, clamped ``clipped_swiglu`` with alpha and the
    ``+1``, rows grouped by ``sort_chunks_by_idx``) and the LM head + loss."""
    return _patching.apply(SPECS["gpt_oss"], dict(norm=norm, experts=experts, loss=loss), model)


def apply_fusedops_to_llama(norm: bool = True, loss: bool = True, model=None):
    """Llama: RMSNorm and the LM head + loss."""
    return _patching.apply(SPECS["llama"], dict(norm=norm, loss=loss), model)


def apply_fusedops_to_qwen3(norm: bool = True, loss: bool = True, model=None):
    """Qwen3: RMSNorm (also q_norm / k_norm) and the LM head + loss."""
    return _patching.apply(SPECS["qwen3"], dict(norm=norm, loss=loss), model)


def apply_fusedops_to_kimi_linear(linear_attention: bool = True, conv: bool = True, norm: bool = True,
                                  experts: bool = True, loss: bool = True, model=None):
    """Kimi-Linear: the KDA core (``chunk_kda`` / ``fused_recurrent_kda``), the short
    convolution, packed sequences kept apart, RMSNorm and the sigmoid-gated RMSNorm, the experts
    and the LM head + loss."""
    return _patching.apply(SPECS["kimi_linear"], dict(linear_attention=linear_attention, conv=conv,
                                                      norm=norm, experts=experts, loss=loss), model)


_APPLY = {
    "qwen3_next": apply_fusedops_to_qwen3_next,
    "qwen3_5": apply_fusedops_to_qwen3_5,
    "deepseek_v4": apply_fusedops_to_deepseek_v4,
    "gpt_oss": apply_fusedops_to_gpt_oss,
    "llama": apply_fusedops_to_llama,
    "qwen3": apply_fusedops_to_qwen3,
    "kimi_linear": apply_fusedops_to_kimi_linear,
}


def _apply_function(model_type):
    spec = BY_MODEL_TYPE.get(model_type)
    if spec is None:
        raise ValueError(f"fusedops.transformers: no fusedops integration for model_type "
                         f"{model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    return _APPLY[spec.name]


def _split_switches(fn, kwargs: dict) -> dict:
    names = set(inspect.signature(fn).parameters) - {"model"}
    return {k: kwargs.pop(k) for k in list(kwargs) if k in names}


def apply_fusedops(model, **switches):
    """Apply the integration of ``model.config.model_type`` to ``model`` (switches as the
    family's ``apply_fusedops_to_*`` takes them; a switch the family does not have is an
    error). Raises ValueError listing the supported model types otherwise. Returns ``model``."""
    config = getattr(model, "config", None)
    fn = _apply_function(getattr(config, "model_type", None))
    names = [p for p in inspect.signature(fn).parameters if p != "model"]
    for name in switches:
        if name not in names:
            raise TypeError(f"fusedops.transformers: {fn.__name__} has no switch {name!r}; its switches: "
                            f"{', '.join(names)}")
    return fn(model=model, **switches)


def revert_fusedops(model=None) -> None:
    """Undo the integration: on ``model``, its modules get their transformers classes back and
    its experts the implementation they had; without a model, the construction hooks that
    ``apply_fusedops_to_*()`` installed are removed (models already built keep theirs)."""
    if model is None:
        _patching.remove_hooks()
    else:
        _patching.revert_model(model)


class AutoFusedopsModelForCausalLM:
    """``AutoModelForCausalLM`` whose models come out with fusedops applied. Keyword arguments
    that name a switch of the family (``loss=False``, ...) go to its ``apply_fusedops_to_*``,
    the rest to transformers."""

    @classmethod
    def from_config(cls, config, **kwargs):
        from transformers import AutoModelForCausalLM

        switches = _split_switches(_apply_function(getattr(config, "model_type", None)), kwargs)
        return apply_fusedops(AutoModelForCausalLM.from_config(config, **kwargs), **switches)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config: Optional[object] = None,
                        **kwargs):
        from transformers import AutoConfig, AutoModelForCausalLM

        if config is None:
            hub = {k: kwargs[k] for k in ("revision", "trust_remote_code", "token", "cache_dir",
                                           "local_files_only", "subfolder") if k in kwargs}
            config = AutoConfig.from_pretrained(pretrained_model_name_or_path, **hub)
        switches = _split_switches(_apply_function(getattr(config, "model_type", None)), kwargs)
        model = AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path, *model_args,
                                                     config=config, **kwargs)
        return apply_fusedops(model, **switches)
