"""Property-based tests (hypothesis) of causal_conv1d and clipped_swiglu: random shapes (1, primes,
vector boundaries +-1), widths, dtypes, layouts and options (bias, residual, initial state, varlen
offsets, SiLU; interleaving, split dim, clamp mode, limit, group_index), forward and every gradient
against the float64 reference under the precision policy."""

from __future__ import annotations

import fusedops
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.python.property.common import (
    DTYPES,
    SETTINGS,
    check_against_reference,
    composite_of,
    dim,
    normal,
    strided,
)

CONV = composite_of("test_causal_conv1d")
SWIGLU = composite_of("test_clipped_swiglu")


@SETTINGS
@given(B=dim(3), T=dim(70), D=dim(40), W=st.integers(1, 8), dtype=DTYPES,
       layout=st.sampled_from(["dense", "rows"]), bias=st.booleans(), residual=st.booleans(),
       state=st.booleans(), varlen=st.booleans(), silu=st.booleans(), data=st.data(),
       seed=st.integers(0, 2**20))
def test_causal_conv1d(device, B, T, D, W, dtype, layout, bias, residual, state, varlen, silu, data,
                       seed):
    cu = None
    if varlen:
        cuts = sorted(data.draw(st.lists(st.integers(0, T), max_size=4), label="cuts"))
        cu = torch.tensor([0] + cuts + [T], dtype=torch.int32, device=device)
        B = 1
    N = B if cu is None else cu.numel() - 1
    x = strided(normal((B, T, D), dtype, device, seed), layout)
    inputs = {"x": x, "w": normal((W, D), dtype, device, seed + 1),
              "b": normal((D,), dtype, device, seed + 2) if bias else None,
              "r": normal((B, T, D), dtype, device, seed + 3) if residual else None,
              "h": normal((N, D, W), dtype, device, seed + 4) if state else None}
    act = "silu" if silu else None

    def call(fn):
        return lambda x, w, b, r, h: fn(x, w, b, r, h, act, cu, True)

    check_against_reference(
        f"causal_conv1d B {B} T {T} D {D} W {W} {dtype} {layout} bias {bias} residual {residual} "
        f"state {state} cu {None if cu is None else cu.tolist()} silu {silu} seed {seed}",
        call(lambda *a: fusedops.causal_conv1d(*a[:5], activation=a[5], cu_seqlens=a[6],
                                               output_final_state=a[7])),
        call(lambda *a: CONV(*a[:5], activation=a[5], cu_seqlens=a[6], output_final_state=a[7])),
        call(lambda *a: fusedops.reference.causal_conv1d(*a[:5], activation=a[5], cu_seqlens=a[6],
                                                         output_final_state=a[7])),
        inputs, [k for k, v in inputs.items() if v is not None], seed)


@SETTINGS
@given(M=dim(40), half=dim(130), lead=st.sampled_from([(), (3,)]), dtype=DTYPES,
       interleaved=st.booleans(), mode=st.sampled_from([0, 1]), limit=st.sampled_from([0.5, 7.0, 60.0]),
       groups=st.one_of(st.none(), st.lists(st.integers(0, 20), min_size=1, max_size=5)),
       scale=st.sampled_from([1.0, 8.0]), seed=st.integers(0, 2**20))
def test_clipped_swiglu(device, M, half, lead, dtype, interleaved, mode, limit, groups, scale, seed):
    x = normal(lead + (M, 2 * half), dtype, device, seed, scale)
    gi = None if groups is None else torch.tensor(groups, dtype=torch.int64, device=device)
    kw = dict(dim=-1, limit=limit, interleaved=interleaved, clamp_mode=mode)
    check_against_reference(
        f"clipped_swiglu {list(x.shape)} {dtype} interleaved {interleaved} mode {mode} limit {limit} "
        f"groups {groups} scale {scale} seed {seed}",
        lambda x: fusedops.clipped_swiglu(x, group_index=gi, **kw),
        lambda x: SWIGLU(x, group_index=gi, **kw),
        lambda x: fusedops.reference.clipped_swiglu(x, group_index=gi, **kw),
        {"x": x}, ["x"], seed)
