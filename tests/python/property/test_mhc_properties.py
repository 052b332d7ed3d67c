"""Property-based tests (hypothesis) of the mHC family: sinkhorn (every variant, n up to 16,
iteration counts), hc_split_sinkhorn (hc_mult, iterations, variants), mhc_pre_bmm and mhc_post
(streams, channels around the vector widths, leading dims): outputs and every gradient against the
float64 reference under the precision policy."""

from __future__ import annotations

from dataclasses import dataclass

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

SINKHORN = composite_of("test_sinkhorn", "base_composite")
# hc_split_sinkhorn's parameter gradients are sums over rows: its family test holds them to the
# policy with the floor on the reduction's magnitude; the property test reuses that check.
SPLIT_CHECK = composite_of("test_hc_split_sinkhorn", "run_and_check")
PRE = composite_of("test_mhc_pre_bmm")
POST = composite_of("test_mhc_post")
VARIANTS = st.sampled_from(["mindspeed", "deepseek", "log"])


@SETTINGS
@given(batch=dim(70, 0), n=st.integers(1, 16), iters=st.sampled_from([1, 3, 20]), variant=VARIANTS,
       dtype=DTYPES, spread=st.sampled_from([1.0, 6.0]), seed=st.integers(0, 2**20))
def test_sinkhorn(device, batch, n, iters, variant, dtype, spread, seed):
    logits = normal((batch, n, n), dtype, device, seed, spread)
    check_against_reference(
        f"sinkhorn [{batch},{n},{n}] iters {iters} {variant} {dtype} spread {spread} seed {seed}",
        lambda L: fusedops.sinkhorn(L, iters, 1e-6, variant),
        lambda L: SINKHORN(L, iters, 1e-6, variant),
        lambda L: fusedops.reference.sinkhorn(L, iters, 1e-6, variant),
        {"L": logits}, ["L"], seed)


@dataclass
class _Case:  # what the family's run_and_check reads of a backend_case
    device: str
    backend: str
    dtype: torch.dtype
    id: str = "property"


@SETTINGS
@given(lead=st.sampled_from([(0,), (1,), (63,), (65,), (2, 5)]), n=st.integers(1, 8),
       iters=st.sampled_from([1, 5, 20]), variant=VARIANTS, dtype=DTYPES,
       layout=st.sampled_from(["dense", "rows"]), use=st.tuples(st.booleans(), st.booleans(), st.booleans()),
       seed=st.integers(0, 2**20))
def test_hc_split_sinkhorn(device, runnable_backends, lead, n, iters, variant, dtype, layout, use, seed):
    mixes = strided(normal(lead + ((2 + n) * n,), dtype, device, seed), layout)
    case = _Case(device, runnable_backends("hc_split_sinkhorn", device)[0], dtype)
    SPLIT_CHECK(case, lead, n, iters, variant, seed, normal, use=use if any(use) else (True,) * 3,
                mixes=mixes)


@SETTINGS
@given(lead=st.sampled_from([(), (2,)]), T=dim(40, 0), n=st.integers(1, 8), C=dim(300), dtype=DTYPES,
       seed=st.integers(0, 2**20))
def test_mhc_pre_bmm(device, lead, T, n, C, dtype, seed):
    x = normal(lead + (T, n, C), dtype, device, seed)
    h = normal(lead + (T, n), torch.float32, device, seed + 1)
    check_against_reference(
        f"mhc_pre_bmm {lead + (T, n, C)} {dtype} seed {seed}",
        lambda h, x: fusedops.mhc_pre_bmm(h, x, x.dtype), lambda h, x: PRE(h, x, x.dtype),
        lambda h, x: fusedops.reference.mhc_pre_bmm(h, x),
        {"h": h, "x": x}, ["h", "x"], seed)


@SETTINGS
@given(lead=st.sampled_from([(), (2,)]), T=dim(40, 0), n=st.integers(1, 8), C=dim(300), dtype=DTYPES,
       seed=st.integers(0, 2**20))
def test_mhc_post(device, lead, T, n, C, dtype, seed):
    x = normal(lead + (T, n, C), dtype, device, seed)
    hr = normal(lead + (T, n, n), torch.float32, device, seed + 1)
    ho = normal(lead + (T, C), dtype, device, seed + 2)
    hp = normal(lead + (T, n), torch.float32, device, seed + 3)
    check_against_reference(
        f"mhc_post {lead + (T, n, C)} {dtype} seed {seed}",
        fusedops.mhc_post, POST, fusedops.reference.mhc_post,
        {"x": x, "h_res": hr, "h_out": ho, "h_post": hp}, ["x", "h_res", "h_out", "h_post"], seed)
