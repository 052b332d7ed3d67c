"""fusedops.compat.fla.modules: the short convolution, gated RMSNorms, L2Norm and the fused
losses called as FLA 0.6.0's layers and tests call them. Each is compared with its plain
PyTorch composite written here from FLA's formulas (float64 as the oracle, the input dtype as
the tolerance base) and, where it maps to one native call, with that call (bitwise)."""

from __future__ import annotations

import inspect

import fusedops
import pytest
import torch
import torch.nn.functional as F
from fusedops.compat.fla.modules import (
    FusedCrossEntropyLoss,
    FusedLinearCrossEntropyLoss,
    FusedRMSNormGated,
    FusedRMSNormSwishGate,
    L2Norm,
    ShortConvolution,
)
from fusedops.compat.fla.modules.causal_conv1d import causal_conv1d, causal_conv1d_update
from fusedops.compat.fla.modules.fused_cross_entropy import cross_entropy_loss
from fusedops.compat.fla.modules.fused_linear_cross_entropy import fused_linear_cross_entropy_loss
from fusedops.compat.fla.modules.fused_norm_gate import rms_norm_gated
from fusedops.compat.fla.modules.l2norm import l2norm, l2norm_bwd, l2norm_fwd
from fusedops.compat.fla.modules.layernorm_gated import RMSNormGated, rmsnorm_fn

from tests.common.tolerance import assert_close
from tests.python.compat.compat_common import bitwise, leaves


def _rnd(*shape, seed, dtype=torch.float32):
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _grad_check(name, fn_ours, fn_comp, inputs, dtype, gy_seed=0):
    """Forward and every input gradient of fn_ours against fn_comp in float64 (oracle) and in
    the inputs' dtype (base)."""
    ours_in = leaves(*inputs)
    y = fn_ours(*ours_in)
    gy = _rnd(*y.shape, seed=gy_seed, dtype=y.dtype)
    wrt = [t for t in ours_in if t is not None and t.is_floating_point()]
    g_ours = torch.autograd.grad(y, wrt, gy)
    results = []
    for dt in (torch.float64, dtype):
        ins = leaves(*[None if t is None else (t.to(dt) if t.is_floating_point() else t) for t in inputs])
        yy = fn_comp(*ins)
        ww = [t for t in ins if t is not None and t.is_floating_point()]
        results.append((yy, torch.autograd.grad(yy, ww, gy.to(yy.dtype))))
    (ref, g_ref), (base, g_base) = results
    assert_close(y, base, ref, dtype, f"{name} y")
    for i, (a, b, r) in enumerate(zip(g_ours, g_base, g_ref)):
        assert_close(a, b, r, dtype, f"{name} grad {i}")


# ---- short convolution ------------------------------------------------------------------------


def conv_composite(x, weight_dw, bias, activation):
    """FLA's causal conv: a depthwise F.conv1d with W-1 left zeros, then silu."""
    T, D, W = x.shape[1], weight_dw.shape[0], weight_dw.shape[1]
    y = F.conv1d(x.transpose(1, 2), weight_dw.unsqueeze(1), bias, padding=W - 1, groups=D)[..., :T]
    y = y.transpose(1, 2)
    return F.silu(y) if activation in ("silu", "swish") else y


