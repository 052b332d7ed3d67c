"""Packed sequences: a [1, T] batch of several sequences (position ids restarting at each, as
transformers' DataCollatorWithFlattening makes it, or with its cu_seq_lens_q keyword arguments)
equals the sequences run separately with fusedops, and transformers' own model run on them
padded; loss (shift_labels, num_items_in_batch) and every gradient included. float64 oracle
(tests/python/transformers/hf_models.py), so agreement is to 1e-10 and any state leaking across
a sequence boundary shows."""

from __future__ import annotations

import pytest
import torch
from hf_models import FAMILIES, LINEAR_ATTENTION, build, float64_oracle, fused

from tests.common import tolerance

LENGTHS = (7, 11, 6)
RTOL = 1e-10
# transformers' own attention of these families mixes packed sequences (GPT-OSS: its sliding-
# window attention with sinks; DeepSeek-V4: its compressed and sliding-window attention), with
# or without fusedops: test_packed_is_unchanged checks fusedops keeps their packed results.
MIXES_PACKED = ("gpt_oss", "deepseek_v4")
PACKABLE = tuple(f for f in FAMILIES if f not in MIXES_PACKED)


def _close(a, b, what):
    scale = tolerance.scale_of(b)
    err = tolerance.max_abs_error(a, b)
    assert err <= RTOL * scale, f"{what}: max-abs err {err:.3e} > {RTOL:.0e} * {scale:.3g}"


def _sequences(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 96, (n,), generator=g) for n in LENGTHS]


def _shifted(seq):
    return torch.cat([seq[1:], seq.new_tensor([-100])])


def _run(model, items, **kwargs):
    """(logits, grads) of one call; the loss is the token sum over the whole batch divided by
    the number of labelled tokens (num_items_in_batch), so per-sequence calls add up."""
    model.zero_grad(set_to_none=True)
    out = model(use_cache=False, num_items_in_batch=items, **kwargs)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def _packed_inputs(seqs):
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    shift = torch.cat([_shifted(s) for s in seqs])[None]
    return ids, pos, shift


@pytest.mark.parametrize("family", PACKABLE)
def test_packed_equals_separate_and_padded(family):
    ref = build(family, torch.float64)
    ours = fused(ref)
    seqs = _sequences()
    items = sum(len(s) - 1 for s in seqs)
    ids, pos, shift = _packed_inputs(seqs)
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(LENGTHS), 0).tolist()], dtype=torch.int32)
    with float64_oracle():
        packed = _run(ours, items, input_ids=ids, position_ids=pos, shift_labels=shift, return_logits=True)
        explicit = _run(ours, items, input_ids=ids, position_ids=pos, shift_labels=shift, return_logits=True,
                        cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(LENGTHS),
                        max_length_k=max(LENGTHS))
        separate = [_run(ours, items, input_ids=s[None], shift_labels=_shifted(s)[None], return_logits=True)
                    for s in seqs]
        T = max(LENGTHS)
        padded_ids = torch.stack([torch.nn.functional.pad(s, (0, T - len(s))) for s in seqs])
        mask = torch.stack([torch.arange(T) < len(s) for s in seqs]).long()
        labels = torch.where(mask.bool(), padded_ids, torch.full_like(padded_ids, -100))
        padded = _run(ref, items, input_ids=padded_ids, attention_mask=mask, labels=labels)
    sep_logits = torch.cat([s[0][0] for s in separate])
    pad_logits = torch.cat([padded[0][i, :n] for i, n in enumerate(LENGTHS)])
    for what, got in (("packed", packed), ("cu_seq_lens_q", explicit)):
        _close(got[0][0], sep_logits, f"{what} logits vs separate")
        _close(got[0][0], pad_logits, f"{what} logits vs transformers padded")
        _close(got[1], sum(s[1] for s in separate), f"{what} loss vs separate")
        _close(got[1], padded[1], f"{what} loss vs transformers padded")
        for name, g in padded[2].items():
            _close(got[2][name], g, f"{what} grad {name} vs transformers padded")
            _close(got[2][name], sum(s[2][name] for s in separate), f"{what} grad {name} vs separate")


@pytest.mark.parametrize("family", LINEAR_ATTENTION)
def test_transformers_own_linear_attention_leaks_across_packed_sequences(family):
    """What the packed test guards against: without fusedops the linear-attention layers of a
    packed batch carry their state (and the short convolution its window) from one sequence into
    the next, so the comparison above would fail."""
    ref = build(family, torch.float64)
    seqs = _sequences()
    ids, pos, _ = _packed_inputs(seqs)
    with float64_oracle(), torch.no_grad():
        packed = ref(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        separate = torch.cat([ref(input_ids=s[None], use_cache=False).logits[0] for s in seqs])
    assert (packed[:LENGTHS[0]] - separate[:LENGTHS[0]]).abs().max() < 1e-10  # the first sequence
    assert (packed - separate).abs().max() > 1e-3


@pytest.mark.parametrize("family", MIXES_PACKED)
def test_packed_is_unchanged(family):
    """Families whose transformers attention mixes packed sequences: fusedops gives the same
    packed results as transformers' own code (and both differ from separate runs)."""
    ref = build(family, torch.float64)
    ours = fused(ref)
    seqs = _sequences()
    items = sum(len(s) - 1 for s in seqs)
    ids, pos, shift = _packed_inputs(seqs)
    labels = torch.cat([shift.new_full((1, 1), -100), shift[:, :-1]], 1)  # shifted by the model
    with float64_oracle():
        got = _run(ours, items, input_ids=ids, position_ids=pos, labels=labels, return_logits=True)
        want = _run(ref, items, input_ids=ids, position_ids=pos, labels=labels)
        with torch.no_grad():
            separate = torch.cat([ref(input_ids=s[None], use_cache=False).logits[0] for s in seqs])
    _close(got[0], want[0], "packed logits")
    _close(got[1], want[1], "packed loss")
    for name, g in want[2].items():
        _close(got[2][name], g, f"packed grad {name}")
    assert (want[0][0] - separate).abs().max() > 1e-3
