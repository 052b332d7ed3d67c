"""Greedy generation of 16 tokens with the model's cache: the same tokens with fusedops as with
transformers' own code, and the same per-step logits (float32). In the linear-attention families
the decoding steps go through fused_recurrent_* and the one-step convolution update."""

from __future__ import annotations

import pytest
import torch
from hf_models import FAMILIES, LINEAR_ATTENTION, build, fused, kernels, tokens

NEW_TOKENS = 16


def _generate(model, ids, mask):
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    return out.sequences, torch.stack(out.logits)


def _count_calls(monkeypatch, module, names):
    calls = dict.fromkeys(names, 0)
    for name in names:
        fn = getattr(module, name)

        def counted(*a, _fn=fn, _name=name, **k):
            calls[_name] += 1
            return _fn(*a, **k)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("padded", [False, True], ids=["same-length", "left-padded"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches(family, padded, monkeypatch):
    ref = build(family, torch.float32)
    ours = fused(ref)
    ids = tokens(2, 8, seed=7)
    mask = torch.ones_like(ids)
    if padded:
        ids[0, :3] = 0
        mask[0, :3] = 0
    want_seq, want_logits = _generate(ref, ids, mask)
    decode = ("fused_recurrent_kda" if family == "kimi_linear" else "fused_recurrent_gated_delta_rule",
              "causal_conv1d_update")
    calls = _count_calls(monkeypatch, kernels, decode)
    got_seq, got_logits = _generate(ours, ids, mask)
    assert torch.equal(got_seq, want_seq)
    err = (got_logits - want_logits).abs().max().item()
    assert err <= 1e-4 * max(1.0, want_logits.abs().max().item()), f"per-step logits differ by {err:.3e}"
    if family in LINEAR_ATTENTION:
        # every decoding step after the prompt, in every linear-attention layer
        assert all(n >= NEW_TOKENS - 1 for n in calls.values()), calls