def test_causal_conv1d_positional_form_and_dw_weight():
    B, T, D, W = 2, 13, 24, 4
    x, w, b = _rnd(B, T, D, seed=1), _rnd(D, W, seed=2) * 0.5, _rnd(D, seed=3)
    # FLA's positions: ..., output_final_state (6th), activation (7th), backend (8th), cu_seqlens (9th)
    y, final = causal_conv1d(x, w, b, None, None, True, "silu", "triton")
    yn, fn = fusedops.causal_conv1d(x, w, b, None, None, True, "silu", weight_layout="DW")
    assert bitwise(y, yn) and bitwise(final, fn) and final.shape == (B, D, W)
    _grad_check("fla causal_conv1d", lambda x, w, b: causal_conv1d(x, w, b, activation="silu")[0],
                lambda x, w, b: conv_composite(x, w, b, "silu"), (x, w, b), torch.float32)
    cu = torch.tensor([0, 5, 26], dtype=torch.int32)
    xv = _rnd(1, 26, D, seed=4)
    y, final = causal_conv1d(xv, w, None, None, None, True, None, "cuda", cu, None, None)
    yn, fn = fusedops.causal_conv1d(xv, w, None, None, None, True, cu_seqlens=cu, weight_layout="DW")
    assert bitwise(y, yn) and bitwise(final, fn)
    with pytest.raises(ValueError, match="Unsupported backend: tilelang"):
        causal_conv1d(x, w, backend="tilelang")
    with pytest.raises(NotImplementedError, match="cp_context"):
        causal_conv1d(x, w, cp_context=object())
    with pytest.raises(NotImplementedError, match="weight=None"):
        causal_conv1d(x)


def test_causal_conv1d_update_shifts_the_cache_in_place():
    N, D, W = 3, 8, 4
    w, b = _rnd(D, W, seed=5), _rnd(D, seed=6)
    cache = _rnd(N, D, W, seed=7)
    for shape in ((N, D), (1, N, D), (N, 1, D)):
        x = _rnd(*shape, seed=8)
        c = cache.clone()
        y, c2 = causal_conv1d_update(x, c, None, w, b, "silu")
        assert c2 is c and y.shape == x.shape
        xs = x.reshape(N, D)
        assert torch.equal(c[..., :-1], cache[..., 1:]) and torch.equal(c[..., -1], xs)
        want = F.silu((c * w).sum(-1) + b)  # the window (cache after the shift) times the weight
        torch.testing.assert_close(y.reshape(N, D), want, rtol=1e-5, atol=1e-6)


def test_short_convolution_is_flas_module():
    """nn.Conv1d weight [D, 1, W] (an FLA or nn.Conv1d state dict loads), silu, packed
    sequences with cu_seqlens / chunk_indices, and FLA's in-place decoding cache."""
    D, W = 16, 4
    conv = ShortConvolution(D, W, bias=True, activation="silu", backend="cuda")
    plain = torch.nn.Conv1d(D, D, W, groups=D, padding=W - 1, bias=True)
    conv.load_state_dict(plain.state_dict())
    x = _rnd(2, 11, D, seed=9)
    y, final = conv(x, output_final_state=True)
    ref = conv_composite(x, plain.weight[:, 0].detach(), plain.bias.detach(), "silu")
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(final, F.pad(x.transpose(1, 2), (W - 11, 0)) if 11 < W else x[:, -W:].transpose(1, 2))
    cu = torch.tensor([0, 4, 15], dtype=torch.int64)
    xv = _rnd(1, 15, D, seed=10)
    yv, _ = conv(xv, cu_seqlens=cu, chunk_indices=fusedops.gated_delta_rule.prepare_chunk_indices(cu, 64))
    for s, e in ((0, 4), (4, 15)):
        torch.testing.assert_close(yv[:, s:e], conv(xv[:, s:e])[0])
    # decoding: one token per sequence, autograd off -> the cache is updated in place
    cache = final.clone()
    step = _rnd(2, 1, D, seed=11)
    with torch.no_grad():
        ys, none = conv(step, cache=cache)
    assert none is None and torch.equal(cache[..., -1], step[:, 0])
    whole, _ = conv(torch.cat([x, step], 1))
    torch.testing.assert_close(ys[:, 0], whole[:, -1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="Invalid backend"):
        ShortConvolution(D, W, backend="mix")
    with pytest.warns(UserWarning, match="use_fast_conv1d"):
        ShortConvolution(D, W, use_fast_conv1d=True)


# ---- gated RMSNorm, L2Norm --------------------------------------------------------------------


def norm_then_gate(x, g, w, eps, act):
    """FLA fused_norm_gate (RMS): y = x rstd w act(g)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    return y * (F.silu(g) if act in ("swish", "silu") else torch.sigmoid(g))


def gate_then_norm(x, z, w, eps, group):
    """FLA layernorm_gated RMSNormGated (norm_before_gate=False): u = x silu(z), grouped RMS."""
    u = x * F.silu(z)
    ug = u.unflatten(-1, (-1, group))
    return (ug * torch.rsqrt(ug.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2) * w


@pytest.mark.parametrize("activation", ["swish", "sigmoid"])
def test_fused_rms_norm_gated_defaults_are_flas_math(activation):
    """FusedRMSNormGated(D): normalise, then gate (eps 1e-5), as FLA's module."""
    D = 64
    m = FusedRMSNormGated(D, activation=activation)
    assert m.eps == 1e-5 and m.bias is None and torch.equal(m.weight.detach(), torch.ones(D))
    with torch.no_grad():
        m.weight.copy_(_rnd(D, seed=12) + 1)
    x, g = _rnd(5, 3, D, seed=13), _rnd(5, 3, D, seed=14)
    _grad_check(f"FusedRMSNormGated {activation}", lambda x, g: m(x, g),
                lambda x, g: norm_then_gate(x, g, m.weight.detach().to(x.dtype), 1e-5, activation),
                (x, g), torch.float32)
    r = _rnd(5, 3, D, seed=15)
    y, res = m(x, g, residual=r, prenorm=True)
    torch.testing.assert_close(res, x + r)
    torch.testing.assert_close(y, m(x + r, g), rtol=1e-5, atol=1e-6)
    assert isinstance(FusedRMSNormSwishGate(D), FusedRMSNormGated) and FusedRMSNormSwishGate(D).activation == "swish"


def test_rms_norm_gated_positional_form():
    D = 32
    x, g, w, b = _rnd(6, D, seed=16), _rnd(6, D, seed=17), _rnd(D, seed=18), _rnd(D, seed=19)
    r = _rnd(6, D, seed=20)
    y, res = rms_norm_gated(x, g, w, b, "sigmoid", r, True, True, 1e-5)
    yn, resn = fusedops.rms_norm_gated(x, g, w, b, "sigmoid", r, True, True, 1e-5)
    assert bitwise(y, yn) and bitwise(res, resn)
    want = ((x + r) * torch.rsqrt((x + r).pow(2).mean(-1, keepdim=True) + 1e-5) * w + b) * torch.sigmoid(g)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


def test_rms_norm_gated_module_gates_first_by_default():
    """FLA's RMSNormGated(D) (layernorm_gated): x * silu(z), then the (grouped) RMSNorm."""
    D = 64
    m = RMSNormGated(D, group_size=32)
    assert m.eps == 1e-5 and m.norm_before_gate is False and m.bias is None
    with torch.no_grad():
        m.weight.copy_(_rnd(D, seed=21) + 1)
    x, z = _rnd(4, D, seed=22), _rnd(4, D, seed=23)
    _grad_check("RMSNormGated", lambda x, z: m(x, z),
                lambda x, z: gate_then_norm(x, z, m.weight.detach().to(x.dtype), 1e-5, 32), (x, z),
                torch.float32)
    assert bitwise(m(x, z), rmsnorm_fn(x, m.weight, None, z, 1e-5, 32, False))


def test_l2norm_forms():
    x = _rnd(3, 7, 40, seed=24)
    _grad_check("l2norm", lambda x: l2norm(x), lambda x: x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6),
                (x,), torch.float32)
    assert bitwise(L2Norm(eps=1e-6, output_dtype=torch.bfloat16)(x), l2norm(x, 1e-6, torch.bfloat16))
    y, rstd = l2norm_fwd(x)
    dy = _rnd(3, 7, 40, seed=25)
    assert bitwise(l2norm_bwd(y, rstd, dy), fusedops.ops.l2norm.l2norm_bwd(y, rstd, dy))


# ---- losses -----------------------------------------------------------------------------------


