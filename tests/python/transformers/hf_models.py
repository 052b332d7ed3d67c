"""Shared helpers of the fusedops.transformers tests (CPU, no downloads); imported by each test module.

* ``tiny_config(family)``: a random-init config of every supported family (hidden 32, 2-4
  layers mixing linear- and full-attention layers, 4 experts where the family has experts);
* ``build(family, dtype)``: the transformers model with every parameter perturbed (so that zero
  or one initialisations do not hide a term), and ``fused(model)``: a deep copy with fusedops;
* ``float64_oracle()``: inside it a float64 model runs in float64 everywhere (transformers
  computes norms, gates, rotary tables and the gated delta rule in float32 whatever the
  model's dtype: its float32 casts of float64 tensors become no-ops) and fusedops uses its
  float64 reference backend. This makes the float64 runs of both models exact oracles of
  their math.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip(
    "transformers", reason="the fusedops.transformers tests need transformers (pip install 'fusedops[transformers]')")
if not hasattr(transformers, "__version__"):
    pytest.skip("transformers is not installed", allow_module_level=True)

import fusedops  # noqa: E402
import fusedops.transformers as ft  # noqa: E402
from fusedops.transformers import _kernels as kernels  # noqa: E402,F401  (for the tests)
from fusedops.transformers import _version  # noqa: E402,F401

FAMILIES = ("qwen3_next", "qwen3_5", "deepseek_v4", "gpt_oss", "llama", "qwen3", "kimi_linear")
LINEAR_ATTENTION = ("qwen3_next", "qwen3_5", "kimi_linear")
VOCAB = 96


def tiny_config(family: str):
    T = transformers
    common = dict(vocab_size=VOCAB, hidden_size=32, max_position_embeddings=256, initializer_range=0.2,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    hybrid = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    if family == "qwen3_next":
        return T.Qwen3NextConfig(
            **common, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=16, shared_expert_intermediate_size=16, decoder_sparse_step=1,
            layer_types=hybrid)
    if family == "qwen3_5":
        return T.Qwen3_5TextConfig(
            **common, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=8, linear_conv_kernel_dim=4, layer_types=hybrid)
    if family == "deepseek_v4":
        return T.DeepseekV4Config(
            **common, moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, q_lora_rank=16, num_experts_per_tok=2, n_routed_experts=4, hc_mult=4, hc_sinkhorn_iters=20,
            o_groups=2, o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4, sliding_window=8,
            partial_rotary_factor=0.5, layer_types=["sliding_attention", "compressed_sparse_attention"],
            mlp_layer_types=["hash_moe", "moe"])
    if family == "gpt_oss":
        return T.GptOssConfig(
            **common, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"])
    if family == "llama":
        return T.LlamaConfig(**common, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1)
    if family == "qwen3":
        return T.Qwen3Config(**common, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=16)
    if family == "kimi_linear":
        return T.KimiLinearConfig(
            **common, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=4, num_attention_heads=2,
            num_key_value_heads=2, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
            num_local_experts=4, num_experts_per_tok=2, linear_head_dim=16, linear_num_heads=2,
            layer_types=hybrid, mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
    raise ValueError(family)


def build(family: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    """transformers' model of ``family`` (its own code), parameters perturbed, in ``dtype``."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.1)
        for m in model.modules():
            if hasattr(m, "tid2eid"):  # DeepSeek-V4 hash routing: distinct experts per token
                E = m.num_experts
                m.tid2eid.copy_(torch.argsort(torch.rand(m.tid2eid.shape[0], E, generator=g), -1)[:, :m.top_k])
    model = model.to(dtype)
    if dtype == torch.float64:
        model.set_experts_implementation("eager")  # torch's grouped_mm has no float64
    return model


def fused(model, **switches):
    """A deep copy of ``model`` with fusedops applied."""
    return ft.apply_fusedops(copy.deepcopy(model), **switches)


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


@contextlib.contextmanager
def float64_oracle():
    """float64 everywhere for float64 tensors (see the module docstring) and fusedops' float64
    reference backend."""
    T = torch.Tensor
    saved = (T.float, T.to, T.type, F.softmax, torch.softmax, T.softmax)
    f32, f64 = torch.float32, torch.float64
    o_float, o_to, o_type = T.float, T.to, T.type

    def _float(self, *a, **k):
        return self if self.dtype == f64 else o_float(self, *a, **k)

    def _to(self, *args, **kwargs):
        if self.dtype == f64:
            args = list(args)
            for i, a in enumerate(args):
                if a is f32:
                    args[i] = f64
                elif isinstance(a, torch.Tensor) and a.dtype == f32:
                    args[i] = a.device
                    kwargs.setdefault("dtype", f64)
            if kwargs.get("dtype") is f32:
                kwargs["dtype"] = f64
        return o_to(self, *args, **kwargs)

    def _type(self, dtype=None, *a, **k):
        if dtype is None:
            return o_type(self)
        if self.dtype == f64 and dtype in (f32, "torch.FloatTensor"):
            return self
        return o_type(self, dtype, *a, **k)

    def _softmax(orig):
        def softmax(x, *a, **k):
            if x.dtype == f64 and k.get("dtype") is f32:
                k["dtype"] = f64
            return orig(x, *a, **k)
        return softmax

    T.float, T.to, T.type = _float, _to, _type
    F.softmax, torch.softmax, T.softmax = _softmax(saved[3]), _softmax(saved[4]), _softmax(saved[5])
    try:
        with fusedops.use_backend("ref"):
            yield
    finally:
        T.float, T.to, T.type, F.softmax, torch.softmax, T.softmax = saved


def is_fused(model) -> bool:
    return "_fusedops_applied" in model.__dict__


def run(model, ids, **kwargs):
    """(logits, loss, {name: grad}) of one forward + backward with labels = ids."""
    model.zero_grad(set_to_none=True)
    extra = {"return_logits": True} if is_fused(model) else {}
    out = model(input_ids=ids, labels=ids, use_cache=False, **extra, **kwargs)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads
