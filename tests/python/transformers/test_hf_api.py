"""fusedops.transformers' API: revert, applying twice, switches, construction hooks, the Auto
class, save/load, the supported-version check, errors, and the LM head + loss options."""

from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from hf_models import _version, build, ft, fused, kernels, run, tiny_config, tokens, transformers

from tests.common import tolerance


def _classes(model):
    return {name: type(m) for name, m in model.named_modules()}


def _fused_modules(model):
    return {name for name, m in model.named_modules() if hasattr(type(m), "_fusedops_base")}


def _outputs(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


@pytest.fixture(autouse=True)
def _no_hooks_left():
    yield
    ft.revert_fusedops()


def test_revert_restores_classes_and_results():
    ref = build("qwen3_next")
    before = _classes(ref)
    ids = tokens(2, 16)
    want = _outputs(ref, ids)
    model = copy.deepcopy(ref)
    ft.apply_fusedops(model)
    assert model.config._experts_implementation == "fusedops"
    assert {"model.norm", "model.layers.0.linear_attn", "model", ""} <= _fused_modules(model)
    ft.revert_fusedops(model)
    assert _classes(model) == before
    assert model.config._experts_implementation == ref.config._experts_implementation
    assert torch.equal(_outputs(model, ids), want)


def test_applying_twice_is_harmless():
    ref = build("deepseek_v4")
    ids = tokens(2, 16)
    once = fused(ref)
    twice = ft.apply_fusedops(fused(ref))
    assert _classes(once) == _classes(twice)
    for m in twice.modules():  # a fused class derives from the transformers class itself
        base = getattr(type(m), "_fusedops_base", None)
        assert base is None or type(m).__bases__ == (base,)
    assert torch.equal(_outputs(once, ids), _outputs(twice, ids))
    ft.revert_fusedops(twice)
    assert _classes(twice) == _classes(ref)
    assert twice.config._experts_implementation == ref.config._experts_implementation


def test_switches_choose_what_is_swapped(monkeypatch):
    model = fused(build("qwen3_next"), conv=False, norm=False, experts=False, loss=False)
    names = _fused_modules(model)
    assert "model.layers.0.linear_attn" in names and "model.norm" not in names and "" not in names
    assert model.config._experts_implementation != "fusedops"
    calls = {"conv": 0, "gdn": 0}

    def count(key, fn):
        def wrapper(*a, **k):
            calls[key] += 1
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(kernels, "causal_conv1d_fn", count("conv", kernels.causal_conv1d_fn))
    monkeypatch.setattr(kernels, "chunk_gated_delta_rule", count("gdn", kernels.chunk_gated_delta_rule))
    _outputs(model, tokens(1, 8))
    assert calls == {"conv": 0, "gdn": 2}
    ft.apply_fusedops_to_qwen3_next(model=model)  # now everything
    _outputs(model, tokens(1, 8))
    assert calls == {"conv": 2, "gdn": 4}
    assert "model.norm" in _fused_modules(model) and model.config._experts_implementation == "fusedops"


def test_unsupported_model_type_and_wrong_family():
    config = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1)
    mistral = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="no fusedops integration for model_type 'mistral'; supported: .*qwen3_next"):
        ft.apply_fusedops(mistral)
    with pytest.raises(TypeError, match="apply_fusedops_to_llama takes a model with config.model_type in"):
        ft.apply_fusedops_to_llama(model=build("qwen3"))
    with pytest.raises(TypeError, match="apply_fusedops_to_llama has no switch 'conv'; its switches: norm, loss"):
        ft.apply_fusedops(build("llama"), conv=False)


def test_construction_hook_and_revert():
    ft.apply_fusedops_to_llama(loss=False)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config("llama"))
    names = _fused_modules(model)
    assert "model.norm" in names and "" not in names
    ft.revert_fusedops()
    plain = transformers.AutoModelForCausalLM.from_config(tiny_config("llama"))
    assert not _fused_modules(plain)
    assert "model.norm" in _fused_modules(model)  # models already built keep theirs


def test_construction_hook_sets_experts_and_reverts_them():
    ft.apply_fusedops_to_gpt_oss()
    model = transformers.AutoModelForCausalLM.from_config(tiny_config("gpt_oss"))
    assert model.config._experts_implementation == "fusedops"
    ft.revert_fusedops(model)
    assert model.config._experts_implementation == "grouped_mm"
    assert not _fused_modules(model)


def test_save_and_load(tmp_path):
    model = fused(build("qwen3"))
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not _fused_modules(plain)
    ids = tokens(2, 16)
    again = ft.AutoFusedopsModelForCausalLM.from_pretrained(tmp_path, loss=False)
    assert "model.norm" in _fused_modules(again) and "" not in _fused_modules(again)
    torch.testing.assert_close(_outputs(again, ids), _outputs(plain, ids), rtol=1e-5, atol=1e-5)
    ft.apply_fusedops_to_qwen3()
    hooked = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert "" in _fused_modules(hooked)
    torch.testing.assert_close(_outputs(hooked, ids), _outputs(plain, ids), rtol=1e-5, atol=1e-5)


def test_auto_from_config():
    model = ft.AutoFusedopsModelForCausalLM.from_config(tiny_config("kimi_linear"), experts=False)
    assert "model.layers.0.self_attn" in _fused_modules(model)
    assert model.config._experts_implementation != "fusedops"


@pytest.mark.parametrize("version,ok", [("5.23.0", True), ("5.23.4", True), ("5.22.1", False),
                                        ("5.24.0", False), ("5.24.0.dev0", False), ("4.57.1", False)])
def test_supported_version(monkeypatch, version, ok):
    # sys.modules' entry: deep-copying a transformers model re-creates its lazy top-level module
    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    if ok:
        assert _version.check_transformers() == version
    else:
        with pytest.raises(ImportError, match=r"supports transformers >=5\.23\.0,<5\.24, found " + version):
            _version.check_transformers()


# ---------------------------------------------------------------------------------------------
# LM head + loss


def _pair(family="qwen3_next"):
    ref = build(family)
    return ref, fused(ref)


def _loss_and_grads(model, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(use_cache=False, **kwargs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# Gradients against transformers' float32 run by RMS-relative difference: what the loss options
# change (which tokens count, what divides the sum) moves a gradient as a whole. Measured on
# qwen3_next at the cases of test_loss_options_match_transformers (stop 64): rounding gives at
# most 1.7e-5; num_items_in_batch 41 instead of 40 gives at least 2.4e-2. An elementwise bound
# (rtol 1e-4, atol 1e-5) failed on one element of 3072 on a Zen 5 VM, a gradient entry of 0.011
# summed from larger terms.
GRAD_RMS_REL = 1e-3


def _assert_same(got, want):
    torch.testing.assert_close(got[0].loss, want[0].loss, rtol=1e-5, atol=1e-6)
    assert got[1].keys() == want[1].keys()
    for name, g in want[1].items():
        rel = tolerance.rms_relative_error(got[1][name], g)
        assert rel <= GRAD_RMS_REL, f"grad {name}: rms-relative difference {rel:.2e} > {GRAD_RMS_REL:.0e}"


def test_no_logits_in_training(monkeypatch):
    ref, ours = _pair("llama")
    ids = tokens(2, 16)
    calls = []
    ours.lm_head.register_forward_hook(lambda *a: calls.append(1))
    ours.train()
    out = ours(input_ids=ids, labels=ids, use_cache=False)
    assert out.logits is None and not calls
    assert ours(input_ids=ids, labels=ids, use_cache=False, return_logits=True).logits.shape == (2, 16, 96)
    ours.eval()
    assert ours(input_ids=ids, labels=ids, use_cache=False).logits is not None
    assert ours(input_ids=ids, labels=ids, use_cache=False, return_logits=False).logits is None


def test_loss_options_match_transformers():
    ref, ours = _pair("qwen3_next")
    ids = tokens(2, 16)
    labels = ids.clone()
    labels[0, :5] = -100
    n = torch.tensor(40)
    shift = torch.roll(ids, 3, dims=1)
    shift[1, 2:6] = -100
    for kwargs in (dict(labels=labels), dict(labels=labels, num_items_in_batch=n),
                   dict(labels=ids, shift_labels=shift), dict(labels=torch.where(labels < 0, -1, labels), ignore_index=-1),
                   dict(labels=ids, output_router_logits=True)):
        ref.train()
        ours.train()
        got, want = _loss_and_grads(ours, input_ids=ids, **kwargs), _loss_and_grads(ref, input_ids=ids, **kwargs)
        _assert_same(got, want)
        if kwargs.get("output_router_logits"):
            torch.testing.assert_close(got[0].aux_loss, want[0].aux_loss)


def test_gradient_accumulation_with_num_items_in_batch():
    """Two micro-batches, each loss divided by the tokens of both: their gradients add up to
    the gradient of the whole batch's mean loss."""
    _, ours = _pair("qwen3")
    ids = tokens(4, 12)
    total = torch.tensor(4 * 11)
    whole = _loss_and_grads(ours, input_ids=ids, labels=ids)
    a = _loss_and_grads(ours, input_ids=ids[:2], labels=ids[:2], num_items_in_batch=total)
    b = _loss_and_grads(ours, input_ids=ids[2:], labels=ids[2:], num_items_in_batch=total)
    torch.testing.assert_close(a[0].loss + b[0].loss, whole[0].loss, rtol=1e-5, atol=1e-6)
    for name, g in whole[1].items():
        torch.testing.assert_close(a[1][name] + b[1][name], g, rtol=1e-4, atol=1e-6)


def test_logits_to_keep():
    ref, ours = _pair("gpt_oss")
    ids = tokens(2, 16)
    for model in (ref, ours):
        model.eval()
    with torch.no_grad():
        want = ref(input_ids=ids, use_cache=False, logits_to_keep=3).logits
        got = ours(input_ids=ids, use_cache=False, logits_to_keep=3).logits
    assert got.shape == (2, 3, 96)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen3_next", "deepseek_v4"])
def test_activation_checkpointing(family):
    """Patched layers recompute under transformers' activation checkpointing: same loss and
    gradients."""
    model = fused(build(family))
    ids = tokens(2, 24)
    want = run(model, ids)
    model.activation_checkpointing_enable()
    got = run(model, ids)
    assert torch.equal(got[1], want[1])
    for name, g in want[2].items():
        assert torch.equal(got[2][name], g), name