def ce_rows(logits, target, ls=0.0, scale=1.0, z=0.0, cap=None, ignore=-100):
    """FLA's per-row loss: (1-ls)(lse - x_y) + ls (lse - mean x) + z lse^2 (with the z-loss), 0
    on ignored rows; the z-loss z lse^2 alone."""
    x = logits * scale
    if cap is not None:
        x = cap * torch.tanh(x / cap)
    lse = torch.logsumexp(x, -1)
    keep = target != ignore
    xy = x.gather(-1, target.clamp(min=0)[:, None])[:, 0]
    loss = (1 - ls) * (lse - xy) + ls * (lse - x.mean(-1)) + z * lse ** 2
    return torch.where(keep, loss, 0.0), torch.where(keep, z * lse ** 2, 0.0)


def test_cross_entropy_loss_per_row():
    N, V = 12, 50
    logits, target = _rnd(N, V, seed=26), torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(0))
    target[3] = -100
    opts = dict(label_smoothing=0.1, logit_scale=0.8, lse_square_scale=1e-2, logit_softcapping=5.0)
    loss, z = cross_entropy_loss(logits, target, 0.1, 0.8, 1e-2, 5.0, -100, False, None)
    assert loss.shape == z.shape == (N,) and loss.dtype == z.dtype == torch.float32 and not z.requires_grad
    _grad_check("cross_entropy_loss", lambda x: cross_entropy_loss(x, target, **opts)[0],
                lambda x: ce_rows(x, target, 0.1, 0.8, 1e-2, 5.0)[0], (logits,), torch.float32)
    torch.testing.assert_close(z, ce_rows(logits, target, 0.1, 0.8, 1e-2, 5.0)[1])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_fused_cross_entropy_loss_module(reduction):
    N, V = 10, 33
    logits, target = _rnd(N, V, seed=27), torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(1))
    target[0] = -100
    m = FusedCrossEntropyLoss(-100, reduction, 0.0, 1.0, 1e-3, None, False, None, True)
    loss, z = m(logits, target)
    rows, zrows = ce_rows(logits, target, z=1e-3)
    red = {"mean": lambda t: t.sum() / 9, "sum": torch.sum, "none": lambda t: t}[reduction]
    torch.testing.assert_close(loss, red(rows))
    torch.testing.assert_close(z, red(zrows))
    plain = FusedCrossEntropyLoss()(logits, target)
    torch.testing.assert_close(plain, F.cross_entropy(logits, target, ignore_index=-100))


def test_fused_linear_cross_entropy_forward_order_and_grads():
    """forward(x, target, weight): the LM head and CE without materialised logits (chunk_loss)."""
    B, T, H, V = 2, 5, 16, 40
    x, w = _rnd(B, T, H, seed=28), _rnd(V, H, seed=29) * 0.3
    target = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(2))
    target[0, 0] = -100
    m = FusedLinearCrossEntropyLoss(label_smoothing=0.05, logit_softcapping=8.0)
    _grad_check("FusedLinearCrossEntropyLoss", lambda x, w: m(x, target, w),
                lambda x, w: ce_rows(F.linear(x.reshape(-1, H), w), target.reshape(-1), ls=0.05,
                                     cap=8.0)[0].sum() / 9, (x, w), torch.float32)
    s = fused_linear_cross_entropy_loss(x.reshape(-1, H), target.reshape(-1), w, None, -100, 0.0, 1.0, None,
                                        2, "sum")
    torch.testing.assert_close(s, ce_rows(F.linear(x.reshape(-1, H), w), target.reshape(-1))[0].sum())
    with pytest.raises(NotImplementedError, match="bias"):
        m(x, target, w, torch.zeros(V))
    with pytest.raises(NotImplementedError, match="use_l2warp"):
        FusedLinearCrossEntropyLoss(use_l2warp=True)(x, target, w)
    if "process_group" not in inspect.signature(fusedops.chunk_loss).parameters:
        with pytest.raises(NotImplementedError, match=r"process_group \(vocab parallelism\) is not supported"):
            FusedLinearCrossEntropyLoss(process_group=object())(x, target, w)
