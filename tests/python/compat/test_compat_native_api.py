"""The native API where its names are FLA's (compat issue, item 2): rms_norm_gated's g / z,
the one soft-cap keyword of the fused losses (softcap an alias), the two gated-RMSNorm modules
with the default math of the FLA modules of the same names, and nn.FusedCrossEntropyLoss in
FLA's positional order. causal_conv1d's order is tested in tests/python/ops/test_causal_conv1d.py."""

from __future__ import annotations

import fusedops
import pytest
import torch
import torch.nn.functional as F

from tests.python.compat.compat_common import bitwise


def _rnd(*shape, seed):
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed))


def test_rms_norm_gated_gate_keyword_and_alias():
    x, g, w = _rnd(4, 32, seed=1), _rnd(4, 32, seed=2), _rnd(32, seed=3)
    a = fusedops.rms_norm_gated(x, g, w)
    assert bitwise(a, fusedops.rms_norm_gated(x, g=g, weight=w))
    assert bitwise(a, fusedops.rms_norm_gated(x, z=g, weight=w))  # the name before
    with pytest.raises(TypeError, match="not both"):
        fusedops.rms_norm_gated(x, g, w, z=g)
    with pytest.raises(TypeError, match=r"positional order is flash-linear-attention's \(x, g, weight, bias, "
                                        r"activation, residual, prenorm, residual_in_fp32, eps\)"):
        fusedops.rms_norm_gated(x, g, w, None, 1e-6)  # the old (..., eps, group_size, ...) positions


def test_one_softcap_keyword_for_both_losses():
    N, V, H = 12, 40, 16
    logits, labels = _rnd(N, V, seed=4) * 4, torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(0))
    a = fusedops.fused_cross_entropy_loss(logits, labels, logit_softcapping=3.0)
    assert bitwise(a, fusedops.fused_cross_entropy_loss(logits, labels, softcap=3.0))
    assert not torch.equal(a, fusedops.fused_cross_entropy_loss(logits, labels))
    hid, w = _rnd(N, H, seed=5), _rnd(V, H, seed=6)
    c = fusedops.chunk_loss(hid, w, labels, logit_softcapping=3.0)
    assert bitwise(c, fusedops.chunk_loss(hid, w, labels, softcap=3.0))
    assert bitwise(c, fusedops.nn.ChunkLoss(logit_softcapping=3.0)(hid, w, labels))
    assert bitwise(c, fusedops.nn.ChunkLoss(softcap=3.0)(hid, w, labels))
    for fn in (lambda: fusedops.fused_cross_entropy_loss(logits, labels, logit_softcapping=3.0, softcap=2.0),
               lambda: fusedops.chunk_loss(hid, w, labels, logit_softcapping=3.0, softcap=2.0)):
        with pytest.raises(TypeError, match="logit_softcapping or as its alias softcap, not both"):
            fn()


def test_gated_rmsnorm_modules_have_the_default_math_of_flas_modules_of_the_same_names():
    """A documented choice (docs/compat.md): fusedops.nn.RMSNormGated(D) is FLA's RMSNormGated,
    gate then normalise; fusedops.nn.FusedRMSNormGated(D) is FLA's FusedRMSNormGated, normalise
    then gate. The two differ, as in FLA."""
    D = 32
    x, z = _rnd(5, D, seed=7), _rnd(5, D, seed=8)
    u = x * F.silu(z)
    gate_first = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + 1e-5)
    norm_first = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * F.silu(z)
    a = fusedops.nn.RMSNormGated(D)(x, z)
    b = fusedops.nn.FusedRMSNormGated(D)(x, z)
    torch.testing.assert_close(a, gate_first)
    torch.testing.assert_close(b, norm_first)
    assert (a - b).abs().max() > 1e-2
    m = fusedops.nn.RMSNormGated(D, 1e-5, None, True, activation="sigmoid")
    torch.testing.assert_close(m(x, z), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * torch.sigmoid(z))


def test_fused_cross_entropy_module_positional_order():
    logits, labels = _rnd(6, 20, seed=9), torch.randint(0, 20, (6,), generator=torch.Generator().manual_seed(1))
    m = fusedops.nn.FusedCrossEntropyLoss(-100, "sum", 0.0, 1.0, 1e-2, 4.0, False, return_z_loss=True)
    assert (m.lse_square_scale, m.logit_softcapping) == (1e-2, 4.0)
    loss, z = m(logits, labels)
    want = fusedops.fused_cross_entropy_loss(logits, labels, reduction="sum", lse_square_scale=1e-2,
                                             logit_softcapping=4.0, return_z_loss=True)
    assert bitwise(loss, want[0]) and bitwise(z, want[1])


def test_fused_cross_entropy_loss_function_is_an_autograd_function():
    assert issubclass(fusedops.FusedCrossEntropyLossFunction, torch.autograd.Function)
    x = _rnd(5, 9, seed=10).requires_grad_()
    labels = torch.tensor([0, 3, -100, 8, 1])
    loss = fusedops.FusedCrossEntropyLossFunction.apply(x, None, labels)
    (2 * loss).backward()
    x2 = x.detach().requires_grad_()
    (2 * F.cross_entropy(x2, labels, reduction="sum")).backward()
    torch.testing.assert_close(x.grad, x2.grad)
