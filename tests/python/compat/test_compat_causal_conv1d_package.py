"""fusedops.compat.causal_conv1d: the causal-conv1d package's (1.7.0) causal_conv1d_fn and
causal_conv1d_update, in its channels-first layout, called as its tests and Hugging Face's
Qwen3-Next call them, against plain PyTorch composites of the package's documented semantics
(float64 oracle, input-dtype base)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fusedops.compat.causal_conv1d import causal_conv1d_fn, causal_conv1d_update

from tests.common.tolerance import assert_close
from tests.python.compat.compat_common import leaves


def _rnd(*shape, seed, dtype=torch.float32):
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def conv_ref(x, weight, bias=None, initial_states=None, activation=None, seq_idx=None):
    """out [B, D, T] and the last W-1 inputs [B, D, W-1]: a depthwise F.conv1d over x preceded by
    the initial states (or zeros); with seq_idx each run of equal indices restarts (zeros, or the
    row's initial states for its first run)."""
    B, D, T = x.shape
    W = weight.shape[1]
    outs = []
    for b in range(B):
        runs = [(0, T)] if seq_idx is None else []
        if seq_idx is not None:
            s = 0
            for t in range(1, T + 1):
                if t == T or seq_idx[b, t] != seq_idx[b, t - 1]:
                    runs.append((s, t))
                    s = t
        pieces = []
        for i, (s, e) in enumerate(runs):
            head = (initial_states[b] if initial_states is not None and i == 0
                    else x.new_zeros(D, W - 1))
            xx = torch.cat([head, x[b, :, s:e]], -1)[None]
            pieces.append(F.conv1d(xx, weight.unsqueeze(1), bias, groups=D)[0])
        outs.append(torch.cat(pieces, -1))
    out = torch.stack(outs)
    out = F.silu(out) if activation in ("silu", "swish") else out
    head = initial_states if initial_states is not None else x.new_zeros(B, D, W - 1)
    final = torch.cat([head, x], -1)[..., -(W - 1):]
    return out, final


def _check(name, ours_fn, ref_fn, inputs):
    ins = leaves(*inputs)
    outs = ours_fn(*ins)
    outs = outs if isinstance(outs, tuple) else (outs,)
    gys = [_rnd(*o.shape, seed=90 + i) for i, o in enumerate(outs)]
    wrt = [t for t in ins if t is not None]
    g = torch.autograd.grad(outs, wrt, gys)
    res = []
    for dt in (torch.float64, torch.float32):
        i2 = leaves(*[None if t is None else t.to(dt) for t in inputs])
        o2 = ref_fn(*i2)
        w2 = [t for t in i2 if t is not None]
        res.append((o2, torch.autograd.grad(o2, w2, [gy.to(dt) for gy in gys])))
    (r, gr), (b, gb) = res
    for i, (a, bb, rr) in enumerate(zip(outs + g, b + gb, r + gr)):
        assert_close(a, bb, rr, torch.float32, f"{name} [{i}]")


def test_qwen3_next_call_form():
    """Hugging Face's call: causal_conv1d_fn(x [B, D, T], weight [D, W], bias, activation=...)."""
    B, D, T, W = 2, 24, 17, 4
    x, w, b = _rnd(B, D, T, seed=1), _rnd(D, W, seed=2) * 0.5, _rnd(D, seed=3)
    _check("causal_conv1d_fn", lambda x, w, b: causal_conv1d_fn(x, w, b, activation="silu"),
           lambda x, w, b: (conv_ref(x, w, b, activation="silu")[0],), (x, w, b))


def test_initial_and_final_states():
    B, D, T, W = 2, 8, 3, 4  # T < W - 1 + 1: the final state reaches into the initial state
    x, w, h = _rnd(B, D, T, seed=4), _rnd(D, W, seed=5), _rnd(B, D, W - 1, seed=6)
    _check("causal_conv1d_fn states",
           lambda x, w, h: causal_conv1d_fn(x, w, None, None, h, True, None, "swish"),
           lambda x, w, h: conv_ref(x, w, None, h, "swish"), (x, w, h))
    out_buf = torch.empty(B, D, W - 1)
    out, final = causal_conv1d_fn(x, w, initial_states=h, return_final_states=True, final_states_out=out_buf)
    assert final is out_buf and torch.equal(out_buf, conv_ref(x, w, None, h)[1])


def test_seq_idx_restarts_each_run():
    B, D, T, W = 2, 8, 9, 3
    x, w, b, h = _rnd(B, D, T, seed=7), _rnd(D, W, seed=8), _rnd(D, seed=9), _rnd(B, D, W - 1, seed=10)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2], [5, 5, 5, 5, 5, 5, 6, 6, 6]], dtype=torch.int32)
    _check("causal_conv1d_fn seq_idx",
           lambda x, w, b, h: causal_conv1d_fn(x, w, b, seq_idx, h, activation="silu"),
           lambda x, w, b, h: (conv_ref(x, w, b, h, "silu", seq_idx)[0],), (x, w, b, h))
    with pytest.raises(AssertionError, match="seq_idx"):
        causal_conv1d_fn(x, w, seq_idx=seq_idx, return_final_states=True)
    with pytest.raises(NotImplementedError, match="negative seq_idx"):
        causal_conv1d_fn(x, w, seq_idx=torch.full((B, T), -1, dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="activation must be None, silu, or swish"):
        causal_conv1d_fn(x, w, activation="gelu")


@pytest.mark.parametrize("B,T", [(3, 11), (1, 1), (2, 0), (4, 64)])
def test_seq_idx_segments_match_a_per_token_scan(B, T):
    """The runs of seq_idx (found with tensor operations) against the per-token scan of the
    package's semantics: a run starts at each row start and wherever the index changes (an index
    seen before, non-adjacent, starts a new run)."""
    from fusedops.compat.causal_conv1d.causal_conv1d_interface import _segments

    gen = torch.Generator().manual_seed(B * 100 + T)
    seq_idx = torch.randint(0, 3, (B, T), generator=gen, dtype=torch.int32)
    cu, firsts = [0], []
    for b in range(B):
        firsts.append(len(cu) - 1)
        cu += [b * T + t for t in range(1, T) if seq_idx[b, t] != seq_idx[b, t - 1]]
        cu.append((b + 1) * T)
    got_cu, got_firsts = _segments(seq_idx, B, T)
    assert got_cu.dtype == torch.int32 and got_cu.tolist() == cu
    assert got_firsts.tolist() == firsts


@pytest.mark.parametrize("L", [None, 3])
def test_update_appends_to_the_state_in_place(L):
    B, D, W, S = 3, 8, 4, 6  # a state longer than W - 1
    w, b = _rnd(D, W, seed=11), _rnd(D, seed=12)
    state = _rnd(B, D, S, seed=13)
    x = _rnd(B, D, seed=14) if L is None else _rnd(B, D, L, seed=14)
    st = state.clone()
    out = causal_conv1d_update(x, st, w, b, "silu")
    x3 = x[..., None] if L is None else x
    full = torch.cat([state, x3], -1)
    assert torch.equal(st, full[..., -S:])
    want = F.silu(F.conv1d(full, w.unsqueeze(1), b, groups=D)[..., -x3.shape[-1]:])
    torch.testing.assert_close(out, want[..., 0] if L is None else want, rtol=1e-5, atol=1e-6)


def test_update_with_state_indices_and_rejected_ring_buffer():
    B, D, W = 2, 8, 4
    w = _rnd(D, W, seed=15)
    cache = _rnd(5, D, W - 1, seed=16)
    idx = torch.tensor([4, 1], dtype=torch.int32)
    x = _rnd(B, D, seed=17)
    c = cache.clone()
    out = causal_conv1d_update(x, c, w, None, None, None, idx)
    rows = cache[idx.long()].clone()
    want = causal_conv1d_update(x, rows, w)
    torch.testing.assert_close(out, want)
    assert torch.equal(c[idx.long()], rows) and torch.equal(c[[0, 2, 3]], cache[[0, 2, 3]])
    with pytest.raises(NotImplementedError, match="cache_seqlens"):
        causal_conv1d_update(x, cache[:2].clone(), w, cache_seqlens=torch.zeros(B, dtype=torch.int32))
